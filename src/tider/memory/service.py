"""The HTTP memory service (FastAPI on uvicorn): ``tider memory serve --store URL_OR_DIR``.

```
GET  /health                       {"status": "ok"} (200) | {"status": "unavailable"} (503); no key needed
GET  /memories                     {"memories": [...]}
POST /memories/{name}/messages     {"messages": [...]}                 -> {"ids": [...]}
POST /memories/{name}/search       {"text", "asked_at", "user", "k", "windows"}
                                   -> {"hits": [{"id", "text", "timestamp", "speaker", "score"}],
                                       "prediction": {"temporal", "windows": [{"start", "end"}]}}
GET  /openapi.json, /docs          the schema, generated from the models below
```

The store is a directory (one embedded store per memory, ``DIR/<name>``, created by its
first add; one process at a time) or a PostgreSQL URL (every memory in that database;
any number of service processes on it, behind a load balancer: an add through one is
found through all). When ``TIDER_API_KEY`` is set, every request needs ``Authorization:
Bearer <key>`` (else 401), except ``/health``, which a load balancer probes without one
and which says only whether the store is reachable, and the schema and docs pages.
Bad input is a 422 that names the field (pydantic's ``loc``, or the memory's own
``MemoryInputError``), an unknown memory a 404, a body over ``max_body_bytes`` a 413, a
database that does not answer within its bound a 503 saying so; none is a 500. Adds to one
memory are serialized (``TemporalMemory``'s write lock, or the database's row lock);
searches run concurrently in the server's thread pool, on pooled connections.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import threading
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from tider.memory.backends import open_backend
from tider.memory.files import StoreError
from tider.memory.pg.config import DatabaseUnavailable
from tider.memory.records import MemoryInputError
from tider.memory.temporal_memory import TemporalMemory

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_BODY_BYTES = 8 * 2**20
MAX_MESSAGES = 10_000
# The request's bearer token, if any (checked by the app's authorizer, so no automatic 403).
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=100_000)
    timestamp: str = Field(min_length=1, max_length=64, description="ISO 8601; timezone-aware times become UTC")
    speaker: str | None = Field(None, max_length=256)
    session: str | None = Field(None, max_length=256)
    key: str | None = Field(None, min_length=1, max_length=256, description="generated from the content if absent")
    channel: str | None = Field(None, max_length=256)
    topic: str | None = Field(None, max_length=256)
    phase: str | None = Field(None, max_length=256)
    role: str | None = Field(None, max_length=256)
    stage: int | None = Field(None, ge=-(2**31), le=2**31 - 1)


class AddRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)


class AddResponse(BaseModel):
    ids: list[str]


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=10_000)
    asked_at: str | None = Field(None, max_length=64, description="ISO 8601; nothing after it is returned")
    user: str | None = Field(None, max_length=256)
    k: int = Field(20, ge=1, le=1000)
    windows: str = Field(
        "none", max_length=64, description="a window source: none, rules, dbscan-tuned, timeline, locator"
    )


class Hit(BaseModel):
    id: str
    text: str
    timestamp: str
    speaker: str
    score: float


class WindowOut(BaseModel):
    start: str
    end: str


class PredictionOut(BaseModel):
    temporal: bool
    windows: list[WindowOut]


class SearchResponse(BaseModel):
    hits: list[Hit]
    prediction: PredictionOut


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, before the app reads them."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await JSONResponse({"detail": f"request body over {self.limit} bytes"}, 413)(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, f"request body over {self.limit} bytes")
            return message

        await self.app(scope, limited, send)


def _input_error(err: MemoryInputError) -> HTTPException:
    return HTTPException(
        422,
        [{"loc": ["body", *re.split(r"[.\[\]]+", err.field.strip("]"))], "msg": err.problem, "type": "value_error"}],
    )


def create_app(
    store: str | os.PathLike,
    *,
    config=None,
    embedder=None,
    locator: dict | None = None,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    postgres=None,
) -> FastAPI:
    """The service over the memories in ``store`` (a directory, or a PostgreSQL URL);
    ``api_key`` defaults to ``$TIDER_API_KEY``."""
    backend = open_backend(store, postgres)
    key = api_key if api_key is not None else os.environ.get("TIDER_API_KEY") or None
    memories: dict[str, TemporalMemory] = {}
    opening = threading.Lock()

    def memory(name: str, create: bool) -> TemporalMemory:
        with opening:
            if name not in memories:
                if not create and not backend.exists(name):
                    raise HTTPException(404, f"no memory {name!r}")
                memories[name] = backend.open(name, config=config, embedder=embedder, locator=locator)
            return memories[name]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        for mem in memories.values():  # persist the derived indexes, release the store locks and connections
            mem.close()
        backend.close()

    app = FastAPI(title="tider memory", version="1", description=__doc__.split("\n\n")[0], lifespan=lifespan)
    app.state.memories = memories
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_exception_handler(DatabaseUnavailable, _unavailable)

    @app.get("/health")
    def health() -> JSONResponse:
        """Up or down, nothing else: unauthenticated, for load balancers' probes."""
        up = backend.reachable()
        return JSONResponse({"status": "ok" if up else "unavailable"}, 200 if up else 503)

    router = APIRouter(dependencies=[Depends(_authorizer(key))])
    _add_routes(router, backend, memory)
    app.include_router(router)
    return app


async def _unavailable(request: Request, err: DatabaseUnavailable) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, 503)


def _authorizer(key: str | None):
    """The dependency every request passes: the bearer token must be ``key`` (when set)."""

    def authorized(creds: Credentials) -> None:
        if key is not None and (creds is None or not hmac.compare_digest(creds.credentials.encode(), key.encode())):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    return authorized


def _add_routes(app: APIRouter, backend, memory) -> None:
    """The authenticated endpoints; ``memory(name, create)`` opens (or creates) a memory."""
    name_param = PathParam(pattern=NAME, description="memory name (letters, digits, . _ -)")

    @app.get("/memories")
    def names() -> dict:
        return {"memories": backend.names()}

    @app.post("/memories/{name}/messages", response_model=AddResponse)
    def add(body: AddRequest, name: str = name_param) -> AddResponse:
        try:
            return AddResponse(
                ids=memory(name, create=True).add([m.model_dump(exclude_none=True) for m in body.messages])
            )
        except MemoryInputError as err:
            raise _input_error(err) from None
        except DatabaseUnavailable:
            raise
        except StoreError as err:
            raise HTTPException(409, str(err)) from None

    @app.post("/memories/{name}/search", response_model=SearchResponse)
    def search(body: SearchRequest, name: str = name_param) -> SearchResponse:
        mem = memory(name, create=False)
        try:
            hits = mem.search(body.text, asked_at=body.asked_at, user=body.user, k=body.k, windows=body.windows)
        except MemoryInputError as err:
            raise _input_error(err) from None
        g = mem.granularity
        prediction = hits.prediction.to_json(g) if hits.prediction.temporal else {"temporal": False, "windows": []}
        return SearchResponse(
            hits=[
                Hit(id=m.key, text=m.text, timestamp=m.timestamp.isoformat(), speaker=m.speaker, score=s)
                for m, s in zip(hits.messages, hits.scores)
            ],
            prediction=PredictionOut(**prediction),
        )


def serve(store: str, host: str = "127.0.0.1", port: int = 8100, locator: dict | None = None, config=None) -> None:
    import uvicorn

    uvicorn.run(create_app(store, config=config, locator=locator), host=host, port=port, log_level="warning")

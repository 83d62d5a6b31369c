"""The HTTP memory service (FastAPI on uvicorn): ``tider memory serve --store URL_OR_DIR``.

```
GET  /health                       {"status": "ok"} (200) | {"status": "unavailable"} (503); no key needed
GET  /memories                     {"memories": [...]}
POST /memories/{name}/messages     {"messages": [...]}                 -> {"keys": [...]}
POST /memories/{name}/search       {"text", "asked_at", "user", "k", "windows"}
                                   -> {"hits": [{"key", "text", "timestamp", "speaker", "score"}],
                                       "prediction": {"temporal", "windows": [{"start", "end"}]},
                                       "window_source": "rules" | "none (locator failed: ...)"}
GET  /openapi.json, /docs          the schema, generated from the models below
```
and the record-management routes of ``tider.memory.service.manage`` (get, list, update,
delete, by key, by time range, all of a memory).

The store is a directory (one embedded store per memory, ``DIR/<name>``, created by its
first add; one process at a time) or a PostgreSQL URL (every memory in that database;
any number of service processes on it, behind a load balancer: an add through one is
found through all). With keys configured (``tider.memory.service.keys``: ``TIDER_API_KEY``, one
key for every memory, and ``TIDER_API_KEYS``, a file binding keys to memory-name patterns
for reading and for writing), every request needs ``Authorization: Bearer <key>`` (else
401) and stays inside its key's memories (else 403; ``GET /memories`` lists those it may
read), except ``/health``, which a load balancer probes without one and which says only
whether the store is reachable, and the schema and docs pages.
Bad input is a 422 that names the field (pydantic's ``loc``, or the memory's own
``MemoryInputError``), an unknown memory a 404, a body over ``max_body_bytes`` a 413. A
store that cannot serve (``StoreError``: a database that does not answer within its bound,
its pool exhausted, a directory store open in another process) is a 503 saying so; a
database down when the service starts is opened at the first request it answers (503s and
an unhealthy ``/health`` until then). A window source that fails (``windows="locator"``
with the served model unreachable, erroring or writing what does not parse) does not fail
the search, nor vanish: the search runs without windows, the response's
``window_source`` says ``"none (locator failed: <reason>)"`` and a warning is logged
(without the question). None of these is a 500. Adds to one memory are serialized (the
memory's write lock, or the database's row lock); searches run concurrently in the
server's thread pool, on pooled connections.

Questions are not written to disk: the time expressions of a search are resolved in a
bounded in-process memo (``tider.locator.rules.resolver_for``); ``TIDER_CUE_CACHE=FILE``
opts in to a persistent cache there (hashed keys, no question text).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from tider.memory.backends import open_backend
from tider.memory.files import StoreError
from tider.memory.pg.config import DatabaseUnavailable
from tider.memory.records import MemoryInputError
from tider.memory.service.keys import NAME_HELP, NAME_MAX, NAME_SHAPE, KeyRing, register_name_convertor
from tider.memory.service.manage import add_management_routes
from tider.memory.service.open_memories import DEFAULT_LIMIT, OpenMemories
from tider.memory.service.search import add_search_routes

if TYPE_CHECKING:
    from tider.memory.base import MemoryBase

logger = logging.getLogger(__name__)
register_name_convertor()  # the routes' {name:memory}: names with "/" in them

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
    metadata: dict[str, str | int | float | bool] | None = Field(
        None, max_length=32, description="your own fields, up to 32: strings, numbers, booleans; filterable"
    )


class AddRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)


class AddResponse(BaseModel):
    keys: list[str] = Field(description="the messages' keys, in the order given (re-adding a key changes nothing)")


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


def _loc(field: str) -> list:
    """``messages[0].text`` -> ``["messages", 0, "text"]``, as FastAPI's own 422s spell it."""
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", field.strip("]"))]


def _input_error(err: MemoryInputError) -> HTTPException:
    return HTTPException(
        422,
        [{"loc": ["body", *_loc(err.field)], "msg": err.problem, "type": "value_error"}],
    )


class LazyBackend:
    """The backend of ``store``; a database that does not answer at start is opened by
    the first request after it does (until then each request is a 503 saying why)."""

    def __init__(self, store: str | os.PathLike, postgres=None):
        self.store, self.postgres = store, postgres
        self._backend = None
        self._lock = threading.Lock()
        try:
            self.get()
        except DatabaseUnavailable as err:
            logger.warning("%s; the service answers 503 until it is", err)

    def get(self):
        with self._lock:
            if self._backend is None:
                self._backend = open_backend(self.store, self.postgres)
            return self._backend

    def reachable(self) -> bool:
        try:
            return self.get().reachable()
        except DatabaseUnavailable:
            return False

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def create_app(
    store: str | os.PathLike,
    *,
    config=None,
    embedder=None,
    locator: dict | None = None,
    api_key: str | None = None,
    keys_file: str | os.PathLike | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    postgres=None,
    max_open: int | None = None,
) -> FastAPI:
    """The service over the memories in ``store`` (a directory, or a PostgreSQL URL);
    ``api_key`` and ``keys_file`` default to ``$TIDER_API_KEY`` and ``$TIDER_API_KEYS``;
    ``max_open`` (default ``$TIDER_MAX_OPEN_MEMORIES``, else 256) bounds the memories held open."""
    keys = KeyRing.from_env(api_key, keys_file)  # first: a bad key file stops the start
    backend = LazyBackend(store, postgres)

    def open_memory(name: str, create: bool) -> MemoryBase:
        opened = backend.get()
        if not create and not opened.exists(name):
            raise HTTPException(404, f"no memory {name!r}")
        return opened.open(name, config=config, embedder=embedder, locator=locator)

    limit = max_open or int(os.environ.get("TIDER_MAX_OPEN_MEMORIES", DEFAULT_LIMIT))
    memories = OpenMemories(open_memory, limit)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        memories.close()  # persist the derived indexes, release the store locks and connections
        backend.close()

    app = FastAPI(title="tider memory", version="1", description=__doc__.split("\n\n")[0], lifespan=lifespan)
    app.state.memories = memories  # the open memories (tests read which are open)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_exception_handler(StoreError, _unavailable)  # DatabaseUnavailable is one
    app.add_exception_handler(RequestValidationError, _invalid)

    @app.get("/health")
    def health() -> JSONResponse:
        """Up or down, nothing else: unauthenticated, for load balancers' probes."""
        up = backend.reachable()
        return JSONResponse({"status": "ok" if up else "unavailable"}, 200 if up else 503)

    router = APIRouter(dependencies=[Depends(_authenticator(keys))])
    _add_routes(router, backend, memories.lease)
    app.include_router(router)
    _check_declared(app)
    return app


async def _invalid(request: Request, err: RequestValidationError) -> Response:
    """FastAPI's 422, rendered ASCII-escaped: an input holding a lone surrogate (a JSON
    ``\\ud800`` escape) echoed in the error would otherwise fail to encode, a 500."""
    body = json.dumps({"detail": jsonable_encoder(err.errors())}, ensure_ascii=True)
    return Response(body, 422, media_type="application/json")


async def _unavailable(request: Request, err: StoreError) -> JSONResponse:
    """The store cannot serve the request now (``StoreError``, ``DatabaseUnavailable``): 503."""
    logger.warning("%s %s: 503: %s", request.method, request.url.path, err)
    return JSONResponse({"detail": str(err)}, 503, headers={"Retry-After": "1"})


def _authenticator(keys: KeyRing):
    """The dependency every request passes: a known bearer key (when keys are configured).
    What the key may do with a memory is each route's own declaration (``_access``)."""

    def authenticated(request: Request, creds: Credentials) -> None:
        grant = keys.grant(creds.credentials if creds else None)
        if grant is None:
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        request.state.grant = grant

    return authenticated


def _access(mode: str):
    """The ``{name}`` path parameter of a route that reads (``mode="read"``) or writes the
    memory: a route gets the name only through this, so it cannot forget to declare which
    (decided by the route, never by the method or by how the path ends)."""

    def granted(
        request: Request, name: str = PathParam(pattern=NAME_SHAPE, max_length=NAME_MAX, description=NAME_HELP)
    ) -> str:
        if not request.state.grant.allows(name, mode):
            raise HTTPException(403, f"this key may not {mode} memory {name!r}")
        return name

    granted.access = mode
    return Depends(granted)


READS, WRITES = _access("read"), _access("write")


def _check_declared(app: FastAPI) -> None:
    """Every route over a memory declares read or write access (a start-up check)."""
    for route in app.routes:
        if "{name:memory}" in getattr(route, "path", ""):
            modes = [getattr(d.call, "access", None) for d in route.dependant.dependencies]
            if not any(modes):
                raise RuntimeError(f"route {route.path} {sorted(route.methods)} declares no access (READS/WRITES)")


def _add_routes(app: APIRouter, backend, memory) -> None:
    """The authenticated endpoints; ``memory(name, create)`` leases an open memory (opening or
    creating it) for a ``with`` block."""

    @app.get("/memories")
    def names(request: Request) -> dict:
        return {"memories": [n for n in backend.get().names() if request.state.grant.allows(n, "read")]}

    @app.post("/memories/{name:memory}/messages", response_model=AddResponse)
    def add(body: AddRequest, name: str = WRITES) -> AddResponse:
        try:
            return AddResponse(keys=_added(memory, name, [m.model_dump(exclude_none=True) for m in body.messages]))
        except MemoryInputError as err:
            raise _input_error(err) from None

    add_search_routes(app, backend, memory, READS, _input_error)
    add_management_routes(app, memory, READS, WRITES, _input_error)


def _added(memory, name: str, records: list[dict]) -> list[str]:
    with memory(name, create=True) as mem:
        return mem.add(records)


def serve(store: str, host: str = "127.0.0.1", port: int = 8100, locator: dict | None = None, config=None) -> None:
    import uvicorn

    uvicorn.run(create_app(store, config=config, locator=locator), host=host, port=port, log_level="warning")

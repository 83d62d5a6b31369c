"""The service's record-management routes (what a mem0 or Zep user calls), over
``MemoryBase``'s ``get`` / ``get_all`` / ``update`` / ``delete`` / ``delete_all``:

```
GET    /memories/{name}/messages?start&end&offset&limit&session&speaker&metadata={JSON}
                                                          {"messages": [...], "next_offset": int | null}
GET    /memories/{name}/messages/{key}                   a message (ETag: its version), or 404
PATCH  /memories/{name}/messages/{key}  {"text"?, "timestamp"?}  -> the message as stored
       If-Match: "VERSION" makes it conditional: a message changed since is a 409
DELETE /memories/{name}/messages/{key}                   {"deleted": [key]}, or 404
POST   /memories/{name}/delete          {"keys": [...]} or {"start"?, "end"?, "filters"?}  -> {"deleted": [...]}
DELETE /memories/{name}                                  every message of the memory: {"deleted": [...]}
```

Times are ISO 8601 (timezone-aware ones become UTC); a range is inclusive at both ends.
A message's ``version`` (``tider.memory.records.version_of``, a hash of what is stored) is
its ETag: a client that read version V and sends ``If-Match: "V"`` with its change never
overwrites a change it did not see (409, with the current version); without ``If-Match``
the change applies to whatever is stored then (the last writer wins, field by field).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Header, HTTPException, Query, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tider.memory.base import MAX_PAGE
from tider.memory.records import MemoryInputError, MessageNotFound, VersionConflict, version_of
from tider.memory.service.search import Filters
from tider.types import Message

SESSIONS = Query(None, max_length=100, description="any of these sessions")
SPEAKERS = Query(None, max_length=100, description="any of these speakers")
KEY = PathParam(min_length=1, max_length=256, description="the message's key")


class MessageOut(BaseModel):
    key: str = Field(description="the message's key, as it was added")
    text: str
    timestamp: str
    speaker: str
    session: str
    channel: str | None = None
    topic: str | None = None
    phase: str | None = None
    role: str | None = None
    stage: int | None = None
    metadata: dict[str, str | int | float | bool] = Field(default_factory=dict)
    version: str = Field(description="changes with any change of the message; its ETag")

    @classmethod
    def of(cls, m: Message) -> MessageOut:
        return cls(
            key=m.key,
            version=version_of(m),
            text=m.text,
            timestamp=m.timestamp.isoformat(),
            speaker=m.speaker,
            session=m.session,
            metadata=dict(m.metadata),
            **{f: getattr(m, f) for f in ("channel", "topic", "phase", "role", "stage")},
        )


class ListResponse(BaseModel):
    messages: list[MessageOut]
    next_offset: int | None = Field(description="the next page's offset; null on the last page")


class UpdateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, max_length=100_000)
    timestamp: str | None = Field(None, min_length=1, max_length=64)
    metadata: dict[str, str | int | float | bool] | None = Field(None, max_length=32, description="replaces it")

    @model_validator(mode="after")
    def _something(self):
        if self.text is None and self.timestamp is None and self.metadata is None:
            raise ValueError("give a text, a timestamp, metadata or any of them")
        return self


class DeleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[str] | None = Field(None, min_length=1, max_length=10_000)
    start: str | None = Field(None, min_length=1, max_length=64)
    end: str | None = Field(None, min_length=1, max_length=64)
    filters: Filters | None = None

    @model_validator(mode="after")
    def _one_filter(self):
        chosen = self.start is not None or self.end is not None or self.filters is not None
        if (self.keys is None) == (not chosen):
            raise ValueError(
                "give either keys or a time range (start and/or end) and/or filters; DELETE /memories/{name} empties it"
            )
        return self


class DeleteResponse(BaseModel):
    deleted: list[str]


IF_MATCH = Header(None, max_length=200, description='the version read, as its ETag ("...")')


def wanted_version(if_match: str) -> str | None:
    """The version an ``If-Match`` header names (a strong ETag; ``*``: any version)."""
    value = if_match.strip()
    if value == "*":
        return None
    if len(value) < 2 or value[0] != '"' or value[-1] != '"' or '"' in value[1:-1]:
        raise HTTPException(422, f'If-Match: expected one quoted version (an ETag, e.g. "1a2b") or *, got {value!r}')
    return value[1:-1]


def tagged(response: Response, out: MessageOut) -> MessageOut:
    response.headers["ETag"] = f'"{out.version}"'
    return out


def listing_filters(session, speaker, metadata: str | None) -> dict | None:
    """A listing's query parameters as ``tider.memory.filters`` filters (None: none given)."""
    out: dict = {}
    if session:
        out["session"] = session
    if speaker:
        out["speaker"] = speaker
    if metadata is not None:
        try:
            out["metadata"] = json.loads(metadata)
        except ValueError:
            raise HTTPException(422, f"metadata: not JSON: {metadata[:100]!r}") from None
    return out or None


def _missing(name: str, key: str):
    raise MessageNotFound(name, key)


def answered(call, input_error):
    """``call()``, its typed failures as HTTP answers: 422, 404, 409 (with the current ETag)."""
    try:
        return call()
    except MemoryInputError as err:
        raise input_error(err) from None
    except MessageNotFound as err:
        raise HTTPException(404, str(err).strip('"')) from None
    except VersionConflict as err:
        raise HTTPException(409, str(err), headers={"ETag": f'"{err.current}"'}) from None


def add_management_routes(app: APIRouter, memory, reads, writes, input_error) -> None:
    """``memory(name, create=False)`` leases an open memory (404: none); ``reads`` / ``writes``
    declare a route's access; ``input_error`` makes a ``MemoryInputError`` the service's 422."""

    def run(call):
        return answered(call, input_error)

    @app.get("/memories/{name:memory}/messages", response_model=ListResponse)
    def list_messages(
        name: str = reads,
        start: str | None = Query(None, max_length=64),
        end: str | None = Query(None, max_length=64),
        offset: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        session: list[str] | None = SESSIONS,
        speaker: list[str] | None = SPEAKERS,
        metadata: str | None = Query(None, max_length=4096, description='JSON: {"field": value, ...}'),
    ) -> ListResponse:
        filters = listing_filters(session, speaker, metadata)
        with memory(name, create=False) as mem:
            page = run(lambda: mem.get_all(start, end, offset, limit, filters))
            more = bool(page) and bool(mem.get_all(start, end, offset + limit, 1, filters))
        return ListResponse(messages=[MessageOut.of(m) for m in page], next_offset=offset + limit if more else None)

    @app.get("/memories/{name:memory}/messages/{key:path}", response_model=MessageOut)
    def get_message(response: Response, name: str = reads, key: str = KEY) -> MessageOut:
        with memory(name, create=False) as mem:
            found = mem.get(key)
        return tagged(response, MessageOut.of(run(lambda: found or _missing(name, key))))

    @app.patch("/memories/{name:memory}/messages/{key:path}", response_model=MessageOut)
    def update_message(
        body: UpdateRequest, response: Response, name: str = writes, key: str = KEY, if_match: str | None = IF_MATCH
    ) -> MessageOut:
        version = None if if_match is None else wanted_version(if_match)
        with memory(name, create=False) as mem:
            stored = run(lambda: mem.update(key, **body.model_dump(), if_version=version))
        return tagged(response, MessageOut.of(stored))

    @app.delete("/memories/{name:memory}/messages/{key:path}", response_model=DeleteResponse)
    def delete_message(name: str = writes, key: str = KEY) -> DeleteResponse:
        with memory(name, create=False) as mem:
            deleted = mem.delete(key)
        if not deleted:
            raise HTTPException(404, f"memory {name!r} holds no message {key!r}")
        return DeleteResponse(deleted=deleted)

    @app.post("/memories/{name:memory}/delete", response_model=DeleteResponse)
    def delete_where(body: DeleteRequest, name: str = writes) -> DeleteResponse:
        with memory(name, create=False) as mem:
            if body.keys is not None:
                return DeleteResponse(deleted=run(lambda: mem.delete(body.keys)))
            filters = body.filters and body.filters.as_dict()
            return DeleteResponse(deleted=run(lambda: mem.delete_all(body.start, body.end, filters)))

    @app.delete("/memories/{name:memory}", response_model=DeleteResponse)
    def delete_memory(name: str = writes) -> DeleteResponse:
        with memory(name, create=False) as mem:
            return DeleteResponse(deleted=mem.delete_all())

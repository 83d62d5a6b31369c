"""The service's search routes: one memory (``POST /memories/{name}/search``) and several in
one ranking (``POST /search``), and how a search reports the window source it ran."""

from __future__ import annotations

import copy
import fnmatch
import logging
import re

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from tider.memory.files import StoreError
from tider.memory.records import MemoryInputError
from tider.memory.service.keys import NAME
from tider.types import NON_TEMPORAL, WindowPrediction

logger = logging.getLogger(__name__)
RRF_K = 60  # the fusion constant of the retriever's own fusions (RetrievalConfig.rrf_k)


class Filters(BaseModel):
    """Only the messages these keep (``tider.memory.filters``): every named part must hold."""

    model_config = ConfigDict(extra="forbid")
    session: str | list[str] | None = Field(None, description="a session, or any of several")
    speaker: str | list[str] | None = Field(None, description="a speaker, or any of several")
    metadata: dict[str, str | int | float | bool] | None = Field(None, max_length=32, description="fields, equal")

    def as_dict(self) -> dict:
        return self.model_dump(exclude_none=True)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=10_000)
    asked_at: str | None = Field(None, max_length=64, description="ISO 8601; nothing after it is returned")
    user: str | None = Field(None, max_length=256)
    k: int = Field(20, ge=1, le=1000)
    windows: str = Field(
        "none", max_length=64, description="a window source: none, rules, dbscan-tuned, timeline, locator"
    )
    filters: Filters | None = None


class Hit(BaseModel):
    key: str = Field(description="the message's key, as it was added")
    text: str
    timestamp: str
    speaker: str
    score: float


class PooledHit(Hit):
    memory: str = Field(description="the memory it came from")


class ManySearchRequest(SearchRequest):
    memories: list[str] = Field(
        min_length=1,
        max_length=100,
        description='memory names or patterns ("alice.*"): a pattern reaches the memories it matches that the '
        "key may read, a name the key may not read is a 403",
    )


class ManySearchResponse(BaseModel):
    hits: list[PooledHit]
    memories: list[str] = Field(description="the memories searched")
    window_source: dict[str, str] = Field(description="per memory, as in one memory's search")


class WindowOut(BaseModel):
    start: str
    end: str


class PredictionOut(BaseModel):
    temporal: bool
    windows: list[WindowOut]


class SearchResponse(BaseModel):
    hits: list[Hit]
    prediction: PredictionOut
    window_source: str = Field(
        description='the source that made the windows ("none": none asked for); a source that failed: '
        '"none (<source> failed: <reason>)", the search then ran without windows'
    )


class ReportedWindows:
    """One search's window source ``name``, run so that its failure shows. A source that
    cannot be built or cannot answer (anything but bad input, ``MemoryInputError``, or the
    store failing, ``StoreError``) gives no windows, and ``label`` says why; a model-backed
    source (``ChatWindowSource``: ``locator``, ``prompted``) that answered nothing usable
    (``request_failed``, an unparsable completion) likewise, where the source itself falls
    back silently. A model-backed source runs as this request's shallow copy, so the
    outcome read back is this request's, and resolves the question's time expressions
    in memory (``resolver_for``), not in the on-disk cache of the dataset paths."""

    def __init__(self, name: str, memory_name: str):
        self.name, self.memory_name, self.label = name, memory_name, name

    def predict(self, query, store) -> WindowPrediction:
        from tider.locator.rules import resolver_for, shared_resolver

        try:
            source = store.source(self.name)
            if hasattr(source, "last_outcomes"):
                source = copy.copy(source)
                if getattr(source, "resolver", None) is shared_resolver():  # the default: not for a memory
                    source.resolver = resolver_for(store)
            prediction = source.predict(query, store)
        except (MemoryInputError, StoreError):
            raise
        except Exception as err:  # the served model down, a library error, a bad export
            logger.debug("memory %r: window source %r raised", self.memory_name, self.name, exc_info=True)
            return self._failed(f"{type(err).__name__}: {err}")
        outcomes = getattr(source, "last_outcomes", None) or ()
        failed = next((o for o in outcomes if o.failure), None)
        if failed is not None:
            detail = failed.detail or ""
            return self._failed(detail if detail.startswith(failed.failure) else f"{failed.failure}: {detail}")
        return prediction

    def _failed(self, reason: str) -> WindowPrediction:
        reason = " ".join(reason.split())[:300].rstrip(": ") or "no reason given"
        self.label = f"none ({self.name} failed: {reason})"
        logger.warning(
            "memory %r: window source %r failed, searched without windows: %s", self.memory_name, self.name, reason
        )
        return NON_TEMPORAL


def add_search_routes(app: APIRouter, backend, memory, reads, input_error) -> None:
    """The search routes; ``memory(name, create)`` leases an open memory, ``reads`` is the
    name parameter of a route that reads one, ``input_error`` makes the service's 422."""

    @app.post("/memories/{name:memory}/search", response_model=SearchResponse)
    def search(body: SearchRequest, name: str = reads) -> SearchResponse:
        with memory(name, create=False) as mem:
            return _search(mem, body, name, input_error)

    @app.post("/search", response_model=ManySearchResponse)
    def search_many(request: Request, body: ManySearchRequest) -> ManySearchResponse:
        """One ranking over several memories; the read access is checked per memory here."""
        names = _readable(request.state.grant, body.memories, backend.get().names())
        answers, cosines = {}, {}
        for name in names:
            with memory(name, create=False) as mem:
                answers[name] = _search(mem, body, name, input_error, cosines)
        return _merged(answers, cosines, body.k)


def _readable(grant, asked: list[str], existing: list[str]) -> list[str]:
    """The memories a multi-memory search reads, in the order asked: a pattern's matches among
    ``existing`` that ``grant`` may read; a plain name must be readable (403) and exist (404)."""
    out: list[str] = []
    for item in asked:
        if any(c in item for c in "*?["):
            found = [n for n in sorted(existing) if fnmatch.fnmatchcase(n, item) and grant.allows(n, "read")]
        else:
            if not re.match(NAME, item):
                raise HTTPException(422, f"memories: {item!r} is neither a memory name nor a pattern")
            if not grant.allows(item, "read"):
                raise HTTPException(403, f"this key may not read memory {item!r}")
            if item not in existing:
                raise HTTPException(404, f"no memory {item!r}")
            found = [item]
        out += [n for n in found if n not in out]
    return out


def _merged(answers: dict[str, SearchResponse], cosines: dict[str, list[float]], k: int) -> ManySearchResponse:
    """Each memory's hits in one ranking. A memory's scores are rank fusions, so the first
    hit of a memory that holds nothing relevant scores as high as the first of one that does;
    across memories the hits are ranked again by reciprocal-rank fusion of two lists, each
    memory's own order and the pool's order by the question's cosine to each hit, so the
    memories' rankings interleave by how well their hits match (ties: the memory asked first)."""
    pooled = [(name, rank, hit) for name, a in answers.items() for rank, hit in enumerate(a.hits, start=1)]
    cos = [cosines[name][rank - 1] for name, rank, _ in pooled]
    by_cos = sorted(range(len(pooled)), key=lambda i: -cos[i])
    cos_rank = {i: r for r, i in enumerate(by_cos, start=1)}
    order = list(answers)
    fused = [1 / (RRF_K + rank) + 1 / (RRF_K + cos_rank[i]) for i, (_, rank, _) in enumerate(pooled)]
    best = sorted(range(len(pooled)), key=lambda i: (-fused[i], order.index(pooled[i][0]), pooled[i][1]))[:k]
    return ManySearchResponse(
        hits=[
            PooledHit(**pooled[i][2].model_dump(), memory=pooled[i][0]).model_copy(update={"score": fused[i]})
            for i in best
        ],
        memories=order,
        window_source={name: a.window_source for name, a in answers.items()},
    )


def _search(mem, body: SearchRequest, name: str, input_error, cosines: dict | None = None) -> SearchResponse:
    """One memory's search; ``cosines`` (a multi-memory search) gets the question's cosine to
    each hit under the memory's name."""
    windows = body.windows if body.windows == "none" else ReportedWindows(body.windows, name)
    try:
        filters = body.filters.as_dict() if body.filters else None
        hits = mem.search(body.text, asked_at=body.asked_at, user=body.user, k=body.k, windows=windows, filters=filters)
    except MemoryInputError as err:
        raise input_error(err) from None
    if cosines is not None:
        vector = mem.embed_queries([body.text])[0]
        cosines[name] = [float(c) for c in mem.dense_scores_at(vector, hits.positions)] if hits.positions else []
    g = mem.granularity
    prediction = hits.prediction.to_json(g) if hits.prediction.temporal else {"temporal": False, "windows": []}
    return SearchResponse(
        hits=[
            Hit(key=m.key, text=m.text, timestamp=m.timestamp.isoformat(), speaker=m.speaker, score=s)
            for m, s in zip(hits.messages, hits.scores)
        ],
        prediction=PredictionOut(**prediction),
        window_source=body.windows if isinstance(windows, str) else windows.label,
    )

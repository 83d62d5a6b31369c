"""Window sources: everything that turns a query into a ``WindowPrediction``.

Interface (``WindowSource``): ``name``, ``predict(query, store)``, optionally
``predict_batch(queries, store)``; a source receives ``query.public()`` (no gold) at
inference and reads the memory it asks about through ``store``, a
``tider.memory.store.MemoryStore`` (the query's messages in time order, its timeline, the
semantic ranking of the query), so every backend serves every source.

Registry: ``@register_source("name")`` on a class or factory; ``make_source(name, **kw)``
builds one (unknown names fail with the list of known ones). Sources living in other
packages are imported lazily on first use: add one line to ``LAZY_SOURCES``
(name -> module that registers it), e.g. ``"locator": "tider.locator.trained"``, so
``tider --help`` and this module never import torch/vLLM.

Evaluation-only sources (``oracle``) carry ``evaluation_only = True``; anything that
builds training data or prompts must call ``ensure_not_evaluation_only(source)``.
The oracle reads gold only from the ``gold_by_key`` mapping given at construction,
never from the query it is asked about.

Built-in learning-free sources: ``none`` (semantic channel only), ``oracle`` (gold
windows), ``timeline`` (top-m timeline entries by similarity become the windows),
``top-day`` (the day of the semantic channel's top hit: retrieve, then localize, without
learning), ``top-days`` (the first three distinct days it hits), ``dbscan-paper`` /
``dbscan-tuned`` (T-Mem, in ``tider.locator.dbscan``), ``rules`` (the question's time
expressions, in ``tider.locator.rules``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol, runtime_checkable

from tider.data.gold import unit_window
from tider.registry import Registry
from tider.types import NON_TEMPORAL, Gold, Query, WindowPrediction


@runtime_checkable
class WindowSource(Protocol):
    name: str

    def predict(self, query: Query, store) -> WindowPrediction: ...


class BaseSource:
    """Convenience base: a ``predict_batch`` that loops, and the evaluation-only flag."""

    name = "base"
    evaluation_only = False

    def predict(self, query: Query, store) -> WindowPrediction:
        raise NotImplementedError

    def predict_batch(self, queries: Sequence[Query], store) -> list[WindowPrediction]:
        return [self.predict(q, store) for q in queries]


# name -> module that registers it when imported (kept lazy: these import torch or an HTTP client).
LAZY_SOURCES: dict[str, str] = {
    "dbscan-paper": "tider.locator.dbscan",
    "dbscan-tuned": "tider.locator.dbscan",
    "dbscan": "tider.locator.dbscan",
    "locator": "tider.locator.trained",
    "prompted": "tider.locator.chat_source",
    "rules": "tider.locator.rules",
}
SOURCES: Registry[Callable[..., WindowSource]] = Registry("window source", lazy=LAZY_SOURCES)
register_source = SOURCES.register  # class/factory decorator; a duplicate name is an error
known_sources = SOURCES.known


def make_source(name: str, **kwargs) -> WindowSource:
    """Build the registered source ``name`` with ``kwargs`` (strict: bad kwargs raise)."""
    return SOURCES.get(name)(**kwargs)


def make_source_from_context(name: str, context: Mapping[str, object], **kwargs) -> WindowSource:
    """Like ``make_source`` but also passes the entries of ``context`` (e.g. ``store``,
    ``gold_by_key``) that the factory's signature names, plus
    ``context["source_options"][name]`` (e.g. ``{"locator": {"url": URL}}``); used by the
    evaluation runners, which do not know what each source needs."""
    factory = SOURCES.get(name)
    params = inspect.signature(factory).parameters
    # Only parameters the factory names: a ``**kwargs`` factory (``dbscan``, ``locator``)
    # forwards its kwargs to a config or another builder, which would reject context
    # entries such as ``gold_by_key``.
    # Per-source options from the command line (``--locator-url`` -> {"locator": {"url": ...}})
    # travel in the context too, so every runner configures sources the same way.
    options = {**dict(context.get("source_options", {}).get(name, {})), **kwargs}
    extra = {k: v for k, v in context.items() if k in params and k not in options}
    return factory(**extra, **options)


def ensure_not_evaluation_only(source: object) -> None:
    """Raise if ``source`` must never feed training data or prompts (e.g. the oracle)."""
    if getattr(source, "evaluation_only", False):
        raise ValueError(
            f"window source {getattr(source, 'name', source)!r} is evaluation-only (it reads gold labels); "
            "it cannot be used to build training examples or prompts"
        )


@register_source("none")
class NoWindows(BaseSource):
    """Semantic channel only: every query is treated as non-temporal."""

    name = "none"

    def predict(self, query: Query, store) -> WindowPrediction:
        return NON_TEMPORAL


def gold_predictions(queries: Iterable[Query]) -> dict[str, WindowPrediction]:
    """``{query.key: gold WindowPrediction}`` from queries that still carry gold."""
    out = {}
    for q in queries:
        g: Gold = q.gold
        out[q.key] = WindowPrediction(temporal=bool(g.temporal and g.windows), windows=tuple(g.windows))
    return out


@register_source("oracle")
class OracleWindows(BaseSource):
    """Gold windows (the upper bound). Evaluation-only: gold comes from ``gold_by_key``."""

    name = "oracle"
    evaluation_only = True

    def __init__(self, gold_by_key: Mapping[str, WindowPrediction]):
        self.gold_by_key = dict(gold_by_key)

    def predict(self, query: Query, store) -> WindowPrediction:
        try:
            return self.gold_by_key[query.key]
        except KeyError:
            raise KeyError(f"oracle has no gold windows for query {query.key!r}") from None


@register_source("timeline")
class TimelineWindows(BaseSource):
    """Learning-free baseline on the locator's own input: the ``top_m`` timeline entries
    most similar to the query become the windows (each widened by ``pad_days``).
    ``top_m=10``: best of 1/3/5/10 on LoCoMo dev non-test conversations
    (``bench/sweep_dbscan.py``); recall rises with m towards the no-window figure."""

    name = "timeline"

    def __init__(self, top_m: int = 10, pad_days: float = 0.0):
        self.top_m = top_m
        self.pad_days = pad_days

    def predict(self, query: Query, store) -> WindowPrediction:
        timeline = store.timeline(query.memory_key)
        entries = timeline.visible(query.asked_at).top_k(query.text, self.top_m) if timeline is not None else []
        if not entries:
            return NON_TEMPORAL
        pad = timedelta(days=self.pad_days)
        windows = sorted({e.window.widen(pad) for e in entries})
        return WindowPrediction(temporal=True, windows=tuple(windows))


@register_source("top-day")
class TopDayWindow(BaseSource):
    """Retrieve, then localize, without learning: one window on the day of the semantic
    channel's top hit (``pad_days`` more on each side), so the rest of that day's messages
    compete for the top k; ``days`` > 1: one window on each of the first ``days`` distinct
    days the ranking hits (``top-days``: a wrong day costs little next to a right one, so
    covering the first few hit days pays where the top hit's day alone is a coin flip).
    No visible message -> the semantic path."""

    name = "top-day"

    def __init__(self, pad_days: float = 0.0, days: int = 1):
        if days < 1:
            raise ValueError(f"top-day: days must be at least 1, got {days}")
        self.pad = timedelta(days=pad_days)
        self.days = days

    def predict(self, query: Query, store) -> WindowPrediction:
        windows = self.hit_days(query, store)
        return WindowPrediction(temporal=True, windows=tuple(sorted(windows))) if windows else NON_TEMPORAL

    def hit_days(self, query: Query, store) -> list:
        """The first ``days`` distinct (padded) days the ranking hits, in the order it hits them."""
        messages = store.messages(query.memory_key)
        windows: list = []
        for i in store.ranking(query).ids:
            day = unit_window(messages[int(i)].timestamp, messages[int(i)].timestamp, "day").widen(self.pad)
            if day not in windows:
                windows.append(day)
            if len(windows) == self.days:
                break
        return windows


@register_source("top-days")
def top_days(pad_days: float = 0.0, days: int = 3) -> TopDayWindow:
    """``top-day`` on the first three distinct hit days."""
    source = TopDayWindow(pad_days=pad_days, days=days)
    source.name = "top-days"
    return source

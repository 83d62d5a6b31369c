"""``tider eval retrieval``: every window source through the same dual-channel retriever.

One stage per method (``retrieve-<method>``), records keyed by the query key, so a
killed run resumes where it stopped. A method is a registered window source name,
optionally with a semantic-mode override: ``none@bm25`` = no windows, BM25 channel.

Evaluated queries: those with resolvable gold evidence (at least one evidence reference
that matched a message; recall counts the matched ones), minus excluded categories (LoCoMo ``adversarial`` / ``5`` by
default; their defining property is that no evidence answers them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tider.eval.metrics import query_metrics
from tider.eval.report import build_report, write_report
from tider.eval.runner import Stage, StageRunner, file_hash
from tider.retrieval.config import SEMANTIC_MODES, RetrievalConfig
from tider.scoring import switch_correct, window_iou
from tider.types import Dataset, Query, window_bucket

DEFAULT_EXCLUDE = ("5", "adversarial")


@dataclass
class RetrievalEvalConfig:
    methods: Sequence[str] = ("none", "dbscan-paper", "dbscan-tuned", "timeline", "oracle")
    ks: Sequence[int] = (5, 10, 20, 50)
    exclude_categories: Sequence[str] = DEFAULT_EXCLUDE
    memory_keys: Sequence[str] | None = None  # restrict to these memories (splits, test slices)
    limit: int | None = None  # first N eligible queries (smoke runs)
    mcnemar_k: int = 20
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    # Options of model-backed sources, e.g. {"locator": {"url": ...}} (tider.commands.eval_options).
    source_options: dict = field(default_factory=dict)
    # Where the memories are searched: None = in this process; a PostgreSQL URL or a
    # directory = imported there (idempotent) and searched through it (MemoryCollection).
    store: str | None = None


def eligible_queries(
    dataset: Dataset, exclude: Sequence[str] = DEFAULT_EXCLUDE, memory_keys=None, limit: int | None = None
) -> list[Query]:
    keep = set(memory_keys) if memory_keys is not None else None
    out = [
        q
        for q in dataset.queries
        if q.gold.evidence_ids
        and str(q.category) not in set(map(str, exclude))
        and (keep is None or q.memory_key in keep)
    ]
    return out[:limit] if limit is not None else out


def parse_method(spec: str) -> tuple[str, str | None]:
    name, _, mode = spec.partition("@")
    if mode and mode not in SEMANTIC_MODES:
        raise ValueError(f"method {spec!r}: semantic mode {mode!r} unknown; choose from {SEMANTIC_MODES}")
    return name, mode or None


def query_record(query: Query, source, store, ks: Sequence[int], granularity: str, mode: str | None = None) -> dict:
    """Predict windows for ``query.public()``, retrieve, and score against the gold.

    The retriever runs once per cut-off k: with two channels merged and reranked, the
    top-20 is not a prefix of the top-50, and recall@k must be what a budget of k returns."""
    pred = source.predict(query.public(), store)
    gold = query.gold
    ranked = {k: store.retrieve(query, pred, k, mode=mode)[0].tolist() for k in sorted(set(ks))}
    deepest = ranked[max(ks)]
    record = {
        "category": str(query.category),
        "bucket": window_bucket(len(gold.windows)),
        "gold_temporal": bool(gold.temporal),
        "pred_temporal": bool(pred.temporal),
        "n_windows": len(pred.windows) if pred.temporal else 0,
        "prediction": pred.to_json(granularity),
        "iou": window_iou(pred.windows if pred.temporal else (), gold.windows, granularity),
        "switch": switch_correct(pred.temporal, gold.temporal),
        "ids": deepest,
    }
    outcomes = getattr(source, "last_outcomes", None)  # model-backed sources (locator, prompted)
    if outcomes:
        record["parse_failure"] = outcomes[-1].failure  # None, or why the completion was unusable
    record.update(query_metrics(deepest, gold.evidence_ids, []))  # n_gold, rr (MRR over the deepest list)
    for k, ids in ranked.items():
        record.update(
            {key: v for key, v in query_metrics(ids, gold.evidence_ids, [k]).items() if key.endswith(f"@{k}")}
        )
    return record


class AheadOfTime:
    """A served model-backed source asked for the next ``chunk`` queries at once, so the
    server sees concurrent requests and batches them; one query at a time it idles between
    them. ``predict`` then hands out one query's prediction and outcome, as the source
    would. Only for servers: a local model's batched generation pads, and padding may move
    a greedy answer."""

    def __init__(self, source, queries: Sequence[Query], chunk: int = 32):
        self.source, self.chunk = source, chunk
        self.order = [q.key for q in queries]
        self.at = {k: i for i, k in enumerate(self.order)}
        self.by_key = {q.key: q for q in queries}
        self.ready: dict = {}
        self.last_outcomes: list = []

    def predict(self, query: Query, store):
        if query.key not in self.ready:
            i = self.at[query.key]
            keys = [k for k in self.order[i : i + self.chunk] if k not in self.ready]
            preds = self.source.predict_batch([self.by_key[k].public() for k in keys], store, progress=False)
            self.ready.update(zip(keys, zip(preds, self.source.last_outcomes)))
        pred, outcome = self.ready.pop(query.key)
        self.last_outcomes = [outcome]
        return pred


def served(source) -> bool:
    client = getattr(source, "client", None)
    return client is not None and client.backend.describe().get("backend") == "openai"


def make_stage(method: str, store, context: dict, ks: Sequence[int], granularity: str, queries=()) -> Stage:
    from tider.locator.sources import make_source_from_context

    name, mode = parse_method(method)
    source = make_source_from_context(name, context)
    if served(source) and queries:
        source = AheadOfTime(source, queries)
    return Stage(f"retrieve-{method}", lambda query: query_record(query, source, store, ks, granularity, mode))


def quick_eval(store, source, queries: Sequence[Query], ks: Sequence[int] = (20,), mode: str | None = None) -> dict:
    """Aggregate metrics of one source, in memory (no records on disk): for sweeps."""
    from tider.eval.metrics import aggregate

    return aggregate([query_record(q, source, store, ks, store.granularity, mode) for q in queries], ks)


def _shown(store: str) -> str:
    """A store as a manifest records it: a URL without its password."""
    from tider.memory.pg import is_database_url
    from tider.memory.pg.pool import describe_url

    return describe_url(store) if is_database_url(store) else str(store)


def build_time_summary(seconds: dict[str, float]) -> dict:
    """Per-memory index build time in this run (memories whose records were all resumed
    from an earlier run are not built, and not counted)."""
    values = np.array(list(seconds.values()), dtype=np.float64)
    if not len(values):
        return {"memories": 0}
    stats = {"mean": values.mean(), "p50": np.median(values), "p95": np.percentile(values, 95), "max": values.max()}
    return {"memories": len(values), **{k: round(float(v), 3) for k, v in stats.items()}}


def run_retrieval_eval(
    dataset: Dataset,
    config: RetrievalEvalConfig,
    out_dir: str | Path,
    data_path: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    from tider.locator.sources import gold_predictions
    from tider.memory import MemoryCollection

    queries = eligible_queries(dataset, config.exclude_categories, config.memory_keys, config.limit)
    if not queries:
        raise ValueError(f"dataset {dataset.name!r}: no queries left to evaluate after filtering")
    manifest = {
        "command": "eval retrieval",
        "dataset": dataset.name,
        "data_path": data_path,
        "data_hash": file_hash(data_path),
        "n_queries": len(queries),
        "methods": list(config.methods),  # adding methods to a run is fine: one stage each
        "config": {
            "ks": list(config.ks),
            "exclude": list(config.exclude_categories),
            "memory_keys": config.memory_keys and list(config.memory_keys),
            "limit": config.limit,
            "source_options": config.source_options,
            "retrieval": config.retrieval.to_json(),
            **({"store": _shown(config.store)} if config.store else {}),
        },
    }
    runner = StageRunner(out_dir, manifest, overwrite=overwrite)
    store = MemoryCollection(dataset.memories, config.retrieval, store=config.store)
    store.prepare(queries)
    context = {"store": store, "gold_by_key": gold_predictions(queries), "source_options": config.source_options}
    records = {}
    for method in config.methods:
        stage = make_stage(method, store, context, config.ks, dataset.granularity, queries)
        records[method] = runner.run(stage, queries, key=lambda q: q.key, progress=progress)
        runner.raise_if_failed(stage.name)
    report = build_report(records, config.ks, config.mcnemar_k)
    report["n_queries"] = len(queries)
    report["dataset"] = dataset.name
    report["index_build_s"] = build_time_summary(store.build_seconds)
    if dataset.name == "locomo":
        from tider.data import LOCOMO_CATEGORIES

        report["category_names"] = LOCOMO_CATEGORIES
    write_report(report, out_dir)
    return report

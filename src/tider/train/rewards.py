"""GRPO rewards for the locator (TIDER Sec. 3.3), as a registry of named functions.

TRL 1.16 calls every reward as ``f(prompts=, completions=, completion_ids=,
**dataset_columns, trainer_state=, log_metric=, log_extra=)`` and logs
``rewards/<f.__name__>/mean``. ``make_rewards(names, context)`` returns callables whose
``__name__`` is the registry name, so the logged names are the configured ones.

| name | paper | value |
|---|---|---|
| ``format`` | – | 1 if the completion parses and passes the schema |
| ``switch`` | r_det | ``scoring.switch_correct`` (temporal flag == gold) |
| ``window_iou`` | r_win | ``scoring.window_iou`` at the data's granularity (no windows on both sides: 1) |
| ``evidence_coverage`` | r_evd | gold evidence in the top-k the prediction retrieves |
| ``evidence_gain`` | r_evd, shortcut-proof | that coverage minus the semantic channel's alone |
| ``evidence_advantage`` | r_evd, relative | that coverage minus the default source's (``top-days``), same question |
| ``answer_correct`` | r_out | a reader LLM answers from the retrieved evidence; the QA evaluation's answer F1 |
| ``answer_span`` | r_out proxy | share of gold-answer tokens in the retrieved text (no LLM) |
| ``proximity`` | Memory-T1 R_s | smooth distance-to-gold, ``2 / (1 + exp(d / tau))`` (1 when touching) |

Every reward is 0 for a malformed completion (``evidence_advantage``: the semantic
channel's loss to the default, what serving does with it); ``answer_correct`` is its
group's mean where the reader itself failed (neither rewarded nor penalized; ``None`` if the
whole group failed). The first configured reward also logs
``parse/<reason>`` (fraction of the batch per failure reason) via ``log_metric`` and a
``parse_failure`` column in the completions table via ``log_extra``, exactly once per batch.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dateutil.parser import isoparse

from tider import scoring
from tider.forest.linearize import render_flat
from tider.forest.prompts import reader_messages
from tider.llm.jsonout import strip_think
from tider.locator.parse import ParseFailure, ParseResult, parse_prediction
from tider.registry import Registry
from tider.scoring import answer_tokens
from tider.types import NON_TEMPORAL, Dataset, Window, WindowPrediction

logger = logging.getLogger(__name__)
RewardFn = Callable[..., list[float]]
# ``fn(completions, *, ctx, parsed, **columns) -> list[float]`` by name.
REWARDS: Registry[Callable] = Registry("reward")
register_reward = REWARDS.register  # a duplicate name is an error
known_rewards = REWARDS.known


@dataclass
class RewardContext:
    """What the rewards need beyond the dataset columns TRL forwards.

    ``dataset`` gives memory spans and the queries the rewards score; retrieval goes
    through a ``tider.memory.MemoryCollection`` (the query path users and the evaluation
    run), built lazily from the dataset's memories once per process. The reader client
    is built by the caller.
    """

    dataset: Dataset | None = None
    retrieval_config: Any = None
    k: int = 20
    proximity_tau_units: float = 7.0  # tau in granularity units (7 days for day-scale data)
    reader: Any = None  # an LLMClient for answer_correct
    check_memory_span: bool = True
    store: Any = None  # a MemoryCollection; built from dataset.memories + retrieval_config on first use if None
    default_source: str = "top-days"  # the learning-free window source evidence_advantage measures against
    _queries: dict = field(default_factory=dict, repr=False)
    _retrieved_cache: dict = field(default_factory=dict, repr=False)
    _answer_cache: dict = field(default_factory=dict, repr=False)
    _defaults: dict = field(default_factory=dict, repr=False)

    def require_dataset(self, reward: str) -> Dataset:
        if self.dataset is None:
            raise ValueError(f"reward {reward!r} needs RewardContext(dataset=...)")
        return self.dataset

    def query(self, reward: str, query_key: str):
        if not self._queries:
            self._queries = {q.key: q for q in self.require_dataset(reward).queries}
        if query_key not in self._queries:
            raise KeyError(f"reward {reward!r}: query {query_key!r} is not in dataset {self.dataset.name!r}")
        return self._queries[query_key]

    def get_store(self, reward: str):
        if self.store is None:
            from tider.memory import MemoryCollection

            self.store = MemoryCollection(self.require_dataset(reward).memories, self.retrieval_config)
        return self.store

    def retrieved(self, reward: str, query_key: str, prediction: WindowPrediction) -> list[int]:
        key = (query_key, prediction)
        if key not in self._retrieved_cache:
            q = self.query(reward, query_key)
            ids, _ = self.get_store(reward).retrieve(q.public(), prediction, self.k)
            ids = ids.tolist() if hasattr(ids, "tolist") else ids
            self._retrieved_cache[key] = list(ids)
        return self._retrieved_cache[key]

    def default_prediction(self, reward: str, query_key: str) -> WindowPrediction:
        """What ``default_source`` answers for the query (computed once per query)."""
        if query_key not in self._defaults:
            from tider.locator.sources import SOURCES, ensure_not_evaluation_only

            ensure_not_evaluation_only(SOURCES.get(self.default_source))  # the oracle would put gold in the baseline
            source = SOURCES.get(self.default_source)()
            q = self.query(reward, query_key)
            self._defaults[query_key] = source.predict(q.public(), self.get_store(reward))
        return self._defaults[query_key]

    def coverage(self, reward: str, query_key: str, prediction: WindowPrediction, gold_ids: Sequence[int]) -> float:
        """Share of the gold evidence in the top-k the prediction retrieves (r_evd)."""
        return scoring.evidence_coverage(self.retrieved(reward, query_key, prediction), gold_ids, self.k)


def completion_text(completion) -> str:
    """TRL passes conversational completions as ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return ""


def _gold_windows(raw: Sequence) -> tuple[Window, ...]:
    out = []
    for w in raw or ():
        start, end = (w["start"], w["end"]) if isinstance(w, dict) else (w[0], w[1])
        out.append(Window(isoparse(start), isoparse(end)))
    return tuple(out)


def _column(kwargs: dict, name: str, n: int, default=None) -> list:
    value = kwargs.get(name)
    if value is None:
        return [default] * n
    return list(value)


def _parse_all(completions, kwargs, ctx: RewardContext) -> list[ParseResult]:
    n = len(completions)
    grans = _column(kwargs, "granularity", n, (ctx.dataset.granularity if ctx.dataset else "day"))
    memories = _column(kwargs, "memory_key", n)
    tables = _column(kwargs, "refs", n)  # each prompt's line/cue table (locator-v2 references)
    results = []
    for completion, gran, memory_key, table in zip(completions, grans, memories, tables):
        span = None
        if ctx.check_memory_span and ctx.dataset is not None and memory_key in ctx.dataset.memories:
            span = ctx.dataset.memories[memory_key].span
        results.append(parse_prediction(completion_text(completion), granularity=gran, refs=table, memory_span=span))
    return results


def _log_failures(parsed: list[ParseResult], log_metric, log_extra) -> None:
    n = max(1, len(parsed))
    if log_metric is not None:
        for reason in ParseFailure:
            log_metric(f"parse/{reason.value}", sum(p.failure == reason for p in parsed) / n)
        log_metric("parse/failure_rate", sum(not p.ok for p in parsed) / n)
    if log_extra is not None:
        log_extra("parse_failure", [p.failure.value if p.failure else "" for p in parsed])


@register_reward("format")
def _format(completions, *, ctx, parsed, **kw) -> list[float]:
    return [float(p.ok) for p in parsed]


@register_reward("switch")
def _switch(completions, *, ctx, parsed, gold_temporal, **kw) -> list[float]:
    return [scoring.switch_correct(p.prediction.temporal, g) if p.ok else 0.0 for p, g in zip(parsed, gold_temporal)]


@register_reward("window_iou")
def _window_iou(completions, *, ctx, parsed, gold_windows, granularity=None, **kw) -> list[float]:
    n = len(parsed)
    grans = granularity or [ctx.dataset.granularity if ctx.dataset else "day"] * n
    return [
        scoring.window_iou(p.prediction.windows, _gold_windows(g), gran) if p.ok else 0.0
        for p, g, gran in zip(parsed, gold_windows, grans)
    ]


def proximity_score(pred: Sequence[Window], gold: Sequence[Window], granularity: str, tau_units: float) -> float:
    """Symmetric smooth closeness of two window sets: the mean, over gold windows, of
    ``s(distance to the nearest predicted window)`` averaged with the same over predicted
    windows, ``s(d) = 2 / (1 + exp(d / tau))``. s(0) = 1 and s decays smoothly, so a
    window one day outside the gold scores just under one inside it (no edge jump)."""
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0

    def s(d: float) -> float:
        return 2.0 / (1.0 + math.exp(min(d / tau_units, 700.0)))

    to_gold = sum(s(min(scoring.unit_gap(g, p, granularity) for p in pred)) for g in gold) / len(gold)
    to_pred = sum(s(min(scoring.unit_gap(p, g, granularity) for g in gold)) for p in pred) / len(pred)
    return 0.5 * (to_gold + to_pred)


@register_reward("proximity")
def _proximity(completions, *, ctx, parsed, gold_windows, granularity=None, **kw) -> list[float]:
    n = len(parsed)
    grans = granularity or [ctx.dataset.granularity if ctx.dataset else "day"] * n
    return [
        proximity_score(p.prediction.windows, _gold_windows(g), gran, ctx.proximity_tau_units) if p.ok else 0.0
        for p, g, gran in zip(parsed, gold_windows, grans)
    ]


@register_reward("evidence_coverage")
def _evidence_coverage(completions, *, ctx, parsed, query_key, evidence_ids, **kw) -> list[float]:
    out = []
    for p, qk, gold_ids in zip(parsed, query_key, evidence_ids):
        if not p.ok or not gold_ids:
            out.append(0.0)
            continue
        out.append(ctx.coverage("evidence_coverage", qk, p.prediction, gold_ids))
    return out


@register_reward("evidence_gain")
def _evidence_gain(completions, *, ctx, parsed, query_key, evidence_ids, **kw) -> list[float]:
    """Coverage of the retrieval the prediction drives *minus* the semantic channel's alone,
    in [-1, 1]. A window spanning most of the memory retrieves about what no window does,
    so it gains ~0 where plain coverage paid it in full (the wide-window shortcut GRPO
    found under locator-v1); a wrong window that pushes the evidence out loses."""
    out = []
    for p, qk, gold_ids in zip(parsed, query_key, evidence_ids):
        if not p.ok or not gold_ids:
            out.append(0.0)
            continue
        base = ctx.retrieved("evidence_gain", qk, NON_TEMPORAL)
        out.append(scoring.evidence_gain(ctx.retrieved("evidence_gain", qk, p.prediction), base, gold_ids, ctx.k))
    return out


@register_reward("evidence_advantage")
def _evidence_advantage(completions, *, ctx, parsed, query_key, evidence_ids, **kw) -> list[float]:
    """Coverage of the retrieval the prediction drives *minus* that of the default
    learning-free source (``RewardContext.default_source``, ``top-days``) on the same
    question, in [-1, 1]: matching the default earns nothing, beating it earns, losing to it
    costs, so a policy that copies the best rule gets no reward from here. A malformed
    completion is scored as what serving does with it, the semantic channel alone (its
    coverage minus the default's), not as 0, which would equal copying the default."""
    out = []
    for p, qk, gold_ids in zip(parsed, query_key, evidence_ids):
        if not gold_ids:
            out.append(0.0)
            continue
        base = ctx.retrieved("evidence_advantage", qk, ctx.default_prediction("evidence_advantage", qk))
        mine = ctx.retrieved("evidence_advantage", qk, p.prediction if p.ok else NON_TEMPORAL)
        out.append(scoring.evidence_gain(mine, base, gold_ids, ctx.k))
    return out


@register_reward("answer_span")
def _answer_span(completions, *, ctx, parsed, query_key, answer, **kw) -> list[float]:
    """Proxy for r_out without an LLM: share of gold-answer tokens found in the retrieved text."""
    dataset = ctx.require_dataset("answer_span")
    out = []
    for p, qk, gold in zip(parsed, query_key, answer):
        gold_tokens = set(answer_tokens(gold))
        if not p.ok or not gold_tokens:
            out.append(0.0)
            continue
        memory = dataset.memories[ctx.query("answer_span", qk).memory_key]
        ids = ctx.retrieved("answer_span", qk, p.prediction)
        seen = set(answer_tokens(" ".join(memory[i].text for i in ids[: ctx.k])))
        out.append(len(gold_tokens & seen) / len(gold_tokens))
    return out


@register_reward("answer_correct")
def _answer_correct(completions, *, ctx, parsed, query_key, answer, log_metric=None, **kw) -> list[float | None]:
    """r_out: a reader LLM answers from the retrieved messages with the QA evaluation's flat
    reader prompt, scored by its answer F1 (``tider.scoring.answer_f1``): the
    reward optimises the number the evaluation reports. Memoized by (query, retrieved ids),
    since a group's completions often retrieve the same set; the batch's new pairs go to the
    reader concurrently (``LLMClient.chat_batch``). A call that still fails after the
    client's bounded retries is a typed failure, not an answer: counted in ``reader/failures``,
    not cached (the next batch asks again), and scored as its group's mean
    (``group_mean_fill``: neither rewarded nor penalized; ``None`` where the whole group's
    calls failed, which TRL leaves out when every reward is ``None``)."""
    if ctx.reader is None:
        raise ValueError(
            "reward 'answer_correct' needs RewardContext(reader=LLMClient(...)); use 'answer_span' as the cheap proxy"
        )
    dataset = ctx.require_dataset("answer_correct")
    keys: list = []
    for p, qk, gold in zip(parsed, query_key, answer):
        ok = p.ok and bool(gold)
        keys.append((qk, tuple(ctx.retrieved("answer_correct", qk, p.prediction)[: ctx.k])) if ok else None)
    todo = list(dict.fromkeys(k for k in keys if k is not None and k not in ctx._answer_cache))
    results = (
        ctx.reader.chat_batch(
            [_reader_messages(dataset, ctx.query("answer_correct", qk), ids) for qk, ids in todo], stage="reward_reader"
        )
        if todo
        else []
    )
    golds = {k: gold for k, gold in zip(keys, answer) if k is not None}
    scores, failed = {}, set()
    for key, result in zip(todo, results):
        if not result.answered:  # an empty or odd answer is the reader's answer, scored as such
            failed.add(key)
            continue
        text = strip_think(result.text).strip()
        score = scoring.answer_f1(text, golds[key], ctx.query("answer_correct", key[0]).category)
        scores[key] = score
        if result.ok:
            ctx._answer_cache[key] = score
    if failed:
        logger.warning(
            "answer_correct: %d of %d reader calls failed (%s); no reward for them",
            len(failed),
            len(todo),
            next(r.error for r in results if not r.answered),
        )
    if log_metric is not None:
        log_metric("reader/failures", float(sum(k in failed for k in keys)))
        log_metric("reader/calls", float(len(todo)))
        # Of those calls, the answers that share a word with the gold (F1 > 0): beside
        # reader/calls it says whether the reader's scores vary; a reader that never answers
        # right (or always does) gives the policy no reader signal to learn from.
        log_metric("reader/f1_above_0", float(sum(s > 0 for s in scores.values())))
    values = [0.0 if k is None else None if k in failed else scores.get(k, ctx._answer_cache.get(k)) for k in keys]
    return group_mean_fill(values, query_key)


def group_mean_fill(values: list[float | None], groups: Sequence) -> list[float | None]:
    """Each ``None`` (a failed reader call) replaced by the mean of the scored values of its
    group (the completions of the same prompt in this batch), so that under TRL's group
    centring it is neither rewarded nor penalized: its advantage comes from its other rewards
    alone. TRL sums rewards with ``nansum``, so a ``None`` left in place would count as 0
    beside its group's scores. A group with no scored value keeps its ``None``s."""
    by_group: dict = {}
    for v, g in zip(values, groups):
        if v is not None:
            by_group.setdefault(g, []).append(v)
    return [
        v if v is not None or g not in by_group else sum(by_group[g]) / len(by_group[g]) for v, g in zip(values, groups)
    ]


def _reader_messages(dataset: Dataset, query, ids) -> list[dict]:
    memory = dataset.memories[query.memory_key]
    context = render_flat([memory[i] for i in sorted(ids)], dataset.granularity)
    return reader_messages("flat", query.text, query.user, context)


def make_rewards(names: Sequence[str], context: RewardContext | None = None) -> list[RewardFn]:
    """TRL-ready reward callables for ``names`` (in order), named after the registry names."""
    context = context or RewardContext()
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"unknown reward(s) {unknown}; known rewards: {known_rewards()}")
    if len(set(names)) != len(names):
        raise ValueError(f"reward names repeat: {list(names)}")
    return [_bind(name, context, log_failures=(i == 0)) for i, name in enumerate(names)]


def reward_scores(reward_fns: Sequence[RewardFn], completions: Sequence[str], columns: dict) -> dict[str, np.ndarray]:
    """Each reward function's scores for ``completions`` (texts), by its registry name,
    outside a trainer: ``columns`` are the dataset columns TRL would forward
    (``tider.train.examples.as_columns``). A ``None`` (no reward) is NaN."""

    def scores(fn) -> np.ndarray:
        values = fn(prompts=None, completions=list(completions), **columns)
        return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)

    return {fn.__name__: scores(fn) for fn in reward_fns}


def _bind(name: str, ctx: RewardContext, log_failures: bool) -> RewardFn:
    impl = REWARDS.get(name)

    def reward(prompts=None, completions=None, completion_ids=None, log_metric=None, log_extra=None, **columns):
        parsed = _parse_all(completions, columns, ctx)
        if log_failures:
            _log_failures(parsed, log_metric, log_extra)
            # Per-rank record of what this process scored (the rank's log file only).
            logger.info(
                "rewards on rank %s: %d completions of prompts %s",
                os.environ.get("RANK", "0"),
                len(parsed),
                sorted(set(columns.get("query_key") or [])),
                extra={"file_only": True},
            )
        columns.pop("trainer_state", None)
        return impl(completions, ctx=ctx, parsed=parsed, log_metric=log_metric, **columns)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = impl.__doc__
    return reward

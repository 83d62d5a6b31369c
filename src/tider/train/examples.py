"""Locator training examples: deterministic splits by conversation, SFT and GRPO records.

Splits are by memory (conversation), never by query: every query of a memory lands in the
same split, so no message seen while training ever backs a held-out question. The split
is a seeded shuffle of the sorted keys, so it depends only on the set of keys and the seed
(LoCoMo dev conversations are split by exactly the same function).

Records follow TRL's conversational formats:
- SFT, prompt-completion: ``{"prompt": [system, user], "completion": [assistant]}`` where
  the assistant content is the gold JSON (``WindowPrediction.to_json``);
- GRPO: ``{"prompt": [system, user]}`` plus the gold columns TRL forwards to reward
  functions as keyword arguments (gold_windows as ISO strings, gold_temporal,
  evidence_ids, memory_key, query_key, answer, granularity, n_gold_windows).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence

from tider.locator.prompt import PromptSettings, locator_input
from tider.types import Dataset, Query, format_time

SPLITS = ("train", "validation", "test")


def split_keys(
    memory_keys: Iterable[str], seed: int = 0, fractions: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, list[str]]:
    """Deterministic train/validation/test split of memory keys.

    With three or more keys every split gets at least one, so small benchmarks (a handful
    of LoCoMo conversations) still have a held-out memory.
    """
    keys = sorted(set(memory_keys))
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    random.Random(seed).shuffle(keys)
    n = len(keys)
    n_val = round(n * fractions[1])
    n_test = round(n * fractions[2])
    if n >= 3:
        n_val, n_test = max(1, n_val), max(1, n_test)
    n_train = n - n_val - n_test
    return {
        "train": sorted(keys[:n_train]),
        "validation": sorted(keys[n_train : n_train + n_val]),
        "test": sorted(keys[n_train + n_val :]),
    }


SPLIT_CHOICES = ("train", "validation", "test", "heldout", "all")


def memory_keys_of(memory_keys: Iterable[str], split: str, seed: int = 0) -> list[str] | None:
    """The memories of a named split; ``heldout`` = validation + test (every conversation
    training never saw), ``all`` = None (no restriction)."""
    if split == "all":
        return None
    if split not in SPLIT_CHOICES:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_CHOICES)}")
    splits = split_keys(memory_keys, seed=seed)
    return sorted(splits["validation"] + splits["test"]) if split == "heldout" else splits[split]


TRAIN_ONLY = "train_only_memories"  # Dataset.stats key: memories added for training only


def split_queries(dataset: Dataset, seed: int = 0, fractions=(0.8, 0.1, 0.1)) -> dict[str, list[Query]]:
    """The dataset's queries, grouped by the split of their memory. Memories listed in
    ``dataset.stats["train_only_memories"]`` (extra training conversations) all go to
    train; the others are split by ``split_keys``, exactly as without the extras."""
    train_only = set(dataset.stats.get(TRAIN_ONLY, ()))
    splits = split_keys([k for k in dataset.memories if k not in train_only], seed=seed, fractions=fractions)
    splits["train"] = sorted(set(splits["train"]) | train_only)
    where = {key: name for name, keys in splits.items() for key in keys}
    out: dict[str, list[Query]] = {name: [] for name in SPLITS}
    for q in dataset.queries:
        if q.memory_key not in where:
            raise ValueError(f"dataset {dataset.name!r}: query {q.key!r} names unknown memory {q.memory_key!r}")
        out[where[q.memory_key]].append(q)
    return out


def _iou(a, b, granularity) -> float:
    from tider.scoring import window_iou

    return window_iou([a], [b], granularity)


def gold_answer(query: Query, table, granularity) -> dict:
    """The gold locator answer for one prompt, in the v2 output: each gold window as the
    reference in the prompt's table that covers it best — the cue when it is at least as
    tight as the best line (a spelled-out date), else the line (the event inside "last
    week") — by its first anchor/recent mark when the prompt answers by marks — else,
    when nothing in the prompt touches it, the dates themselves."""
    gold = query.gold
    if not gold.temporal:
        return {"temporal": False, "windows": []}
    windows: list[dict] = []
    for g in sorted(gold.windows):
        line = max(range(len(table.lines)), key=lambda k: (_iou(table.lines[k], g, granularity), -k), default=None)
        cue = max(range(len(table.cues)), key=lambda j: (_iou(table.cues[j], g, granularity), -j), default=None)
        line_iou = _iou(table.lines[line], g, granularity) if line is not None else 0.0
        cue_iou = _iou(table.cues[cue], g, granularity) if cue is not None else 0.0
        if cue_iou > 0 and cue_iou >= line_iou:
            ref = {"cue": cue + 1}
        elif line_iou > 0:
            labels = [m for m, k in getattr(table, "marks", ()) if k == line + 1]
            ref = {"mark": labels[0]} if labels else {"entry": line + 1}
        else:
            ref = g.to_json(granularity)
        if ref not in windows:
            windows.append(ref)
    return {"temporal": True, "windows": windows}


class PromptBuilder:
    """Builds locator-v2 prompts for a dataset from its ``MemoryCollection`` (so prompts and
    retrieval rewards see the same timeline and embeddings): the timeline as of each
    question's ``asked_at``, its resolved time cues, the chosen lines, and token-budget
    truncation with the policy's tokenizer. ``build(query)`` returns the ``LocatorInput``
    (messages + the table references resolve against)."""

    def __init__(
        self, dataset: Dataset, store, *, tokenizer=None, settings: PromptSettings | None = None, resolver=None
    ):
        from tider.locator.rules import shared_resolver

        self.dataset = dataset
        self.store = store
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        self.resolver = resolver or shared_resolver()

    def build(self, query: Query):
        from tider.locator.rules import query_cues

        public = query.public()
        memory = self.dataset.memories[query.memory_key]
        timeline = self.store.timeline(query.memory_key).visible(public.asked_at)
        cues = query_cues(self.resolver, public, memory)
        return locator_input(
            public,
            memory,
            timeline,
            cues,
            self.dataset.granularity,
            self.settings,
            query_vector=self.store.embedder.encode([public.text])[0],
            tokenizer=self.tokenizer,
        )

    def messages(self, query: Query) -> list[dict]:
        return self.build(query).messages


def sft_records(queries: Sequence[Query], builder: PromptBuilder) -> list[dict]:
    """TRL conversational prompt-completion records with the gold answer as the completion."""
    g = builder.dataset.granularity
    records = []
    for q in queries:
        table = builder.build(q)
        records.append(
            {
                "prompt": table.messages,
                "completion": [{"role": "assistant", "content": json.dumps(gold_answer(q, table, g))}],
                "query_key": q.key,
                "category": q.category or "",
            }
        )
    return records


def reward_columns(q: Query, table, granularity) -> dict:
    """The columns the GRPO rewards read for one prompt (TRL passes extra dataset columns
    as kwargs): the prompt's reference table (``refs``) and the gold labels."""
    gold_windows = (
        [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in q.gold.windows]
        if q.gold.temporal
        else []
    )
    return {
        "refs": table.refs_json(granularity),
        "query_key": q.key,
        "memory_key": q.memory_key,
        "category": q.category or "",
        "granularity": granularity,
        "gold_temporal": bool(q.gold.temporal),
        "gold_windows": gold_windows,
        "n_gold_windows": len(gold_windows),
        "evidence_ids": list(q.gold.evidence_ids),
        "answer": q.gold.answer or "",
    }


def as_columns(records: Sequence[dict], repeat: int = 1) -> dict:
    """Records -> the keyword columns a reward function gets, each record ``repeat`` times
    in a row (TRL's layout for G completions of a prompt); the prompt itself is left out."""
    keys = [k for k in records[0] if k not in ("prompt", "completion")] if records else []
    return {k: [r[k] for r in records for _ in range(repeat)] for k in keys}


def grpo_records(queries: Sequence[Query], builder: PromptBuilder) -> list[dict]:
    """GRPO prompts plus the columns the rewards read (``reward_columns``)."""
    g = builder.dataset.granularity
    records = []
    for q in queries:
        table = builder.build(q)
        records.append({"prompt": table.messages, **reward_columns(q, table, g)})
    return records


def corpus_texts(dataset: Dataset, records: Sequence[dict] | None = None) -> list[str]:
    """Tokenizer corpus for a tiny model: message texts, plus rendered prompts and completions."""
    texts = [m.text for memory in dataset.memories.values() for m in memory]
    texts += [q.text for q in dataset.queries]
    for r in records or ():
        texts += [m["content"] for m in r["prompt"]]
        texts += [m["content"] for m in r.get("completion", [])]
    return texts

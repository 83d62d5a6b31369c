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
from typing import Callable, Iterable, Optional, Sequence

from tider.locator.prompt import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_TOP_K, build_messages
from tider.types import Dataset, Query, WindowPrediction, format_time

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


def split_queries(dataset: Dataset, seed: int = 0, fractions=(0.8, 0.1, 0.1)) -> dict[str, list[Query]]:
    """The dataset's queries, grouped by the split of their memory."""
    splits = split_keys(dataset.memories, seed=seed, fractions=fractions)
    where = {key: name for name, keys in splits.items() for key in keys}
    out: dict[str, list[Query]] = {name: [] for name in SPLITS}
    for q in dataset.queries:
        if q.memory_key not in where:
            raise ValueError(f"dataset {dataset.name!r}: query {q.key!r} names unknown memory {q.memory_key!r}")
        out[where[q.memory_key]].append(q)
    return out


def gold_completion(query: Query, granularity) -> str:
    """The gold locator answer as the JSON text the model should write."""
    gold = query.gold
    prediction = WindowPrediction(temporal=gold.temporal, windows=tuple(gold.windows) if gold.temporal else ())
    return json.dumps(prediction.to_json(granularity))


class PromptBuilder:
    """Builds locator prompts for a dataset: the memory's timeline (from the retrieval
    store, so prompts and retrieval rewards see the same clusters), top-K entries per
    query, token-budget truncation with the policy's tokenizer."""

    def __init__(
        self,
        dataset: Dataset,
        timeline_for: Callable[[str], object],
        *,
        tokenizer=None,
        top_k: int = DEFAULT_TOP_K,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    ):
        self.dataset = dataset
        self.timeline_for = timeline_for  # memory key -> Timeline, e.g. MemoryCollection.timeline
        self.tokenizer = tokenizer
        self.top_k = top_k
        self.max_prompt_tokens = max_prompt_tokens

    def messages(self, query: Query) -> list[dict]:
        public = query.public()
        entries = self.timeline_for(query.memory_key).top_k(public.text, self.top_k)
        return build_messages(
            public,
            entries,
            self.dataset.granularity,
            tokenizer=self.tokenizer,
            max_prompt_tokens=self.max_prompt_tokens,
            top_k=self.top_k,
        )


def sft_records(queries: Sequence[Query], builder: PromptBuilder) -> list[dict]:
    """TRL conversational prompt-completion records with the gold JSON as the completion."""
    g = builder.dataset.granularity
    return [
        {
            "prompt": builder.messages(q),
            "completion": [{"role": "assistant", "content": gold_completion(q, g)}],
            "query_key": q.key,
            "category": q.category or "",
        }
        for q in queries
    ]


def grpo_records(queries: Sequence[Query], builder: PromptBuilder) -> list[dict]:
    """GRPO prompts plus the gold columns the rewards read (TRL passes extra columns as kwargs)."""
    g = builder.dataset.granularity
    records = []
    for q in queries:
        gold_windows = [[format_time(w.start, g), format_time(w.end, g)] for w in q.gold.windows] if q.gold.temporal else []
        records.append(
            {
                "prompt": builder.messages(q),
                "query_key": q.key,
                "memory_key": q.memory_key,
                "category": q.category or "",
                "granularity": g,
                "gold_temporal": bool(q.gold.temporal),
                "gold_windows": gold_windows,
                "n_gold_windows": len(gold_windows),
                "evidence_ids": list(q.gold.evidence_ids),
                "answer": q.gold.answer or "",
            }
        )
    return records


def corpus_texts(dataset: Dataset, records: Optional[Sequence[dict]] = None) -> list[str]:
    """Tokenizer corpus for a tiny model: message texts, plus rendered prompts and completions."""
    texts = [m.text for memory in dataset.memories.values() for m in memory]
    texts += [q.text for q in dataset.queries]
    for r in records or ():
        texts += [m["content"] for m in r["prompt"]]
        texts += [m["content"] for m in r.get("completion", [])]
    return texts

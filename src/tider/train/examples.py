"""Locator training examples: SFT and GRPO records.

Splits are by memory (``tider.data.splits``): no message seen while training ever backs a
held-out question.

Records follow TRL's conversational formats:
- SFT, prompt-completion: ``{"prompt": [system, user], "completion": [assistant]}`` where
  the assistant content is the target answer (``PromptBuilder.target``: the gold windows
  as references into the prompt, or "no window" where no window would retrieve more);
- GRPO: ``{"prompt": [system, user]}`` plus the columns TRL forwards to reward functions
  as keyword arguments (``reward_columns``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tider.locator.contract import OPTION_NAMES
from tider.locator.parse import parse_prediction
from tider.locator.prompt import PromptSettings, locator_input
from tider.scoring import evidence_gain
from tider.types import NON_TEMPORAL, Dataset, Query, format_time


def _iou(a, b, granularity) -> float:
    from tider.scoring import window_iou

    return window_iou([a], [b], granularity)


def line_refs(table) -> list[dict]:
    """One reference to each shown line: its first mark when it has one (the same tokens in
    every prompt), else its number."""
    refs = []
    for k in range(1, len(table.lines) + 1):
        labels = [m for m, line in table.marks if line == k]
        refs.append({"mark": labels[0]} if labels else {"entry": k})
    return refs


def gold_answer(query: Query, table, granularity) -> dict:
    """The gold windows as references into one prompt's table: each gold window as the
    reference that covers it best — the cue when it is at least as tight as the best line
    (a spelled-out date), else the line, named by its first mark when it has one (the same
    tokens in every prompt) or by its number. A gold window nothing in the prompt touches
    cannot be pointed at and is left out; with none left the answer is "no window"."""
    gold = query.gold
    if not gold.temporal:
        return ABSTAIN
    windows: list[dict] = []
    for g in sorted(gold.windows):
        line = max(range(len(table.lines)), key=lambda k: (_iou(table.lines[k], g, granularity), -k), default=None)
        cue = max(range(len(table.cues)), key=lambda j: (_iou(table.cues[j], g, granularity), -j), default=None)
        line_iou = _iou(table.lines[line], g, granularity) if line is not None else 0.0
        cue_iou = _iou(table.cues[cue], g, granularity) if cue is not None else 0.0
        if cue_iou > 0 and cue_iou >= line_iou:
            ref = {"cue": cue + 1}
        elif line_iou > 0:
            ref = line_refs(table)[line]
        else:
            continue
        if ref not in windows:
            windows.append(ref)
    return {"temporal": True, "windows": windows} if windows else ABSTAIN


ABSTAIN = {"temporal": False, "windows": []}
DEFAULT_OPTION = "top-days"  # the best learning-free source on the real validation split


def option_answers(table) -> list[dict]:
    """``{"option": n}`` for each learning-free option the prompt lists, the default
    (``top-days``) first."""
    order = sorted(range(1, len(table.options) + 1), key=lambda n: (OPTION_NAMES[n - 1] != DEFAULT_OPTION, n))
    return [{"temporal": True, "windows": [{"option": n}]} for n in order if table.options[n - 1]]


def is_option(answer: dict) -> bool:
    return any("option" in w for w in answer.get("windows", ()))


def target_kind(answer: dict) -> str:
    """``no window``, ``gold`` (references to the gold windows) or the option's name."""
    from tider.locator.contract import OPTION_NAMES

    if not answer["temporal"]:
        return "no window"
    return OPTION_NAMES[answer["windows"][0]["option"] - 1] if is_option(answer) else "gold"


class PromptBuilder:
    """Builds locator prompts and their targets for a dataset from a ``MemoryStore`` (so
    prompts and retrieval rewards see the same timeline and embeddings): the timeline as of
    each question's ``asked_at``, its resolved time cues, the chosen lines, and token-budget
    truncation with the policy's tokenizer. ``build(query)`` returns the ``LocatorInput``
    (messages + the table references resolve against); ``target(query, table)`` the answer
    the locator is trained towards."""

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
        cues = query_cues(self.resolver, public, self.store.messages(query.memory_key))
        vector = self.store.embedder.encode([public.text])[0] if hasattr(self.store, "embedder") else None
        return locator_input(public, self.store, cues, self.settings, query_vector=vector, tokenizer=self.tokenizer)

    def target(self, query: Query, table) -> dict:
        """The answer that retrieves the most of the evidence beyond no window: one of the
        learning-free options the prompt lists (the default, top-days, first) or the gold
        windows as references (``gold_answer``); on a tie the option, a rule the model can
        apply from the prompt alone. Where nothing adds evidence, the gold references if they
        lose none (pointing at the evidence costs nothing), else "no window". So the locator
        learns which rule helps where, and to abstain where pointing at the evidence hurts."""
        answer = gold_answer(query, table, self.dataset.granularity)
        if not query.gold.evidence_ids:
            return answer
        gain = self.evidence_gains(query, table)
        gains = [(gain(c), c) for c in option_answers(table) + ([answer] if answer["temporal"] else [])]
        best = max((g for g, _ in gains), default=-1.0)
        if best > 0:  # the first that retrieves the most: an option before the gold references
            return next(c for g, c in gains if g == best)
        return answer if answer["temporal"] and gains[-1][0] == 0 else ABSTAIN

    def evidence_gains(self, query: Query, table):
        """``gain(answer)``: the share of ``query``'s evidence ``answer`` (an answer into
        ``table``) retrieves beyond what no window does (``scoring.evidence_gain`` at the
        store's k)."""
        k, public = self.store.config.k, query.public()
        base = self.store.retrieve(public, NON_TEMPORAL, k)[0]

        def gain(answer: dict) -> float:
            parsed = parse_prediction(json.dumps(answer), granularity=self.dataset.granularity, refs=table)
            return evidence_gain(self.store.retrieve(public, parsed.prediction, k)[0], base, query.gold.evidence_ids, k)

        return gain

    def messages(self, query: Query) -> list[dict]:
        return self.build(query).messages


def sft_records(queries: Sequence[Query], builder: PromptBuilder) -> list[dict]:
    """TRL conversational prompt-completion records with the target answer as the completion,
    each with what its prompt can express of the gold (``reach``, see ``reach``)."""
    records = []
    for q in queries:
        table = builder.build(q)
        target = builder.target(q, table)
        records.append(
            {
                "prompt": table.messages,
                "completion": [{"role": "assistant", "content": json.dumps(target)}],
                "query_key": q.key,
                "category": q.category or "",
                "reach": reach(q, table, target, builder.dataset.granularity),
                "target": target_kind(target),
            }
        )
    return records


def reach(query: Query, table, target: dict, granularity) -> dict:
    """What one prompt can express of a temporal question's gold windows: how many there
    are, how many a line or cue touches (IoU > 0: ``gold_answer`` can point at them) and
    how many one reference covers exactly (IoU 1), and whether the target names them all,
    abstains, or is an option. Non-temporal questions: ``{}``."""
    if not query.gold.temporal or not query.gold.windows:
        return {}
    best = [
        max((_iou(ref, g, granularity) for ref in (*table.lines, *table.cues)), default=0.0) for g in query.gold.windows
    ]
    touched = sum(b > 0 for b in best)
    return {
        "gold": len(best),
        "touched": touched,
        "exact": sum(b >= 1.0 for b in best),
        "whole": target_kind(target) == "gold" and touched == len(best),
        "abstain": not target["temporal"],
        "option": is_option(target),
    }


def reachability(records: Sequence[dict], groups: dict | None = None, memory_of: dict | None = None) -> dict:
    """Shares over SFT records (``sft_records``), pooled and per dataset (``groups``: dataset
    name -> memory keys, ``memory_of``: query key -> memory key): of the gold windows, those
    the prompt touches and those it can say exactly; of the temporal questions, those whose
    target names every gold window and those whose target abstains."""

    def shares(records: list[dict]) -> dict:
        kinds = [r["target"] for r in records if "target" in r]
        rows = [r.get("reach", {}) for r in records]
        rows = [r for r in rows if r]
        windows = sum(r["gold"] for r in rows)
        return {
            "questions": len(rows),
            "gold_windows": windows,
            "gold_windows_touched": sum(r["touched"] for r in rows) / windows if windows else None,
            "gold_windows_exact": sum(r["exact"] for r in rows) / windows if windows else None,
            "targets_whole": sum(r["whole"] for r in rows) / len(rows) if rows else None,
            "targets_abstain": sum(r["abstain"] for r in rows) / len(rows) if rows else None,
            "targets_option": sum(r.get("option", False) for r in rows) / len(rows) if rows else None,
            # every question's target, temporal or not: what SFT teaches to answer
            "targets_by_kind": {k: kinds.count(k) / len(kinds) for k in sorted(set(kinds))},
        }

    out = {"pooled": shares(list(records))}
    where = {key: name for name, keys in (groups or {}).items() for key in keys}
    for name in groups or {}:
        part = [r for r in records if where.get((memory_of or {}).get(r["query_key"])) == name]
        out[name] = shares(part)
    return out


def reward_columns(q: Query, table, granularity, target: dict) -> dict:
    """The columns the GRPO rewards read for one prompt (TRL passes extra dataset columns
    as kwargs): the prompt's reference table (``refs``) and the labels. ``switch`` and
    ``window_iou`` score against the target (``PromptBuilder.target``): where no window
    pays, "no window" is right; ``n_gold_windows`` (DAR's bucket) is the data's count."""
    gold = q.gold.windows
    if is_option(target):  # the option's own windows are what the target names
        gold = parse_prediction(json.dumps(target), granularity=granularity, refs=table).prediction.windows
    windows = [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in gold]
    return {
        "refs": table.refs_json(granularity),
        "query_key": q.key,
        "memory_key": q.memory_key,
        "category": q.category or "",
        "granularity": granularity,
        "gold_temporal": bool(target["temporal"]),
        "gold_windows": windows if target["temporal"] else [],
        "n_gold_windows": len(q.gold.windows) if q.gold.temporal else 0,
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
        records.append({"prompt": table.messages, **reward_columns(q, table, g, builder.target(q, table))})
    return records


def corpus_texts(dataset: Dataset, queries: Sequence[Query], records: Sequence[dict] | None = None) -> list[str]:
    """Tokenizer corpus for a tiny model: the messages of the memories ``queries`` ask about
    (the train split's: a vocabulary is made from training data only), their texts, and the
    rendered prompts and completions."""
    keys = {q.memory_key for q in queries}
    texts = [m.text for key, memory in dataset.memories.items() if key in keys for m in memory]
    texts += [q.text for q in queries]
    for r in records or ():
        texts += [m["content"] for m in r["prompt"]]
        texts += [m["content"] for m in r.get("completion", [])]
    return texts

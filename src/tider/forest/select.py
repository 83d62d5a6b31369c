"""Evidence utility selection (T-Mem Sec. 4.2, prompt App. J).

Per window: the messages inside it are ranked by embedding similarity to the query, the
top-N (default 100) go to a query-conditioned LLM selector that returns KEY / SUPPORT
ids, and R'(q) = seeds + everything selected (Eq. 3). Ids the model invents (not among
that window's candidates) are dropped and counted; an unparseable reply selects nothing
and is recorded as an error, never raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tider.forest.prompts import SELECTION_SCHEMA, parse_msg_id, selection_messages
from tider.types import Memory, Query, Window, format_time

# (query text, candidate ids) -> similarity per candidate, higher is closer.
Similarity = Callable[[str, Sequence[int]], np.ndarray]


@dataclass
class WindowSelection:
    window: dict
    candidates: list[int]
    selected: list[int]
    labels: dict[int, str]
    invalid_ids: int = 0
    error: str | None = None


@dataclass
class SelectionResult:
    ids: list[int]  # R'(q): seeds first (rank order), then selected ids by time
    windows: list[WindowSelection] = field(default_factory=list)
    prompts: list[list[dict]] = field(default_factory=list)  # as sent, one per entry of ``windows``

    @property
    def errors(self) -> int:
        return sum(w.error is not None for w in self.windows)


def window_candidates(memory: Memory, window: Window, query_text: str, similarity: Similarity, top_n: int) -> list[int]:
    lo, hi = memory.id_range(window)
    ids = list(range(lo, hi))
    if len(ids) <= top_n:
        return ids
    sims = np.asarray(similarity(query_text, ids))
    best = np.argsort(-sims, kind="stable")[:top_n]
    return sorted(ids[i] for i in best)


def selection_prompts(
    query: Query, memory: Memory, windows: Sequence[Window], similarity: Similarity, top_n: int = 100
) -> list[tuple[Window, list[int], list[dict]]]:
    out = []
    for w in windows:
        cands = window_candidates(memory, w, query.text, similarity, top_n)
        if not cands:
            continue
        text = f"{format_time(w.start, memory.granularity)} .. {format_time(w.end, memory.granularity)}"
        out.append(
            (w, cands, selection_messages(query.text, query.user, text, [memory[i] for i in cands], memory.granularity))
        )
    return out


def select_evidence(
    query: Query,
    memory: Memory,
    seeds: Sequence[int],
    windows: Sequence[Window],
    client,
    similarity: Similarity,
    top_n: int = 100,
    max_tokens: int = 512,
) -> SelectionResult:
    """``query`` must be ``query.public()``: nothing here may see gold labels."""
    prompts = selection_prompts(query, memory, windows, similarity, top_n)
    results = (
        client.chat_batch(
            [p for _, _, p in prompts], stage="select", json_schema=SELECTION_SCHEMA, max_tokens=max_tokens
        )
        if prompts
        else []
    )
    per_window, selected_all = [], set()
    for (w, cands, _), result in zip(prompts, results):
        allowed, chosen, labels, invalid = set(cands), [], {}, 0
        if result.parsed_json is not None:
            for item in result.parsed_json.get("selected", []):
                mid = parse_msg_id(item.get("message_id")) if isinstance(item, dict) else None
                if mid is None or mid not in allowed:
                    invalid += 1
                    continue
                if mid not in labels:
                    chosen.append(mid)
                labels[mid] = str(item.get("label", "KEY")).upper()
        per_window.append(
            WindowSelection(
                w.to_json(memory.granularity),
                cands,
                chosen,
                labels,
                invalid,
                None if result.parsed_json is not None else (result.error or "no_json"),
            )
        )
        selected_all.update(chosen)
    seeds = list(dict.fromkeys(seeds))
    extra = sorted(selected_all - set(seeds))
    return SelectionResult(seeds + extra, per_window, [p for _, _, p in prompts])

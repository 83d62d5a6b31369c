"""The locator prompt, byte-identical for training, local generation and serving
(``tider.locator.contract`` holds its version and the output schema).

Input (TIDER Sec. 3): system instructions, then the question with its ``asked_at`` time
and asking user, then the top-K (default 30) timeline entries as ``[start .. end] summary``
lines. The entries arrive ranked by similarity; when a tokenizer and a budget are given,
the lowest-ranked entries are dropped until the prompt fits, because TRL no longer
truncates prompts and a cut in the middle of a line would hand the model a broken date.
The kept entries are shown in time order, not rank order: relative questions ("two weeks
before ...") are easier to resolve on a chronological list, and the rank is not a signal
the locator needs once the set is chosen.

Output (DESIGN.md decision 2): ``{"temporal": bool, "windows": [{"start", "end"}]}``,
optionally after ``<think>...</think>``; ``tider.locator.parse`` reads it back.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from tider.locator.contract import MAX_WINDOWS
from tider.types import Granularity, Query, format_time

DEFAULT_TOP_K = 30
DEFAULT_MAX_PROMPT_TOKENS = 2048

SYSTEM_PROMPT = """You are a temporal interval locator for a conversational memory.
Given a question, the time it was asked, and a timeline of events from the memory,
decide whether answering needs a time constraint, and if so, which time windows hold
the evidence.
Answer with one JSON object and nothing else:
{"temporal": true, "windows": [{"start": "<time>", "end": "<time>"}]}
or, when the question has no time constraint:
{"temporal": false, "windows": []}
Times use the format of the timeline ({time_format}). A window is inclusive; start <= end.
Give at most {max_windows} windows."""

TIME_FORMATS = {"day": "YYYY-MM-DD", "minute": "YYYY-MM-DDTHH:MM"}


class TimelineEntryLike(Protocol):
    """What the prompt reads from a timeline entry (``tider.retrieval.timeline.TimelineEntry``)."""

    start: Any
    end: Any
    summary: str


def system_prompt(granularity: Granularity, max_windows: int = MAX_WINDOWS) -> str:
    return SYSTEM_PROMPT.replace("{time_format}", TIME_FORMATS[granularity]).replace(
        "{max_windows}", str(max_windows)
    )


def question_block(query: Query, granularity: Granularity) -> str:
    asked = format_time(query.asked_at, granularity)
    who = f" by {query.user}" if query.user else ""
    return f"Question: {query.text}\nAsked at: {asked}{who}"


def entry_line(entry: TimelineEntryLike, granularity: Granularity) -> str:
    summary = " ".join(str(entry.summary).split())  # one line per entry, whatever the summarizer wrote
    return f"[{format_time(entry.start, granularity)} .. {format_time(entry.end, granularity)}] {summary}"


def _render(query: Query, lines_in_time_order: Sequence[str], granularity: Granularity) -> str:
    timeline = "\n".join(lines_in_time_order) if lines_in_time_order else "(no timeline entries)"
    return f"{question_block(query, granularity)}\nTimeline:\n{timeline}"


def _count_tokens(tokenizer, messages: list[dict]) -> int:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)
    return sum(len(tokenizer(m["content"])["input_ids"]) for m in messages)


def build_messages(
    query_public: Query,
    timeline_entries: Sequence[TimelineEntryLike],
    granularity: Granularity,
    tokenizer=None,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    top_k: int = DEFAULT_TOP_K,
) -> list[dict]:
    """The locator prompt as chat messages ``[system, user]``.

    ``timeline_entries`` must be ranked best first (``Timeline.top_k``). With a
    ``tokenizer``, entries are dropped from the bottom of the ranking until the rendered
    chat (with generation prompt) has at most ``max_prompt_tokens`` tokens.
    """
    if query_public.gold.answer is not None or query_public.gold.evidence_ids or query_public.gold.windows:
        raise ValueError(f"query {query_public.key!r}: build_messages takes query.public(), not a query with gold")
    ranked = list(timeline_entries)[:top_k]
    system = {"role": "system", "content": system_prompt(granularity)}

    def messages_for(n: int) -> list[dict]:
        kept = sorted(ranked[:n], key=lambda e: (e.start, e.end))
        return [system, {"role": "user", "content": _render(query_public, [entry_line(e, granularity) for e in kept], granularity)}]

    if tokenizer is None:
        return messages_for(len(ranked))
    # Estimate per-line costs once, then confirm with one exact count (BPE is near-additive
    # across newline boundaries, so at most a line or two more gets dropped).
    base = _count_tokens(tokenizer, messages_for(0))
    costs = [len(tokenizer("\n" + entry_line(e, granularity))["input_ids"]) for e in ranked]
    n, total = 0, base
    while n < len(ranked) and total + costs[n] <= max_prompt_tokens:
        total += costs[n]
        n += 1
    while n > 0 and _count_tokens(tokenizer, messages_for(n)) > max_prompt_tokens:
        n -= 1
    messages = messages_for(n)
    if n == 0 and _count_tokens(tokenizer, messages) > max_prompt_tokens:
        raise ValueError(
            f"query {query_public.key!r}: the locator prompt needs more than max_prompt_tokens={max_prompt_tokens} "
            "tokens even without timeline entries"
        )
    return messages

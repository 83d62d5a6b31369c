"""The locator's input and output (locator-v2), shared by training, local generation and
serving: ``locator_input`` builds the chat prompt *and* the table its answer refers to.

Input, question first (a causal model reads the lines knowing what is asked):

    Question: Which venue did we pick at the offsite last week?
    Asked at: 2023-05-10 by bob
    Cues:
    C1 "last week" = 2023-05-01 .. 2023-05-07
    Timeline:
    2023-04-26 | heidi: we picked lisbon as the venue at the offsite | L1
    2023-05-03 C1 | bob: we picked porto as the venue at the offsite | L2

- **Cues** are the question's time expressions resolved against ``asked_at`` by a date
  library (``tider.locator.rules``): time arithmetic is the library's job.
- **Lines** are timeline entries chosen for what the question's structure can need
  (``tider.locator.lines``), each shown as its best-matching message, in time order,
  marked ``C<j>`` when it overlaps cue j, and tagged ``L<k>`` *at the end*: a causal
  model can gather a line's content into its tag token, then copy the tag that follows a
  match (the measured layout, shared/notes/pointer-vs-dates.md).

Output (DESIGN decision 2, v2 windows): ``{"temporal": true, "windows": [...]}`` where a
window is ``{"entry": k}`` (line k's span), ``{"cue": j}`` (cue j's range) or explicit
``{"start", "end"}``; ``{"temporal": false, "windows": []}`` when no time constraint is
needed. Pointing is far easier to learn than spelling dates (0.36 vs 0.02 exact for a
from-scratch tiny model in the same minutes, same note) and cannot write a window that
spans the year by accident. With ``PromptSettings.marks`` a window may also be
``{"mark": "A+1"}``: the line carrying that anchor/recent mark, the same answer in every
prompt where ``{"entry": k}`` is whichever number that line has there.
``tider.locator.parse`` resolves references with the table.

``tider.locator.contract`` holds the version and the output schema; a locator-v1
checkpoint (dates only, K similarity-ranked lines) is refused there with a message naming
both versions: its prompt no longer exists here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from tider.locator.contract import MAX_WINDOWS, OUTPUT_SCHEMA, PROMPT_VERSION, output_schema
from tider.locator.lines import LineConfig, Selection, entry_scores, select_lines
from tider.types import Granularity, Query, Window, format_time

DEFAULT_MAX_PROMPT_TOKENS = 2048
MAX_WINDOWS = 8
LINE_WORDS = 12  # a line shows its best message clipped to this many words

SYSTEM_PROMPT = """You are a temporal window locator for a conversational memory.
You see a question, when it was asked, the time cues a date library resolved from it, and
numbered timeline lines from the memory in time order ("C1" on a line: it overlaps cue 1).
Answer with one JSON object and nothing else, pointing at the evidence:
{"temporal": true, "windows": [{"entry": <line number>}, {"cue": <cue number>}, {"start": "<time>", "end": "<time>"}]}
(any mix, at most {max_windows} windows, times as {time_format}), or, when the question
has no time constraint: {"temporal": false, "windows": []}"""

TIME_FORMATS = {"day": "YYYY-MM-DD", "minute": "YYYY-MM-DDTHH:MM"}


@dataclass(frozen=True)
class PromptSettings:
    """Everything that shapes the prompt; recorded with a checkpoint so serving rebuilds it."""

    lines: LineConfig = field(default_factory=LineConfig)
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    system_prompt: bool = True  # the instructions above; a from-scratch model learns the task without them
    # The v2 elements, each of which can be switched off (the learning benchmark's ablation):
    select: str = "structured"  # "structured" (tider.locator.lines) or "similarity" (v1: top lines by similarity)
    show_cues: bool = True  # resolved time cues in the prompt and as {"cue": j} targets
    pointers: bool = True  # lines tagged L<k> and answered by reference; False: answers spell dates
    # Also answer by a line's mark ({"mark": "A+1"}, "R"): the answer to "the review after
    # the reorg" is then the same token in every prompt, not the number of whichever line
    # carries A+1 (README, learning benchmark). Off in locator-v2 checkpoints made before it.
    marks: bool = False
    # Repeat the question after the timeline, next to the answer, so that a word the answer
    # hinges on ("before" / "after") is a few tokens back. Measured: it did not make the
    # answer follow that word (README ablation); an answer-only SFT phase did.
    repeat_question: bool = False

    def __post_init__(self) -> None:
        if self.select not in ("structured", "similarity"):
            raise ValueError(f"prompt select {self.select!r}: choose 'structured' or 'similarity'")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> PromptSettings:
        data = dict(data)
        return cls(lines=LineConfig(**data.pop("lines", {})), **data)


@dataclass(frozen=True)
class LocatorInput:
    """One prompt and the table its references resolve against (1-based)."""

    messages: list[dict]
    lines: tuple[Window, ...]
    cues: tuple[Window, ...]
    marks: tuple[tuple[str, int], ...] = ()  # (mark label, line number) a {"mark"} answer resolves with
    # The rendered public pieces (question block, cue lines, timeline lines): what the leak
    # validator accepts in the prompt besides the fixed template.
    parts: tuple[str, ...] = ()

    def schema(self) -> dict:
        return output_schema(len(self.lines), len(self.cues), [m for m, _ in self.marks])

    def refs_json(self, granularity: Granularity) -> str:
        """The table as a compact JSON string (a GRPO dataset column the rewards read)."""
        table = {
            "lines": [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in self.lines],
            "cues": [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in self.cues],
        }
        return json.dumps({**table, "marks": dict(self.marks)} if self.marks else table)


MARKS_NOTE = """
A window may also be {"mark": "<mark>"}: the line carrying that mark (A: the event the question
names, A-1 / A+1: the relevant line before / after it, R: the latest relevant line)."""
# The marks a {"mark"} answer may name: the anchor's and the latest relevant line's. A cue
# mark (C<j>) can sit on several lines; {"cue": j} already names the cue.
POINTER_MARK = re.compile(r"A([+-][0-9]+)?|R")


def system_prompt(granularity: Granularity, marks: bool = False) -> str:
    text = SYSTEM_PROMPT + (MARKS_NOTE if marks else "")
    return text.replace("{time_format}", TIME_FORMATS[granularity]).replace("{max_windows}", str(MAX_WINDOWS))


def question_block(query: Query, granularity: Granularity) -> str:
    asked = format_time(query.asked_at, granularity)
    who = f" by {query.user}" if query.user else ""
    return f"Question: {query.text}\nAsked at: {asked}{who}"


def _span(start, end, granularity: Granularity) -> str:
    s, e = format_time(start, granularity), format_time(end, granularity)
    return s if s == e else f"{s} .. {e}"


def cue_line(j: int, cue, granularity: Granularity) -> str:
    return f'C{j} "{cue.text}" = {_span(cue.window.start, cue.window.end, granularity)}'


def entry_line(k: int | None, entry, marks: Sequence[str], message, granularity: Granularity) -> str:
    """``<span> [marks] | <speaker>: <best message> | L<k>`` (no tag when ``k`` is None);
    marks: ``C<j>`` inside cue j, ``A`` / ``A-<n>`` / ``A+<n>`` the anchor and its n-th
    relevant neighbour before / after it, ``R`` the latest relevant line."""
    words = " ".join(str(message.text).split()).split(" ")
    text = " ".join(words[:LINE_WORDS]) + (" ..." if len(words) > LINE_WORDS else "")
    mark = "".join(f" {m}" for m in marks)
    tag = f" | L{k}" if k is not None else ""
    return f"{_span(entry.start, entry.end, granularity)}{mark} | {message.speaker}: {text}{tag}"


def _render(
    query: Query, cue_lines: list[str], lines: list[str], granularity: Granularity, repeat: bool = False
) -> str:
    cues = "\n".join(cue_lines) if cue_lines else "(none)"
    timeline = "\n".join(lines) if lines else "(no timeline entries)"
    again = f"\nQuestion: {query.text}" if repeat else ""
    return f"{question_block(query, granularity)}\nCues:\n{cues}\nTimeline:\n{timeline}{again}"


def _count_tokens(tokenizer, messages: list[dict]) -> int:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)
    return sum(len(tokenizer(m["content"])["input_ids"]) for m in messages)


def locator_input(
    query_public: Query,
    memory,
    timeline,
    cues: Sequence,
    granularity: Granularity,
    settings: PromptSettings = PromptSettings(),
    *,
    query_vector: np.ndarray | None = None,
    tokenizer=None,
) -> LocatorInput:
    """The v2 prompt for one query. ``timeline`` must already be the visible one
    (``Timeline.visible(asked_at)``) and ``cues`` the clipped ones (``rules.query_cues``).
    With a ``tokenizer``, the lowest-priority lines are dropped until the chat fits
    ``settings.max_prompt_tokens`` (TRL no longer truncates prompts, and a cut inside a
    line would hand the model a broken date)."""
    if query_public.gold.answer is not None or query_public.gold.evidence_ids or query_public.gold.windows:
        raise ValueError(f"query {query_public.key!r}: locator_input takes query.public(), not a query with gold")
    if timeline is None or not len(timeline):
        scores, best = np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
    else:
        if query_vector is None:
            query_vector = timeline.embedder.encode([query_public.text])[0]
        scores, best = entry_scores(timeline, timeline.embeddings @ np.asarray(query_vector, dtype=np.float32))
    cues = tuple(cues) if settings.show_cues else ()
    if not len(scores):
        selection = Selection()
    elif settings.select == "structured":
        selection = select_lines(query_public.text, timeline, scores, cues, settings.lines)
    else:  # v1: the most similar entries, no marks
        selection = Selection(
            [int(i) for i in np.lexsort((np.arange(len(scores)), -scores))[: settings.lines.max_lines]]
        )
    priority, marks = selection.picked, selection.marks
    head = [{"role": "system", "content": system_prompt(granularity, settings.marks)}] if settings.system_prompt else []
    cue_text = [cue_line(j, c, granularity) for j, c in enumerate(cues, start=1)]

    def build(n: int) -> LocatorInput:
        shown = sorted(priority[:n])
        text = [
            entry_line(
                k if settings.pointers else None, timeline.span(i), marks.get(i, ()), memory[int(best[i])], granularity
            )
            for k, i in enumerate(shown, start=1)
        ]
        messages = head + [
            {"role": "user", "content": _render(query_public, cue_text, text, granularity, settings.repeat_question)}
        ]
        lines = tuple(timeline.span(i) for i in shown) if settings.pointers else ()
        refs = (
            tuple((m, k) for k, i in enumerate(shown, start=1) for m in marks.get(i, ()) if POINTER_MARK.fullmatch(m))
            if settings.pointers and settings.marks
            else ()
        )
        parts = (question_block(query_public, granularity), *cue_text, *text)
        return LocatorInput(messages, lines, tuple(c.window for c in cues) if settings.pointers else (), refs, parts)

    n = len(priority)
    if tokenizer is not None:
        while n > 0 and _count_tokens(tokenizer, build(n).messages) > settings.max_prompt_tokens:
            n -= 1
        if n == 0 and _count_tokens(tokenizer, build(0).messages) > settings.max_prompt_tokens:
            raise ValueError(
                f"query {query_public.key!r}: the locator prompt needs more than "
                f"max_prompt_tokens={settings.max_prompt_tokens} tokens even without timeline lines"
            )
    return build(n)


def prompt_hash(granularity: Granularity) -> str:
    """Short hash of the system prompt + schema + version, for run manifests."""
    blob = system_prompt(granularity) + repr(sorted(OUTPUT_SCHEMA.items())) + PROMPT_VERSION
    return hashlib.sha256(blob.encode()).hexdigest()[:12]

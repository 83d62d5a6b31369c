"""The locator's input and output (locator-v3), shared by training, local generation and
serving: ``locator_input`` builds the chat prompt *and* the table its answer refers to.

Input, question first (a causal model reads the lines knowing what is asked):

    Question: Which venue did we pick at the offsite last week?
    Asked at: 2023-05-10 by bob
    Cues:
    C1 "last week" = 2023-05-01 .. 2023-05-07
    Timeline:
    2023-04-26 H2 | h3/9 | heidi: we picked lisbon as the venue at the offsite | L1
    2023-05-03 C1 H1 | h6/12 | bob: we picked porto as the venue at the offsite | L2

- **Cues** are the question's time expressions resolved against ``asked_at`` by a date
  library (``tider.locator.rules``): time arithmetic is the library's job.
- **Lines** are timeline entries chosen for what the question's structure can need
  (``tider.locator.lines``), each shown as its best-matching message, in time order,
  tagged ``L<k>`` *at the end*: a causal model can gather a line's content into its tag
  token, then copy the tag that follows a match (docs/experiments.md, "pointing vs dates").
  Marks: ``C<j>`` (overlaps cue j), ``A`` / ``A-1`` / ``A+1`` (the event the question names
  and its relevant neighbours), ``R`` (the latest relevant line), ``H1``, ``H2``... (the
  lines holding the semantic channel's best hits, in order), ``T`` (the line reaches the
  day the question is asked).
- **What retrieval sees** (retrieve, then localize): ``h<n>/<m>`` says that ``n`` of the
  semantic channel's top 50 messages lie in the line's span (whole days, as a window on the
  line would be), which holds ``m`` messages the question may see. Choosing a line then
  reads evidence the retriever already has, and needs little English: on real
  conversations a question rarely names its time.

Output (docs/design.md, decision 2): ``{"temporal": true, "windows": [...]}`` where a
window is ``{"mark": "H1"}`` (the line carrying that mark), ``{"entry": k}`` (line k's
span), ``{"cue": j}`` (cue j's range) or explicit ``{"start", "end"}``;
``{"temporal": false, "windows": []}`` when no window would help: then the query takes
the semantic channel alone. Pointing is far easier to learn than spelling dates, and a
mark is the same answer in every prompt where ``{"entry": k}`` is whichever number that
line has there (docs/experiments.md). ``tider.locator.parse`` resolves references with
the table.

``tider.locator.contract`` holds the version and the output schema; a checkpoint of an
earlier prompt version is refused there with a message naming both versions.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from tider.data.gold import unit_window
from tider.locator.contract import MAX_WINDOWS, OPTIONS_DEFAULT, OUTPUT_SCHEMA, PROMPT_VERSION, output_schema
from tider.locator.lines import LineConfig, entry_scores, select_lines
from tider.locator.options import learning_free_options, option_lines
from tider.types import Granularity, Query, Window, format_time

LINE_WORDS = 12  # a line shows its best message clipped to this many words

SYSTEM_PROMPT = """You are a temporal window locator for a conversational memory.
You see a question, when it was asked, the time cues a date library resolved from it, and
numbered timeline lines from the memory in time order. Marks on a line: C1 (it overlaps cue 1),
A (the event the question names), A-1 / A+1 (the relevant line before / after it), R (the latest
relevant line), H1, H2... (the lines holding the best search hits, in order), T (the line reaches
the day the question is asked); "h3/9": 3 of the top 50 search hits lie in the line's span, which
holds 9 messages. Answer with one JSON object and nothing else, pointing at the evidence:
{"temporal": true, "windows": [{"mark": "<mark>"}, {"entry": <line number>}, {"cue": <cue number>},
{"start": "<time>", "end": "<time>"}]} (any mix, at most {max_windows} windows, times as
{time_format}), or, when no window would help:
{"temporal": false, "windows": []}"""

OPTIONS_PROMPT = """
Options O1.. are what learning-free rules answer for this question ({"option": <option number>}
answers exactly that): O1 rules (the question's time expressions, a day of padding), O2 top-days
(the first three days the search hits), O3..O5 each of those days alone."""

TIME_FORMATS = {"day": "YYYY-MM-DD", "minute": "YYYY-MM-DDTHH:MM"}
# The marks a {"mark"} answer may name. A cue mark (C<j>) can sit on several lines;
# {"cue": j} already names the cue. T is a fact about a line, not a name for one.
POINTER_MARK = re.compile(r"A([+-][0-9]+)?|R|H[0-9]+")

# Prompt settings of earlier versions that no longer exist, with the value every shipped
# checkpoint had: metadata holding that value still reads; another value cannot be rebuilt.
REMOVED_SETTINGS = {
    "select": "structured",
    "show_cues": True,
    "pointers": True,
    "repeat_question": False,
    "marks": True,
}
LAST_COMMIT_WITH_REMOVED_SETTINGS = "fa11d15"


@dataclass(frozen=True)
class PromptSettings:
    """Everything that shapes the prompt; recorded with a checkpoint so serving rebuilds it.
    Defaults are the production recipe's (``configs/*/qwen3-1.7b.yaml``)."""

    lines: LineConfig = field(default_factory=LineConfig)
    max_prompt_tokens: int = 3584
    system_prompt: bool = True  # the instructions above; a from-scratch model learns the task without them
    question_words: int = 64  # the question is clipped to this many words; the lines carry the signal
    options: bool = OPTIONS_DEFAULT  # list the learning-free answers as options O1.. (tider.locator.options)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> PromptSettings:
        data = dict(data)
        for name, shipped in REMOVED_SETTINGS.items():
            if name in data and data.pop(name) != shipped:
                raise ValueError(
                    f"prompt setting {name!r} was removed (its value here cannot be rebuilt); commit "
                    f"{LAST_COMMIT_WITH_REMOVED_SETTINGS} is the last that supports it"
                )
        data.setdefault("options", False)  # recorded before options existed: a prompt without them
        return cls(lines=LineConfig(**data.pop("lines", {})), **data)


@dataclass(frozen=True)
class LocatorInput:
    """One prompt and the table its references resolve against (1-based)."""

    messages: list[dict]
    lines: tuple[Window, ...]
    cues: tuple[Window, ...]
    marks: tuple[tuple[str, int], ...] = ()  # (mark label, line number) a {"mark"} answer resolves with
    options: tuple[tuple[Window, ...], ...] = ()  # option n's windows at n-1 (empty: not offered); () if unlisted
    # The rendered public pieces (question block, cue lines, timeline lines): what the leak
    # validator accepts in the prompt besides the fixed template.
    parts: tuple[str, ...] = ()

    def schema(self) -> dict:
        return output_schema(len(self.lines), len(self.cues), [m for m, _ in self.marks], bool(self.options))

    def refs_json(self, granularity: Granularity) -> str:
        """The table as a compact JSON string (a GRPO dataset column the rewards read). An
        option's windows are exact, to the microsecond, with their cores (``[start, end]``
        or ``[start, end, core start, core end]``): an option answers what its rule does."""

        def exact(w: Window) -> list[str]:
            return [t.isoformat() for t in (w.start, w.end, *((w.core.start, w.core.end) if w.core else ()))]

        table = {
            "lines": [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in self.lines],
            "cues": [[format_time(w.start, granularity), format_time(w.end, granularity)] for w in self.cues],
        }
        options = [[exact(w) for w in windows] for windows in self.options]
        return json.dumps({**table, "marks": dict(self.marks), "options": options})


def system_prompt(granularity: Granularity, options: bool = False) -> str:
    text = SYSTEM_PROMPT.replace("{time_format}", TIME_FORMATS[granularity]).replace("{max_windows}", str(MAX_WINDOWS))
    return text + OPTIONS_PROMPT if options else text


def clip_words(text: str, n: int) -> str:
    words = str(text).split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def question_block(query: Query, granularity: Granularity, words: int = 64) -> str:
    asked = format_time(query.asked_at, granularity)
    who = f" by {query.user}" if query.user else ""
    return f"Question: {clip_words(query.text, words)}\nAsked at: {asked}{who}"


def _span(start, end, granularity: Granularity) -> str:
    s, e = format_time(start, granularity), format_time(end, granularity)
    return s if s == e else f"{s} .. {e}"


def cue_line(j: int, cue, granularity: Granularity) -> str:
    return f'C{j} "{cue.text}" = {_span(cue.window.start, cue.window.end, granularity)}'


@dataclass(frozen=True)
class LineFacts:
    """What one line shows: its span, marks, what retrieval sees in it, its best message."""

    span: Window
    marks: tuple[str, ...]
    hits: int
    size: int
    message: object


def entry_line(k: int, facts: LineFacts, granularity: Granularity) -> str:
    """``<span> [marks] | h<hits>/<size> | <speaker>: <best message> | L<k>``."""
    mark = "".join(f" {m}" for m in facts.marks)
    text = clip_words(facts.message.text, LINE_WORDS)
    return (
        f"{_span(facts.span.start, facts.span.end, granularity)}{mark} | h{facts.hits}/{facts.size} | "
        f"{facts.message.speaker}: {text} | L{k}"
    )


def render(
    query: Query, cue_lines: list[str], lines: list[str], granularity: Granularity, words: int, options=None
) -> str:
    """The user message; ``options``: the option lines (None: a prompt without them)."""
    cues = "\n".join(cue_lines) if cue_lines else "(none)"
    timeline = "\n".join(lines) if lines else "(no timeline entries)"
    listed = "" if options is None else "\nOptions:\n" + ("\n".join(options) if options else "(none)")
    return f"{question_block(query, granularity, words)}\nCues:\n{cues}{listed}\nTimeline:\n{timeline}"


def count_tokens(tokenizer, messages: list[dict]) -> int:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)
    return sum(len(tokenizer(m["content"])["input_ids"]) for m in messages)


def line_facts(query: Query, store, cues: Sequence, settings: PromptSettings, query_vector=None):
    """``(priority, facts)``: the visible timeline's entries to show, most needed first, and
    what each shows (``LineFacts`` by entry index)."""
    memory = store.messages(query.memory_key)
    timeline = store.timeline(query.memory_key).visible(query.asked_at)
    if timeline is None or not len(timeline):
        return [], {}
    if query_vector is None:
        query_vector = timeline.embedder.encode([query.text])[0]
    scores, best = entry_scores(timeline, timeline.embeddings @ np.asarray(query_vector, dtype=np.float32))
    ranked = store.ranking(query).ids[: settings.lines.hit_depth]
    starts = np.asarray(timeline.starts, dtype=np.int64)
    ranked = ranked[ranked < timeline.end]
    hit_entries = [int(j) for j in np.searchsorted(starts, ranked, side="right") - 1]
    selection = select_lines(query.text, timeline, scores, cues, settings.lines, hits=hit_entries)
    asked_day = query.asked_at.date()
    facts = {}
    for j in selection.picked:
        span = timeline.span(j)
        lo, hi = memory.id_range(unit_window(span.start, span.end, memory.granularity))  # what a window on it holds
        hi = min(hi, timeline.end)
        marks = tuple(selection.marks.get(j, ())) + (("T",) if span.end.date() >= asked_day else ())
        hits = int(((ranked >= lo) & (ranked < hi)).sum())
        facts[j] = LineFacts(span, marks, hits, max(hi - lo, 0), memory[int(best[j])])
    return selection.picked, facts


def locator_input(
    query_public: Query,
    store,
    cues: Sequence,
    settings: PromptSettings = PromptSettings(),
    *,
    query_vector: np.ndarray | None = None,
    tokenizer=None,
) -> LocatorInput:
    """The prompt for one query over the memory it names in ``store`` (a
    ``tider.memory.store.MemoryStore``), with its clipped time ``cues``
    (``rules.query_cues``). With a ``tokenizer``, the lowest-priority lines are dropped
    until the chat fits ``settings.max_prompt_tokens`` (TRL no longer truncates prompts,
    and a cut inside a line would hand the model a broken date)."""
    if query_public.gold.answer is not None or query_public.gold.evidence_ids or query_public.gold.windows:
        raise ValueError(f"query {query_public.key!r}: locator_input takes query.public(), not a query with gold")
    granularity = store.messages(query_public.memory_key).granularity
    priority, facts = line_facts(query_public, store, cues, settings, query_vector)
    head = (
        [{"role": "system", "content": system_prompt(granularity, settings.options)}] if settings.system_prompt else []
    )
    cue_text = [cue_line(j, c, granularity) for j, c in enumerate(cues, start=1)]
    options = learning_free_options(query_public, store, cues) if settings.options else ()
    option_text = option_lines(options, granularity) if settings.options else None

    def build(n: int) -> LocatorInput:
        shown = sorted(priority[:n])
        text = [entry_line(k, facts[i], granularity) for k, i in enumerate(shown, start=1)]
        user = render(query_public, cue_text, text, granularity, settings.question_words, option_text)
        refs = tuple((m, k) for k, i in enumerate(shown, start=1) for m in facts[i].marks if POINTER_MARK.fullmatch(m))
        parts = (
            question_block(query_public, granularity, settings.question_words),
            *cue_text,
            *(option_text or ()),
            *text,
        )
        return LocatorInput(
            head + [{"role": "user", "content": user}],
            tuple(facts[i].span for i in shown),
            tuple(c.window for c in cues),
            refs,
            options=options,
            parts=parts,
        )

    if tokenizer is None:
        return build(len(priority))
    n = fitting_lines(lambda m: count_tokens(tokenizer, build(m).messages), len(priority), settings.max_prompt_tokens)
    if n < 0:
        raise ValueError(
            f"query {query_public.key!r}: the locator prompt needs more than "
            f"max_prompt_tokens={settings.max_prompt_tokens} tokens even without timeline lines"
        )
    return build(n)


def fitting_lines(cost, most: int, budget: int) -> int:
    """The largest ``n <= most`` with ``cost(n) <= budget`` (cost grows with n), or -1.
    A binary search: tokenizing a chat is the slow part of building prompts."""
    if cost(most) <= budget:
        return most
    if cost(0) > budget:
        return -1
    lo, hi = 0, most  # cost(lo) fits, cost(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo


def prompt_hash(granularity: Granularity) -> str:
    """Short hash of the system prompt + schema + version, for run manifests."""
    blob = system_prompt(granularity) + repr(sorted(OUTPUT_SCHEMA.items())) + PROMPT_VERSION
    return hashlib.sha256(blob.encode()).hexdigest()[:12]

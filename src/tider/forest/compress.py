"""Span compression of an evidence forest to a token budget B (T-Mem Eq. 6-7).

Each node's text is split into spans (sentences, then clauses at ``;``/``,`` when long).
A span s of node v with parent p scores

    G(s|p) = sum_{u in U(s) & U(q)} idf(u) + sum_{u in U(s) - U(p)} idf(u),   g = G / len(s)

(a root has no parent text, so all its units are novel). Protected spans are never
omitted: those containing a query entity (a capitalised query word or a query number),
a timestamp/date word, a number, or, on an UPDATE edge, a state-change cue. Unprotected
spans are omitted in ascending g, leaves first and then the parents they expose, until
the retained span tokens sum to at most B; a node's last remaining span is never
omitted, so every node keeps its metadata, relation and >= 1 span. When the mandatory
spans alone exceed B, the result says ``over_budget`` instead of breaking an invariant.

``compress_forest`` bounds the span tokens (the sum in the paper's budget condition) by
the budget it is given, not the per-node metadata the linearizer adds. The QA pipeline
(``tider.eval.qa``) makes B cover the whole serialized forest: it passes B minus the
metadata tokens and tightens that span budget until the linearized text fits B.
``truncate_to_budget`` is the "w/o compression" ablation: plain truncation of the
serialized context.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tider.forest.lexical import IDF, STOPWORDS, units
from tider.forest.structure import STATE_CHANGE_CUES, Forest
from tider.text import words

TokenCounter = Callable[[str], int]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CLAUSE = re.compile(r"(?<=[;,])\s+")
_DIGIT = re.compile(r"\d")
_TIME_WORDS = frozenset(
    [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "today",
        "yesterday",
        "tomorrow",
        "tonight",
        "week",
        "weekend",
        "month",
        "year",
        "ago",
        "last",
        "next",
        "morning",
        "evening",
        "night",
        "noon",
    ]
)


def whitespace_tokens(text: str) -> int:
    return len(text.split())


def hf_token_counter(tokenizer_path: str) -> TokenCounter:
    """Token counter of a Hugging Face tokenizer (the reader's, by default)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def split_spans(text: str, max_words: int = 25) -> list[str]:
    spans = []
    for sentence in _SENTENCE.split(text.strip()):
        if not sentence:
            continue
        if len(sentence.split()) > max_words:
            spans.extend(p for p in _CLAUSE.split(sentence) if p)
        else:
            spans.append(sentence)
    return spans or [text]


def query_entities(question: str) -> set[str]:
    """Capitalised words after the first (names, places) and numbers of the question, as
    lexical units (so they match ``units`` of a span)."""
    found = words(question, lower=False)
    caps = {w.lower() for w in found[1:] if w[0].isupper()}
    return (caps | {w for w in found if w.isdigit()}) - STOPWORDS


@dataclass
class Span:
    node: int
    index: int
    text: str
    tokens: int
    score: float
    protected: bool
    kept: bool = True


@dataclass
class Compression:
    spans: dict[int, list[Span]]
    budget: int
    over_budget: bool = False
    omitted: int = 0

    def retained_tokens(self) -> int:
        return sum(s.tokens for node in self.spans.values() for s in node if s.kept)

    def text_of(self, node: int) -> str:
        """Kept spans in order; ``[...]`` marks where spans were omitted."""
        parts, gap = [], False
        for s in self.spans[node]:
            if s.kept:
                if gap and parts:
                    parts.append("[...]")
                parts.append(s.text)
                gap = False
            else:
                gap = True
        return " ".join(parts)

    def to_json(self) -> dict:
        return {
            "budget": self.budget,
            "over_budget": self.over_budget,
            "omitted": self.omitted,
            "retained_tokens": self.retained_tokens(),
            "kept": {str(n): [s.kept for s in spans] for n, spans in self.spans.items()},
        }


def _is_protected(text: str, entities: set[str], update_edge: bool) -> bool:
    u = units(text)
    if u & entities or _DIGIT.search(text) or u & _TIME_WORDS:
        return True
    return update_edge and bool(u & STATE_CHANGE_CUES)


def _heights(forest: Forest) -> dict[int, int]:
    """0 for leaves, 1 + max child height otherwise (leaves compress first)."""
    heights: dict[int, int] = {}

    def height(n: int) -> int:
        if n not in heights:
            heights[n] = 1 + max((height(c) for c in forest.children(n)), default=-1)
        return heights[n]

    for n in forest.messages:
        height(n)
    return heights


def score_spans(forest: Forest, question: str, idf: IDF, count_tokens: TokenCounter) -> dict[int, list[Span]]:
    q_units, entities = units(question), query_entities(question)
    out: dict[int, list[Span]] = {}
    for node, message in forest.messages.items():
        parent = forest.parent.get(node)
        p_units = units(forest.messages[parent].text) if parent is not None else set()
        update_edge = forest.relation.get(node) == "UPDATE"
        spans = []
        for i, text in enumerate(split_spans(message.text)):
            u = units(text)
            gain = sum(idf(x) for x in u & q_units) + sum(idf(x) for x in u - p_units)
            tokens = max(1, count_tokens(text))
            spans.append(Span(node, i, text, tokens, gain / tokens, _is_protected(text, entities, update_edge)))
        out[node] = spans
    return out


def compress_forest(
    forest: Forest, question: str, idf: IDF, budget: int, count_tokens: TokenCounter | None = None
) -> Compression:
    spans = score_spans(forest, question, idf, count_tokens or whitespace_tokens)
    result = Compression(spans, budget)
    total = result.retained_tokens()
    if total <= budget:
        return result
    heights = _heights(forest)
    for level in sorted(set(heights.values())):
        # Ascending g within the level; ties: later spans first, then higher node id.
        candidates = sorted(
            (s for n, h in heights.items() if h == level for s in spans[n] if not s.protected),
            key=lambda s: (s.score, -s.index, -s.node),
        )
        for s in candidates:
            if total <= budget:
                return result
            if sum(x.kept for x in spans[s.node]) <= 1:
                continue  # every node keeps at least one span
            s.kept = False
            total -= s.tokens
            result.omitted += 1
    result.over_budget = total > budget
    return result


def truncate_to_budget(text: str, budget: int, count_tokens: TokenCounter | None = None) -> str:
    """The "w/o compression" ablation: cut the serialized context at B tokens (by
    whole lines, then words, so the cut never splits a token)."""
    count = count_tokens or whitespace_tokens
    if count(text) <= budget:
        return text
    kept: list[str] = []
    used = 0
    for line in text.splitlines():
        n = count(line)
        if used + n <= budget:
            kept.append(line)
            used += n
            continue
        words = []
        for w in line.split():
            if count(" ".join(words + [w])) + used > budget:
                break
            words.append(w)
        if words:
            kept.append(" ".join(words))
        break
    return "\n".join(kept)

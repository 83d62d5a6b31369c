"""Gold-leakage validator: gold answers and gold evidence must not reach any inference
prompt except through retrieval.

What is checked, for every LLM prompt a run sends (selection, structuring, answer; and
the locator's prompt when a run hands it over):

1. *Instruction parts carry no gold.* The prompt minus its allowed parts (the public
   question text, the asking user, and the context block built from retrieved messages)
   must not contain the gold answer or any gold evidence message text. The gold answer
   matches as a normalised whole-word phrase; answers that cannot be told apart from
   ordinary prompt text are skipped (fewer than 2 letters/digits after normalising, a
   bare yes/no/true/false, or a phrase the fixed template itself contains) so that
   short answers like "yes" or "3" do not make the check noisy. Gold evidence text
   counts when it has at least ``min_evidence_chars`` characters.
2. *Context provenance.* The message ids rendered into a context must be a subset of
   the ids the retrieval/selection stages produced for that query (from the public
   query only). A context fed from gold evidence ids fails here even though gold
   evidence text legitimately appears in retrieved context.

Gold evidence text inside the retrieved context is *not* a leak: finding it is the job.
A run collects ``Leak`` records and fails (``GoldLeakError``) if there is any.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from tider.scoring import normalize_answer
from tider.types import Gold, Memory, Query

UNCHECKABLE_ANSWERS = frozenset({"yes", "no", "true", "false", "none", "not", "ok"})


class GoldLeakError(RuntimeError):
    pass


@dataclass
class Leak:
    query_key: str
    stage: str
    kind: str  # gold_answer_in_prompt | gold_evidence_in_prompt | context_not_from_retrieval
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


def _prompt_text(messages: Sequence[dict]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


def _contains_phrase(haystack_norm: str, phrase_norm: str) -> bool:
    return bool(re.search(rf"(?<!\w){re.escape(phrase_norm)}(?!\w)", haystack_norm))


def checkable_answer(answer: str | None, template_text: str = "") -> str | None:
    """The normalised gold answer if it can be checked reliably, else None."""
    if answer is None:
        return None
    norm = normalize_answer(answer)
    if sum(ch.isalnum() for ch in norm) < 2 or norm in UNCHECKABLE_ANSWERS:
        return None
    if template_text and _contains_phrase(normalize_answer(template_text), norm):
        return None
    return norm


class LeakageValidator:
    def __init__(self, memories: dict[str, Memory], min_evidence_chars: int = 20):
        self.memories = memories
        self.min_evidence_chars = min_evidence_chars
        self.leaks: list[Leak] = []
        self.checked = 0

    def check_prompt(
        self,
        query: Query,
        stage: str,
        messages: Sequence[dict],
        *,
        allowed_parts: Iterable[str] = (),
        context_ids: Sequence[int] = (),
        produced_ids: Iterable[int] | None = None,
        template_text: str = "",
    ) -> list[Leak]:
        """``query`` is the full query (with gold); ``allowed_parts`` are the strings the
        prompt may legitimately carry (context block); the public question and asking user
        are always allowed. ``produced_ids`` are the ids retrieval/selection returned."""
        self.checked += 1
        gold: Gold = query.gold
        remainder = _prompt_text(messages)
        for part in sorted({query.text, query.user or "", *allowed_parts}, key=len, reverse=True):
            if part:
                remainder = remainder.replace(part, " ")
        remainder_norm = normalize_answer(remainder)
        found: list[Leak] = []
        answer = checkable_answer(gold.answer, template_text)
        if answer and _contains_phrase(remainder_norm, answer):
            found.append(Leak(query.key, stage, "gold_answer_in_prompt", f"gold answer {gold.answer!r}"))
        memory = self.memories.get(query.memory_key)
        if memory is not None:
            for i in gold.evidence_ids:
                text = memory[i].text if 0 <= i < len(memory) else ""
                if len(text) >= self.min_evidence_chars and text in remainder:
                    found.append(Leak(query.key, stage, "gold_evidence_in_prompt", f"evidence message {i}"))
        if produced_ids is not None:
            stray = sorted(set(context_ids) - set(produced_ids))
            if stray:
                found.append(Leak(query.key, stage, "context_not_from_retrieval", f"ids {stray[:10]}"))
        self.leaks.extend(found)
        return found

    def raise_if_leaks(self) -> None:
        if self.leaks:
            first = self.leaks[0]
            raise GoldLeakError(
                f"{len(self.leaks)} gold leak(s) in prompts; first: query {first.query_key} "
                f"stage {first.stage}: {first.kind} ({first.detail})"
            )

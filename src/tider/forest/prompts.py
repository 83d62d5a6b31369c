"""Prompts of the forest back end, transcribed from T-Mem App. I (answer, judge),
App. J (evidence utility selection) and App. K (temporal memory structuring), with the
JSON schemas we request through structured output.

Message ids in prompts are ``Msg_<id>`` (``id`` = position in the time-sorted memory),
as in the paper's output examples.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from tider.types import Granularity, Message, format_time

MSG_ID = re.compile(r"^\s*Msg_(\d+)\s*$")


def msg_id(message_id: int) -> str:
    return f"Msg_{message_id}"


def parse_msg_id(value) -> int | None:
    """``"Msg_12"`` or ``12`` -> 12; anything else -> None (model output is untrusted)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = MSG_ID.match(str(value))
    return int(match.group(1)) if match else None


def render_message(m: Message, granularity: Granularity) -> str:
    meta = [f"time={format_time(m.timestamp, granularity)}", f"author={m.speaker}"]
    for name in ("channel", "topic", "phase", "stage", "role"):
        value = getattr(m, name)
        if value is not None:
            meta.append(f"{name}={value}")
    return f"[{msg_id(m.id)}] ({', '.join(meta)}) {m.text}"


def question_head(question: str, asking_user: str | None) -> str:
    """The lines every forest prompt opens with: who asks, and what."""
    return f"Asking user: {asking_user or 'unknown'}\nQuestion: {question}\n"


def prompt_hash(*parts: str) -> str:
    return hashlib.sha256("\n\x00".join(parts).encode()).hexdigest()[:16]


# ----------------------------------------------------------------- App. J: selection
SELECTION_SYSTEM = """Strict query-conditioned evidence selection inside a topic-time window.
Inputs
1. One user question.
2. Candidate messages drawn from one topic-time window after embedding preselection.
Select only
1. KEY: Messages that directly state an answer-bearing fact or make a decisive contribution to the answer.
2. SUPPORT: For current decisions or states, prefer the newest applicable adopted change and retain necessary scope, \
condition, exception, owner, deadline, or implementation status.
Reject
1. IRRELEVANT: Topic similarity, shared entities, generic background, motivation, examples, and messages that merely \
help locate another message.
2. IRRELEVANT: Replaced decisions, abandoned intermediate states, and unadopted proposals when the question asks for \
the operative state.
3. Weak or speculative evidence; an empty selection is preferable.
Hard constraints
1. Use only the supplied question and messages; do not access the gold answer or outside history.
2. Do not answer the question and do not return labels for rejected messages.
Required output
{"selected": [{"message_id": "Msg_123", "label": "KEY", "reason": "Exact answer-bearing fact."}]}"""

SELECTION_SCHEMA = {
    "type": "object",
    "properties": {
        "selected": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "message_id": {"type": "string"},
                    "label": {"type": "string", "enum": ["KEY", "SUPPORT"]},
                    "reason": {"type": "string"},
                },
                "required": ["message_id", "label"],
            },
        }
    },
    "required": ["selected"],
}


def selection_messages(
    question: str, asking_user: str | None, window_text: str, candidates: Sequence[Message], granularity: Granularity
) -> list[dict]:
    lines = "\n".join(render_message(m, granularity) for m in candidates)
    user = f"{question_head(question, asking_user)}Topic-time window: {window_text}\nCandidate messages:\n{lines}"
    return [{"role": "system", "content": SELECTION_SYSTEM}, {"role": "user", "content": user}]


# --------------------------------------------------------------- App. K: structuring
STRUCTURING_SYSTEM = """Query-conditioned direct-parent selection with deterministic temporal-order gates.
Task
1. For each later child, select at most one earlier direct parent or Root; evaluate e_ij = r(q, earlier message, \
later message).
2. The question narrows relevance but cannot manufacture a relation that is not explicit between the two messages.
Absolute direct-relation gate
1. Require the same concrete object, direct continuation, no hidden bridge, and counterfactual dependence.
2. Choose Root when all candidates are connected only by topic, chronology, shared vocabulary, broad relevance, or an \
unstated intermediate event.
Relation labels
1. Update: a direct state transition of the same decision, plan, owner, deadline, threshold, scope, implementation \
status, validation result, or operative rule.
2. Expand: a direct answer, confirmation, rejection, explanation, evidence, clarification, or implementation detail \
for the parent's concrete state.
3. Root/None: no justified direct semantic parent.
Hard ordering constraints
1. Parent timestamp must be earlier; stage and phase_order must be nondecreasing; within the same stage and phase, \
phase_progress must be nondecreasing.
2. Cross-phase edges remain eligible only when all ordering gates and the direct-continuity test hold.
The candidate parents below already satisfy the ordering gates. Label every candidate and give your confidence in [0, \
1].
Required output
{"choices": [{"child_id": "Msg_2", "parent_id": "Msg_1", "relation": "UPDATE|EXPAND|NONE", "confidence": 0.9}]}"""

RELATIONS = ("UPDATE", "EXPAND", "ROOT")

STRUCTURING_SCHEMA = {
    "type": "object",
    "properties": {
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "child_id": {"type": "string"},
                    "parent_id": {"type": "string"},
                    "relation": {"type": "string", "enum": ["UPDATE", "EXPAND", "NONE", "ROOT"]},
                    "confidence": {"type": "number"},
                },
                "required": ["parent_id", "relation", "confidence"],
            },
        }
    },
    "required": ["choices"],
}


def structuring_messages(
    question: str, asking_user: str | None, child: Message, candidates: Sequence[Message], granularity: Granularity
) -> list[dict]:
    parents = "\n".join(render_message(m, granularity) for m in candidates)
    user = (
        f"{question_head(question, asking_user)}Later child message:\n{render_message(child, granularity)}\n"
        f"Earlier candidate parents:\n{parents}"
    )
    return [{"role": "system", "content": STRUCTURING_SYSTEM}, {"role": "user", "content": user}]


# ------------------------------------------------------------------ App. I: answer
_READER_RULES = (
    "Treat the message content as the sole factual source. Do not invent facts, do not expose hidden reasoning, "
    "and do not mention the prompt, retrieval, or judging process. Return only a direct, concise answer."
)
READER_SYSTEM_FLAT = "You answer questions using only the supplied retrieved messages. " + _READER_RULES
READER_SYSTEM_FOREST = (
    "You answer questions using only the supplied retrieved messages.\n"
    "The messages are organized into event-evolution trees and serialized in preorder:\n"
    "- Each TREE represents a separate event progression.\n"
    "- Indentation indicates parent-child depth.\n"
    "- ROOT begins an event progression.\n"
    "- UPDATE marks a change to the parent state.\n"
    "- EXPAND adds support or clarification without replacing the parent state.\n"
    "- Use timestamps and these relations to reconstruct the relevant progression, following UPDATE chains to "
    "identify the current or final state.\n" + _READER_RULES
)
READER_SYSTEM = {"flat": READER_SYSTEM_FLAT, "forest": READER_SYSTEM_FOREST}


def reader_user_prompt(question: str, asking_user: str | None) -> tuple[str, str]:
    """(head, tail) of the shared user template; the context goes between them. Kept
    apart so the leakage validator can check the instruction parts on their own."""
    head = f"{question_head(question, asking_user)}Retrieved conversation passages:\n"
    tail = "\nAnswer the question using only the retrieved conversation passages above."
    return head, tail


def reader_messages(context_kind: str, question: str, asking_user: str | None, context: str) -> list[dict]:
    if context_kind not in READER_SYSTEM:
        raise ValueError(f"unknown context kind {context_kind!r}; known: {', '.join(READER_SYSTEM)}")
    head, tail = reader_user_prompt(question, asking_user)
    return [
        {"role": "system", "content": READER_SYSTEM[context_kind]},
        {"role": "user", "content": head + context + tail},
    ]


JUDGE_SYSTEM = (
    "Judge whether the agent answer is semantically consistent with the gold answer, accepting meaning-equivalent "
    "paraphrases. Output only Final: Correct or Final: Incorrect."
)
_VERDICT = re.compile(r"Final:\s*(Correct|Incorrect)", re.IGNORECASE)


def judge_messages(question: str, gold_answer: str, agent_answer: str) -> list[dict]:
    user = f"Question: {question} | Gold Answer: {gold_answer} | Agent Answer: {agent_answer}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool | None:
    """True / False from the last ``Final: Correct|Incorrect``; None when absent (a typed
    parse failure the report counts)."""
    found = _VERDICT.findall(text or "")
    return found[-1].lower() == "correct" if found else None

"""Temporal memory structuring (T-Mem Sec. 4.3, prompt App. K).

R'(q) is ordered by time; each message's eligible parents are earlier (strictly), share
its topic, and do not come later in the (stage, phase order, phase progress) order
(Eq. 4). A relation classifier scores every eligible (parent, child) pair with UPDATE /
EXPAND / ROOT and a confidence; the highest-confidence non-ROOT parent wins, else the
child starts a tree. Whatever a classifier says, a parent outside the eligible set is
ignored, so the single-parent / earlier / same-topic / stage-order invariants hold by
construction, even for garbage model output.

Classifiers (``make_classifier``): ``llm`` (the App. K prompt through an LLMClient) and
``lexical`` (a documented word-overlap heuristic, reported under its own name; never a
silent substitute for the LLM).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tider.forest.lexical import units
from tider.forest.prompts import STRUCTURING_SCHEMA, parse_msg_id, structuring_messages
from tider.types import Granularity, Message

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def order_key(m: Message) -> tuple[float, float, float]:
    """O_i = (stage, phase_order, phase_progress). ``phase`` may be ``"ORDER"`` or
    ``"ORDER/PROGRESS"`` (numbers); a missing or non-numeric part counts as 0, so data
    without stages (LoCoMo) puts no constraint beyond time and topic."""
    numbers = [float(x) for x in _NUMBER.findall(m.phase or "")][:2]
    numbers += [0.0] * (2 - len(numbers))
    return (float(m.stage or 0), numbers[0], numbers[1])


def eligible_parents(child: Message, earlier: Sequence[Message]) -> list[Message]:
    """Eq. 4: earlier in time, same topic, not later in stage order."""
    return [
        p
        for p in earlier
        if p.timestamp < child.timestamp and p.topic == child.topic and order_key(p) <= order_key(child)
    ]


@dataclass
class Forest:
    """Nodes are message ids; ``parent`` maps child -> parent id (absent for roots)."""

    messages: dict[int, Message]
    parent: dict[int, int] = field(default_factory=dict)
    relation: dict[int, str] = field(default_factory=dict)  # ROOT for roots
    confidence: dict[int, float] = field(default_factory=dict)

    def children(self, node: int) -> list[int]:
        return sorted((c for c, p in self.parent.items() if p == node), key=lambda c: (self.messages[c].timestamp, c))

    def roots(self) -> list[int]:
        return sorted((n for n in self.messages if n not in self.parent), key=lambda n: (self.messages[n].timestamp, n))

    def to_json(self) -> dict:
        return {
            "nodes": sorted(self.messages),
            "edges": [
                {"child": c, "parent": p, "relation": self.relation[c], "confidence": self.confidence.get(c)}
                for c, p in sorted(self.parent.items())
            ],
        }

    @classmethod
    def from_json(cls, data: dict, messages: dict[int, Message]) -> Forest:
        forest = cls({i: messages[i] for i in data["nodes"]})
        for n in forest.messages:
            forest.relation[n] = "ROOT"
        for e in data["edges"]:
            forest.parent[e["child"]] = e["parent"]
            forest.relation[e["child"]] = e["relation"]
            forest.confidence[e["child"]] = e["confidence"]
        return forest


@dataclass
class Judgement:
    """One classifier call: scored candidates and, if the call failed, why."""

    scored: list[tuple[int, str, float]]  # (parent id, relation, confidence)
    error: str | None = None
    raw: str | None = None
    prompt: list[dict] | None = None  # the messages sent, for an LLM classifier


class RelationClassifier:
    name = "base"

    def classify_many(
        self,
        question: str,
        user: str | None,
        tasks: Sequence[tuple[Message, Sequence[Message]]],
        granularity: Granularity,
    ) -> list[Judgement]:
        raise NotImplementedError


STATE_CHANGE_CUES = frozenset(
    [
        "now",
        "changed",
        "change",
        "instead",
        "longer",
        "moved",
        "switched",
        "updated",
        "new",
        "finally",
        "decided",
        "started",
        "stopped",
        "quit",
        "became",
        "anymore",
        "replaced",
        "postponed",
        "moved",
        "cancelled",
        "canceled",
        "rescheduled",
        "actually",
    ]
)


class LexicalRelationClassifier(RelationClassifier):
    """Heuristic: Jaccard overlap of content words between parent and child (boosted by
    shared query words). Below ``min_overlap`` -> ROOT; otherwise UPDATE when the child
    has a state-change cue word (``STATE_CHANGE_CUES``), else EXPAND. Confidence is the
    overlap score. No LLM, deterministic, reported as the ``lexical`` variant."""

    name = "lexical"

    def __init__(self, min_overlap: float = 0.15):
        self.min_overlap = min_overlap

    def classify_many(self, question, user, tasks, granularity):
        q = units(question)
        out = []
        for child, candidates in tasks:
            cu = units(child.text)
            cue = bool(cu & STATE_CHANGE_CUES)
            scored = []
            for p in candidates:
                pu = units(p.text)
                union = cu | pu
                jaccard = len(cu & pu) / len(union) if union else 0.0
                score = min(1.0, jaccard + 0.5 * jaccard * bool(cu & pu & q))
                relation = "ROOT" if score < self.min_overlap else ("UPDATE" if cue else "EXPAND")
                scored.append((p.id, relation, score))
            out.append(Judgement(scored))
        return out


class LLMRelationClassifier(RelationClassifier):
    """The App. K prompt, one call per child with its eligible parents (the most recent
    ``max_candidates``), batched through the client. Unparseable output -> a Judgement
    with ``error`` set and no edges (the child becomes a root)."""

    name = "llm"

    def __init__(self, client, max_candidates: int = 8, max_tokens: int = 512):
        self.client = client
        self.max_candidates = max_candidates
        self.max_tokens = max_tokens

    def prompts(self, question, user, tasks, granularity) -> list[list[dict]]:
        return [
            structuring_messages(question, user, child, list(cands)[-self.max_candidates :], granularity)
            for child, cands in tasks
        ]

    def classify_many(self, question, user, tasks, granularity):
        batch = self.prompts(question, user, tasks, granularity)
        results = self.client.chat_batch(
            batch, stage="structure", json_schema=STRUCTURING_SCHEMA, max_tokens=self.max_tokens
        )
        out = []
        for (child, cands), result, prompt in zip(tasks, results, batch):
            if result.parsed_json is None:
                out.append(Judgement([], error=result.error or "no_json", raw=result.text, prompt=prompt))
                continue
            scored = []
            for choice in result.parsed_json.get("choices", []):
                pid = parse_msg_id(choice.get("parent_id"))
                relation = str(choice.get("relation", "")).upper()
                relation = "ROOT" if relation in ("NONE", "ROOT") else relation
                try:
                    confidence = float(choice.get("confidence", 0.0))
                except (TypeError, ValueError):
                    confidence = 0.0
                if pid is not None and relation in ("UPDATE", "EXPAND", "ROOT"):
                    scored.append((pid, relation, confidence))
            out.append(Judgement(scored, raw=result.text, prompt=prompt))
        return out


_CLASSIFIERS: dict[str, Callable[..., RelationClassifier]] = {
    "llm": LLMRelationClassifier,
    "lexical": LexicalRelationClassifier,
}


def make_classifier(name: str, **kwargs) -> RelationClassifier:
    if name not in _CLASSIFIERS:
        raise ValueError(f"unknown relation classifier {name!r}; known: {', '.join(sorted(_CLASSIFIERS))}")
    return _CLASSIFIERS[name](**kwargs)


def structuring_tasks(messages: Sequence[Message]) -> tuple[list[Message], list[tuple[Message, list[Message]]]]:
    """Messages in time order, and (child, eligible parents) for every child that has any."""
    ordered = sorted({m.id: m for m in messages}.values(), key=lambda m: (m.timestamp, m.id))
    tasks = [(child, eligible_parents(child, ordered[:i])) for i, child in enumerate(ordered)]
    return ordered, [(child, cands) for child, cands in tasks if cands]


def build_forest(
    question: str,
    user: str | None,
    messages: Sequence[Message],
    classifier: RelationClassifier,
    granularity: Granularity = "day",
) -> tuple[Forest, list[Judgement]]:
    """Structure ``messages`` (R'(q)) into a forest; returns it with the per-child judgements."""
    ordered, tasks = structuring_tasks(messages)
    forest = Forest({m.id: m for m in ordered}, relation={m.id: "ROOT" for m in ordered})
    judgements = classifier.classify_many(question, user, tasks, granularity) if tasks else []
    for (child, candidates), judgement in zip(tasks, judgements):
        allowed = {c.id for c in candidates}
        best = max(
            ((conf, pid, rel) for pid, rel, conf in judgement.scored if pid in allowed and rel != "ROOT"),
            default=None,
        )
        if best is not None:
            conf, pid, rel = best
            forest.parent[child.id] = pid
            forest.relation[child.id] = rel
            forest.confidence[child.id] = conf
    return forest, judgements

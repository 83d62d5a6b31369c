"""The embedded synthetic benchmark: team chat over months, built to need a time locator.

Each conversation (one ``Memory``) is a multi-party chat (4-6 people) over about a year
(the span grows with the message count so the density stays the same, ``MESSAGES_PER_DAY``).
Every conversation of a dataset starts on ``BASE_DATE``: they share one calendar period
and differ in content, so a locator trained on some conversations has seen every date of
the others (a held-out conversation in another year would need dates it never saw).

- recurring events (offsite, team lunch, sprint demo, ...) whose instances on different
  days use the *same* three message templates and differ only in one detail (venue,
  dish, feature ...): semantically similar, temporally wrong distractors. The frequent
  events recur about weekly (~58 instances in the default conversation), so a question
  about one instance has far more near-identical twins than the k=20 a retriever returns:
  only the time cue singles out the gold instance, and a semantic-only retriever misses
  it most of the time (the problem a window locator exists for);
- one-off milestones ("the reorg", "the office move") that anchor other questions;
- state-evolution chains per project parameter: proposal -> revisions (-> rollback),
  tagged with ``phase`` and ``stage``; chains are long (one update every one to three
  weeks), so "the current value" competes with many stale updates;
- personal facts that never change (the non-temporal questions);
- filler chatter.

Messages carry minute timestamps, ``channel`` and ``topic``; granularity is "day"
because every temporal cue in the questions resolves to days (dates, months, "last
week"), and the locator speaks ISO dates. Every question carries the cue that
determines its gold window: an ISO date or a month name (``absolute``), a relative
phrase resolved against ``asked_at`` (``relative``), a milestone (``anchored``), two or
three ISO dates (``multi2``/``multi3``), "current" (``current_state``, the latest
update of a chain); ``non_temporal`` questions ask about facts. Query.category is that
type name. Only unambiguous questions are kept (e.g. "last week" only when exactly one
instance of the event falls in that week). Relative questions are asked on the day the
phrase needs (``asked_at`` mid-conversation); all others at the end of the conversation.

Deterministic by seed: each conversation draws from its own ``random.Random``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from tider.data.gold import gold_windows
from tider.data.synth_queries import Questions
from tider.types import Dataset, Gold, Memory, Message, Query

DEFAULT_MESSAGES = 22400  # 16 x 1400: ~58 twins per frequent event, embeddings still minutes
DEFAULT_CONVERSATIONS = 16
BASE_DATE = date(2023, 1, 2)
MESSAGES_PER_DAY = 3.3  # 1200 messages span ~a year
REFERENCE_MESSAGES = 1200  # EVENTS counts and chain lengths are per this many messages

PEOPLE = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
# event type -> (detail attribute, values, channel, instances per REFERENCE_MESSAGES).
# Five frequent events (about weekly) make the crowding; the monthly budget meeting keeps
# month-level cues ("in March", "last month") unambiguous.
EVENTS: dict[str, tuple[str, list[str], str, int]] = {
    "offsite": ("venue", ["lisbon", "berlin", "oslo", "porto", "vienna", "prague", "madrid", "dublin"], "#events", 50),
    "team lunch": ("dish", ["pizza", "sushi", "tacos", "ramen", "curry", "salad", "burgers", "pasta"], "#social", 50),
    "sprint demo": (
        "feature",
        ["search", "login", "export", "billing", "chat", "upload", "alerts", "reports"],
        "#eng",
        50,
    ),
    "budget meeting": ("budget", ["10k", "12k", "15k", "18k", "20k", "25k", "30k", "40k"], "#planning", 12),
    "customer call": (
        "customer",
        ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"],
        "#sales",
        50,
    ),
    "design review": ("color", ["red", "blue", "green", "orange", "purple", "teal", "gold", "gray"], "#design", 50),
}
MILESTONES = ["kickoff", "reorg", "office move", "security audit", "v2 launch", "hiring freeze", "rebrand", "merger"]
PROJECTS = ["apollo", "borealis", "cobalt", "delta", "ember", "falcon"]
PARAMS: dict[str, list[str]] = {
    "database": ["postgres", "mysql", "sqlite", "mongo", "redis"],
    "region": ["us east", "us west", "eu west", "asia south", "eu north"],
    "owner": PEOPLE,
    "deadline": ["march", "april", "may", "june", "july", "august"],
}
FACTS: dict[str, list[str]] = {
    "favorite editor": ["vim", "emacs", "vscode", "nano", "helix"],
    "home city": ["paris", "rome", "tokyo", "austin", "lagos", "lima"],
    "pet": ["cat", "dog", "parrot", "turtle", "rabbit"],
    "favorite drink": ["tea", "coffee", "cocoa", "juice", "water"],
}
FILLER = [
    "good morning everyone",
    "coffee anyone?",
    "lgtm",
    "thanks {p}",
    "on it",
    "back from lunch",
    "the wifi is slow again",
    "see you tomorrow",
    "nice work {p}",
    "can someone review my change?",
    "running five minutes late",
    "who has the meeting room?",
    "ok sounds good",
    "brb",
    "the build is green again",
    "i will take a look",
    "any news on the ticket?",
]
# query type -> sampling weight; the mix is reported by `tider data stats`. Phrasings:
# tider.data.synth_queries.
QUERY_MIX = {
    "absolute": 0.16,
    "relative": 0.14,
    "vague": 0.08,
    "anchored": 0.14,
    "multi2": 0.09,
    "multi3": 0.07,
    "current_state": 0.14,
    "non_temporal": 0.18,
}


@dataclass
class _Raw:
    """A message before sorting: ``ref`` lets queries point at it before ids exist."""

    ts: datetime
    ref: int
    text: str
    speaker: str
    channel: str
    topic: str | None = None
    phase: str | None = None
    stage: int | None = None


@dataclass
class _Instance:
    event: str
    day: date
    value: str
    evidence: int  # ref of the message that states the value


class _Conversation:
    """Generates one conversation and its queries from its own random stream."""

    def __init__(self, key: str, n_messages: int, rng: random.Random, start: date):
        self.key, self.rng, self.start = key, rng, start
        scale = max(n_messages, 40) / 400
        self.n_days = max(30, round(n_messages / MESSAGES_PER_DAY))
        per_reference = max(n_messages, 40) / REFERENCE_MESSAGES
        self.people = rng.sample(PEOPLE, rng.randint(4, 6))
        self.raw: list[_Raw] = []
        self.instances: dict[str, list[_Instance]] = {}
        self.milestones: dict[str, tuple[date, int]] = {}
        self.chains: list[tuple[str, str, list[tuple[date, str, int]]]] = []
        self.facts: list[tuple[str, str, str, int]] = []
        self._events(per_reference)
        self._milestones(scale)
        self._chains(scale, per_reference)
        self._facts(min(len(FACTS), max(2, round(4 * per_reference))))
        for _ in range(max(0, n_messages - len(self.raw))):
            day = self._day()
            self._say(
                day,
                time(rng.randint(8, 19), rng.randint(0, 59)),
                rng.choice(FILLER).format(p=rng.choice(self.people)),
                "#general",
                "chatter",
            )
        self.end = max(r.ts for r in self.raw).date()

    def _day(self, lo: int = 0, hi: int | None = None) -> date:
        return self.start + timedelta(days=self.rng.randint(lo, (self.n_days - 1) if hi is None else hi))

    def _say(
        self,
        day: date,
        at: time,
        text: str,
        channel: str,
        topic: str | None,
        phase: str | None = None,
        stage: int | None = None,
        speaker: str | None = None,
    ) -> int:
        ref = len(self.raw)
        self.raw.append(
            _Raw(
                datetime.combine(day, at),
                ref,
                text,
                speaker or self.rng.choice(self.people),
                channel,
                topic,
                phase,
                stage,
            )
        )
        return ref

    def _events(self, per_reference: float) -> None:
        rng = self.rng
        for event, (attr, values, channel, per_span) in EVENTS.items():
            count = min(self.n_days, max(1, round(per_span * per_reference)))
            # One instance per equal slice of the span (a recurring event, not a random
            # clump), so "last week" / "in March" often name exactly one instance.
            cuts = [round(i * self.n_days / count) for i in range(count + 1)]
            days = [self.start + timedelta(days=rng.randrange(lo, hi)) for lo, hi in itertools.pairwise(cuts)]
            instances = []
            for day in days:
                value, hour, minute = rng.choice(values), rng.randint(9, 16), rng.randint(0, 40)
                self._say(day, time(hour, minute), f"reminder: the {event} is today", channel, event, "announce")
                ref = self._say(
                    day,
                    time(hour, minute + 5),
                    f"we picked {value} as the {attr} at the {event}",
                    channel,
                    event,
                    "report",
                )
                self._say(day, time(hour, minute + 9), f"thanks all, the {event} went well", channel, event, "wrapup")
                instances.append(_Instance(event, day, value, ref))
            self.instances[event] = instances

    def _milestones(self, scale: float) -> None:
        count = min(len(MILESTONES), max(1, round(4 * scale)))
        for name in self.rng.sample(MILESTONES, count):
            day = self._day(self.n_days // 10, self.n_days - 1)
            ref = self._say(
                day,
                time(11, self.rng.randint(0, 50)),
                f"big news: the {name} happened today",
                "#general",
                name,
                "milestone",
            )
            self._say(
                day,
                time(12, self.rng.randint(0, 50)),
                f"the {name} is done, great work everyone",
                "#general",
                name,
                "milestone",
            )
            self.milestones[name] = (day, ref)

    def _chains(self, scale: float, per_reference: float) -> None:
        pairs = [(p, q) for p in PROJECTS for q in PARAMS]
        rng = self.rng
        last_day = self.start + timedelta(days=self.n_days - 1)
        for project, param in rng.sample(pairs, min(len(pairs), max(1, round(2 * scale)))):
            first, _ = rng.sample(PARAMS[param], 2)  # sampling two keeps the benchmark's rng stream
            day = self._day(0, max(0, self.n_days // 8))
            steps = [(day, "proposal", f"proposal: set the {param} of project {project} to {first}", first)]
            value, revisions = first, max(1, round(24 * per_reference))
            for _ in range(revisions):  # many stale updates before the current one
                day += timedelta(days=rng.randint(5, 18))
                if steps[1:] and day > last_day:
                    break
                value = rng.choice([v for v in PARAMS[param] if v != value])
                steps.append((day, "revision", f"revision: change the {param} of project {project} to {value}", value))
            if rng.random() < 0.5:
                day = day + timedelta(days=rng.randint(5, 18))
                previous = steps[-2][3]
                steps.append(
                    (day, "rollback", f"rollback: revert the {param} of project {project} to {previous}", previous)
                )
            chain = []
            for stage, (day, phase, text, value) in enumerate(steps):
                ref = self._say(
                    day, time(rng.randint(9, 17), rng.randint(0, 59)), text, "#projects", project, phase, stage
                )
                chain.append((day, value, ref))
            self.chains.append((project, param, chain))

    def _facts(self, per_person: int) -> None:
        for person in self.people:
            for fact in self.rng.sample(sorted(FACTS), per_person):
                value = self.rng.choice(FACTS[fact])
                ref = self._say(
                    self._day(),
                    time(self.rng.randint(8, 19), self.rng.randint(0, 59)),
                    f"fyi my {fact} is {value}",
                    "#general",
                    "about me",
                    speaker=person,
                )
                self.facts.append((person, fact, value, ref))

    def event_attr(self, event: str) -> str:
        return EVENTS[event][0]


def generate(
    n_messages: int = DEFAULT_MESSAGES,
    seed: int = 0,
    n_conversations: int = DEFAULT_CONVERSATIONS,
    key_prefix: str = "synth",
) -> Dataset:
    """A synthetic dataset of about ``n_messages`` messages in ``n_conversations`` memories
    keyed ``<key_prefix>-000``, ...

    Deterministic by ``seed``. About one query per five messages.
    """
    if n_conversations < 1 or n_messages < n_conversations:
        raise ValueError(
            f"need n_conversations >= 1 and n_messages >= n_conversations, got {n_messages}, {n_conversations}"
        )
    memories: dict[str, Memory] = {}
    queries: list[Query] = []
    for c in range(n_conversations):
        rng = random.Random(f"tider-synth:{seed}:{c}")
        key = f"{key_prefix}-{c:03d}"
        n_conv = n_messages // n_conversations + (c < n_messages % n_conversations)
        conv = _Conversation(key, n_conv, rng, BASE_DATE)
        memory, id_of_ref = _memory(key, conv)
        memories[key] = memory
        queries += _queries(key, conv, memory, id_of_ref, rng, n=max(1, round(n_conv / 5)))
    stats = {
        "seed": seed,
        "query_types": dict(sorted(Counter(q.category for q in queries).items())),
        "unresolved_evidence": 0,
    }
    return Dataset("synthetic", "day", memories, queries, stats)


def _memory(key: str, conv: _Conversation) -> tuple[Memory, dict]:
    """``conv``'s messages in time order as the memory ``key``, and each raw message's id by its ref."""
    order = sorted(conv.raw, key=lambda r: (r.ts, r.ref))
    messages = [
        Message(
            i,
            f"{key}:{i:05d}",
            r.text,
            r.ts,
            r.speaker,
            r.ts.date().isoformat(),
            r.channel,
            r.topic,
            r.phase,
            r.stage,
        )
        for i, r in enumerate(order)
    ]
    return Memory(key, messages, "day"), {r.ref: i for i, r in enumerate(order)}


def _queries(key: str, conv: _Conversation, memory: Memory, id_of_ref: dict, rng: random.Random, n: int) -> list[Query]:
    """Up to ``n`` questions about ``conv``, each of a type drawn by ``QUERY_MIX``; a draw
    that builds no new question in 20 attempts is skipped."""
    questions = Questions(conv)
    types, weights = list(QUERY_MIX), list(QUERY_MIX.values())
    default_asked = datetime.combine(conv.end + timedelta(days=1), time(9, 0))
    seen: set[tuple[str, datetime]] = set()
    queries: list[Query] = []
    for _ in range(n):
        kind = rng.choices(types, weights)[0]
        for _attempt in range(20):
            built = getattr(questions, kind)()
            if built is None:
                continue
            text, answer, refs, asked_day = built
            asked = default_asked if asked_day is None else datetime.combine(asked_day, time(18, rng.randint(0, 59)))
            if (text, asked) in seen:
                continue
            seen.add((text, asked))
            ids = tuple(sorted(id_of_ref[r] for r in refs))
            temporal, windows = gold_windows(
                (memory[i].timestamp for i in ids), "day", non_temporal=kind == "non_temporal"
            )
            gold = Gold(answer=answer, evidence_ids=ids, windows=windows, temporal=temporal)
            queries.append(Query(f"{key}:q{len(seen) - 1:04d}", key, text, asked, rng.choice(conv.people), kind, gold))
            break
    return queries


def default_dataset(seed: int = 0) -> Dataset:
    """The embedded default: 16 conversations x 1400 messages (~240 queries each)."""
    return generate(DEFAULT_MESSAGES, seed=seed, n_conversations=DEFAULT_CONVERSATIONS)


def write(dataset: Dataset, out_dir: str):
    """Write ``dataset`` in the generic JSONL format (``tider.data.jsonl``)."""
    from tider.data.jsonl import write_jsonl

    return write_jsonl(dataset, out_dir)


def load_synthetic(path: str | None = None, seed: int = 0, **options) -> Dataset:
    """``load_dataset("synthetic", path)``: a directory written by ``tider data synth``,
    or the embedded default (generated in memory) when ``path`` is None."""
    if path is None:
        return default_dataset(seed=seed)
    from tider.data.jsonl import load_jsonl

    dataset = load_jsonl(path, **options)
    dataset.stats["query_types"] = dict(sorted(Counter(q.category for q in dataset.queries).items()))
    return dataset

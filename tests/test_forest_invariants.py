"""Forest invariants on random inputs (hypothesis) and a hand-checked compression."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tider.forest.compress import IDF, compress_forest, split_spans, truncate_to_budget, whitespace_tokens
from tider.forest.linearize import forest_rows, render_forest
from tider.forest.structure import (
    Forest,
    Judgement,
    LexicalRelationClassifier,
    RelationClassifier,
    build_forest,
    eligible_parents,
    make_classifier,
    order_key,
)
from tider.types import Message

WORDS = ["plan", "moved", "Sweden", "paint", "group", "now", "deadline", "budget", "changed", "lake", "dog", "cat"]
T0 = datetime(2023, 1, 1)


class RandomClassifier(RelationClassifier):
    """Adversarial stand-in for a garbage LLM: labels ANY message id (eligible or not)."""

    name = "random"

    def __init__(self, draws, all_ids):
        self.draws, self.all_ids = draws, all_ids

    def classify_many(self, question, user, tasks, granularity):
        out = []
        for _ in tasks:
            n = self.draws.draw(st.integers(0, 4))
            scored = [
                (
                    self.draws.draw(st.sampled_from(self.all_ids)),
                    self.draws.draw(st.sampled_from(["UPDATE", "EXPAND", "ROOT"])),
                    self.draws.draw(st.floats(0, 1)),
                )
                for _ in range(n)
            ]
            out.append(Judgement(scored))
        return out


@st.composite
def messages(draw, max_n=12):
    n = draw(st.integers(1, max_n))
    out = []
    for i in range(n):
        text = (
            ". ".join(
                " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6)))
                for _ in range(draw(st.integers(1, 4)))
            )
            + "."
        )
        out.append(
            Message(
                id=i,
                key=f"m{i}",
                text=text,
                timestamp=T0 + timedelta(hours=draw(st.integers(0, 10))),
                speaker=draw(st.sampled_from(["A", "B"])),
                session="s1",
                topic=draw(st.sampled_from(["t1", "t2"])),
                stage=draw(st.integers(0, 2)),
                phase=draw(st.sampled_from([None, "1", "2/0.5", "2/0.9"])),
            )
        )
    return sorted(out, key=lambda m: (m.timestamp, m.id))


def _check_forest(forest: Forest):
    for child, parent in forest.parent.items():
        c, p = forest.messages[child], forest.messages[parent]
        assert p.timestamp < c.timestamp
        assert p.topic == c.topic
        assert order_key(p) <= order_key(c)
        assert forest.relation[child] in ("UPDATE", "EXPAND")
    # single parent is structural (dict); no cycles because parents are strictly earlier
    rows = forest_rows(forest, "minute")
    assert sorted(r.message_id for r in rows) == sorted(forest.messages)  # every node once
    # Eq. 8 linearization: trees by root time, preorder, siblings chronological.
    roots = [r for r in rows if r.parent == 0]
    assert [forest.messages[r.message_id].timestamp for r in roots] == sorted(
        forest.messages[r.message_id].timestamp for r in roots
    )
    by_index = {r.index: r for r in rows}
    assert [x.index for x in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        if r.parent:
            parent = by_index[r.parent]
            assert parent.index < r.index and r.depth == parent.depth + 1
            assert forest.parent[r.message_id] == parent.message_id and r.relation == forest.relation[r.message_id]
        else:
            assert r.depth == 0 and r.relation == "ROOT"
    for node in forest.messages:
        kids = [r for r in rows if r.parent and by_index[r.parent].message_id == node]
        times = [forest.messages[k.message_id].timestamp for k in kids]
        assert times == sorted(times)
        # preorder: a node's subtree is contiguous right after it
        if kids:
            first = next(r for r in rows if r.message_id == node)
            assert kids[0].index == first.index + 1


@settings(max_examples=60, deadline=None)
@given(msgs=messages(), data=st.data())
def test_forest_invariants_hold_for_any_classifier_output(msgs, data):
    clf = RandomClassifier(data, [m.id for m in msgs] + [999])
    forest, _ = build_forest("Did the plan move to Sweden?", "A", msgs, clf, "minute")
    _check_forest(forest)


@settings(max_examples=40, deadline=None)
@given(msgs=messages())
def test_lexical_classifier_forest_invariants(msgs):
    forest, _ = build_forest("When did the group plan change?", None, msgs, LexicalRelationClassifier(0.05), "minute")
    _check_forest(forest)


@settings(max_examples=60, deadline=None)
@given(msgs=messages(), budget=st.integers(0, 120), data=st.data())
def test_compression_budget_and_min_span(msgs, budget, data):
    clf = RandomClassifier(data, [m.id for m in msgs])
    question = "Did the plan change after Sweden?"
    forest, _ = build_forest(question, None, msgs, clf, "minute")
    comp = compress_forest(forest, question, IDF(m.text for m in msgs), budget)
    for spans in comp.spans.values():
        assert any(s.kept for s in spans), "every node keeps at least one span"
        assert all(s.kept for s in spans if s.protected), "protected spans are never omitted"
    # Mandatory = protected spans + the best-scoring span of nodes with no protected span.
    mandatory = 0
    for spans in comp.spans.values():
        prot = [s for s in spans if s.protected]
        mandatory += sum(s.tokens for s in prot) if prot else max(spans, key=lambda s: (s.score, -s.index)).tokens
    if mandatory <= budget:
        assert comp.retained_tokens() <= budget and not comp.over_budget
    else:
        assert comp.over_budget
    # Compression never deletes nodes or edges.
    assert len(forest_rows(forest, "minute", comp)) == len(msgs)


def test_eligible_parents_respect_time_topic_stage():
    mk = lambda i, h, topic, stage, phase=None: Message(
        i, f"m{i}", "x", T0 + timedelta(hours=h), "A", "s", topic=topic, stage=stage, phase=phase
    )
    child = mk(9, 5, "t", 1, "2/0.5")
    cands = [
        mk(0, 1, "t", 1, "2/0.4"),
        mk(1, 1, "u", 1),
        mk(2, 5, "t", 0),
        mk(3, 2, "t", 2),
        mk(4, 3, "t", 1, "2/0.6"),
        mk(5, 4, "t", 0, "9"),
    ]
    assert [p.id for p in eligible_parents(child, cands)] == [0, 5]


def test_hand_checked_compression():
    # Corpus of 4 messages -> idf(u) = log(5 / (df + 1)) + 1.
    parent = Message(0, "a", "Alice adopted a dog.", T0, "Alice", "s")
    child = Message(
        1, "b", "The dog is happy. Sweden is far away. We walk daily in the park", T0 + timedelta(days=1), "Alice", "s"
    )
    other = [Message(2, "c", "The park is green.", T0, "Mel", "s"), Message(3, "d", "Happy dog.", T0, "Mel", "s")]
    forest = Forest({0: parent, 1: child}, parent={1: 0}, relation={0: "ROOT", 1: "EXPAND"})
    idf = IDF(m.text for m in [parent, child] + other)
    question = "Where is Sweden?"
    comp = compress_forest(forest, question, idf, budget=9)
    spans = comp.spans[1]
    assert [s.text for s in spans] == ["The dog is happy.", "Sweden is far away.", "We walk daily in the park"]
    # "Sweden" is a query entity -> protected.
    assert [s.protected for s in spans] == [False, True, False]
    # span 0: units {dog, happy}; dog is in the parent -> only "happy" is novel (df=2):
    #   G = log(5/3) + 1 = 1.5108, g = G / 4 tokens = 0.3777
    # span 2: units {walk, daily, park}; all novel (df 1, 1, 2):
    #   G = 2*(log(5/2)+1) + (log(5/3)+1) = 5.3434, g = G / 6 tokens = 0.8906
    assert abs(spans[0].score - 0.3777) < 1e-3 and abs(spans[2].score - 0.8906) < 1e-3
    # Total = 4 (parent) + 4 + 4 + 6 = 18 > 9. Leaves first: omit span 0 (lowest g) -> 14,
    # then span 2 -> 8 <= 9. The root is never touched.
    assert [s.kept for s in spans] == [False, True, False]
    assert comp.retained_tokens() == 8 and not comp.over_budget
    assert comp.text_of(1) == "Sweden is far away."
    text = render_forest(forest_rows(forest, "day", comp))
    assert text.splitlines() == [
        "TREE 1",
        "[1] parent=0 ROOT depth=0 time=2023-01-01 author=Alice: Alice adopted a dog.",
        "  [2] parent=1 EXPAND depth=1 time=2023-01-02 author=Alice: Sweden is far away.",
    ]


def test_truncation_variant_and_registry():
    text = "one two three\nfour five six\nseven"
    assert truncate_to_budget(text, 4) == "one two three\nfour"
    assert truncate_to_budget(text, 100) == text
    assert whitespace_tokens(truncate_to_budget(text, 5)) <= 5
    assert split_spans("A b. C d!  E f?") == ["A b.", "C d!", "E f?"]
    try:
        make_classifier("gpt")
    except ValueError as exc:
        assert "lexical" in str(exc) and "llm" in str(exc)
    else:
        raise AssertionError("unknown classifier must fail with the known names")

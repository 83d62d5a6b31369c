"""Evidence forest linearization (T-Mem Eq. 8) and the flat baseline.

Forest: trees ordered by root time, nodes in preorder with siblings chronological; each
node is the tuple (index, parent index, relation, depth, time, author, text), index
1-based and parent 0 for roots, rendered one line per node, indented by depth:

    TREE 1
    [1] parent=0 ROOT depth=0 time=2023-05-07 author=Alice: I went to the book club.
      [2] parent=1 UPDATE depth=1 time=2023-06-01 author=Alice: I moved to the new group.

Flat: messages in retrieval-rank order, one per line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tider.forest.compress import IDF, Compression, TokenCounter, compress_forest
from tider.forest.structure import Forest
from tider.types import Granularity, Message, format_time


@dataclass
class Row:
    index: int
    parent: int
    relation: str
    depth: int
    time: str
    author: str
    text: str
    message_id: int


def forest_rows(forest: Forest, granularity: Granularity, compression: Compression | None = None) -> list[Row]:
    rows: list[Row] = []
    index_of: dict[int, int] = {}

    def visit(node: int, depth: int) -> None:
        m = forest.messages[node]
        index_of[node] = len(rows) + 1
        parent = forest.parent.get(node)
        text = compression.text_of(node) if compression is not None else m.text
        rows.append(
            Row(
                index_of[node],
                index_of[parent] if parent is not None else 0,
                forest.relation.get(node, "ROOT"),
                depth,
                format_time(m.timestamp, granularity),
                m.speaker,
                text,
                m.id,
            )
        )
        for child in forest.children(node):
            visit(child, depth + 1)

    for root in forest.roots():
        visit(root, 0)
    return rows


def render_forest(rows: Sequence[Row]) -> str:
    lines, tree = [], 0
    for r in rows:
        if r.depth == 0:
            tree += 1
            lines.append(f"TREE {tree}")
        lines.append(
            f"{'  ' * r.depth}[{r.index}] parent={r.parent} {r.relation} depth={r.depth} "
            f"time={r.time} author={r.author}: {r.text}"
        )
    return "\n".join(lines)


def render_flat(messages: Sequence[Message], granularity: Granularity) -> str:
    return "\n".join(
        f"[{rank}] time={format_time(m.timestamp, granularity)} author={m.speaker}: {m.text}"
        for rank, m in enumerate(messages, start=1)
    )


def rows_to_json(rows: Sequence[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


@dataclass
class FittedForest:
    text: str
    rows: list[Row]
    compression: Compression
    metadata_tokens: int  # what the per-node metadata costs, taken off the budget first


def fit_forest(
    forest: Forest, question: str, idf: IDF, budget: int, count_tokens: TokenCounter, granularity: Granularity
) -> FittedForest:
    """Compress and linearize ``forest`` so the serialized context fits ``budget`` tokens:
    the per-node metadata (index, parent, relation, depth, time, author) comes off the
    budget, the spans share the rest; omission markers and joins cost a few tokens the
    span sum does not see, so the span budget is tightened by the excess and compressed
    again (at most 8 rounds)."""
    skeleton = forest_rows(forest, granularity)
    for row in skeleton:
        row.text = ""
    overhead = count_tokens(render_forest(skeleton))
    span_budget = max(0, budget - overhead)
    for _ in range(8):
        comp = compress_forest(forest, question, idf, span_budget, count_tokens)
        rows = forest_rows(forest, granularity, comp)
        text = render_forest(rows)
        excess = count_tokens(text) - budget
        if excess <= 0 or comp.over_budget or span_budget == 0:
            break
        span_budget = max(0, min(span_budget, comp.retained_tokens()) - excess)
    comp.over_budget = comp.over_budget or count_tokens(text) > budget
    return FittedForest(text, rows, comp, overhead)

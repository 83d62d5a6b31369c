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

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from tider.forest.compress import Compression
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


def forest_rows(forest: Forest, granularity: Granularity, compression: Optional[Compression] = None) -> list[Row]:
    rows: list[Row] = []
    index_of: dict[int, int] = {}

    def visit(node: int, depth: int) -> None:
        m = forest.messages[node]
        index_of[node] = len(rows) + 1
        parent = forest.parent.get(node)
        text = compression.text_of(node) if compression is not None else m.text
        rows.append(Row(index_of[node], index_of[parent] if parent is not None else 0,
                        forest.relation.get(node, "ROOT"), depth, format_time(m.timestamp, granularity),
                        m.speaker, text, m.id))
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
        lines.append(f"{'  ' * r.depth}[{r.index}] parent={r.parent} {r.relation} depth={r.depth} "
                     f"time={r.time} author={r.author}: {r.text}")
    return "\n".join(lines)


def render_flat(messages: Sequence[Message], granularity: Granularity) -> str:
    return "\n".join(
        f"[{rank}] time={format_time(m.timestamp, granularity)} author={m.speaker}: {m.text}"
        for rank, m in enumerate(messages, start=1)
    )


def rows_to_json(rows: Sequence[Row]) -> list[dict]:
    return [asdict(r) for r in rows]

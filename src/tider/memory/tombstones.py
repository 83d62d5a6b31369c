"""Deletes and updates of an ``EmbeddedMemory`` that cost what they change: tombstones.

A row (``tider.memory.embedded``: a message's place in the order of addition, its line in
the segment files and its faiss id) never moves, so a change leaves every row-keyed index
as it is and marks what changed:

* a **delete** marks the rows dead: they leave the time-ordered views (the later positions
  move up), BM25's postings (``Postings.remove``: the statistics become the survivors'),
  and every dense search (faiss is asked with a mask that excludes them);
* an **update** is a delete of the old row and an add of the new message as a new row that
  keeps the old one's ``seq`` (its place among messages of equal time). A message whose
  time keeps its place is put back at its position (nothing else moves).

On disk a change is one commit, as an add is: the new message's one-line segment, then the
manifest listing the dead rows (the commit point). Then the dead rows' lines are replaced
by ``{"dead": true}`` in their segments (rewriting those segment files only), and a saved
copy of the postings that holds their terms is dropped (saved again at the next close or
growth), so a deleted text has left the store's files when the call returns; a crash in
between is finished at the next open. Dead rows' vectors stay (in their segment and the
saved HNSW graph) until compaction. When a quarter of the rows are dead the store is
compacted: rewritten as one segment of its live rows in ``seq`` order, derived indexes
rebuilt on their next use (O(memory), once per that many changes).

So a managed memory ranks as one built from its survivors in their order of addition
(same positions, statistics, timeline, scores), as on PostgreSQL.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from tider.memory.records import message_to_json
from tider.retrieval.channels import to_days
from tider.types import Message

COMPACT_OVER = 0.25  # share of dead rows that triggers a compaction
DEAD = {"dead": True}  # a dead row's line in its segment


class Tombstones:
    """The part of ``MemoryState`` that deletes and updates (see the module docstring)."""

    @property
    def n_rows(self) -> int:
        return len(self.seq)

    def _grow_rows(self, seqs) -> None:
        self.seq = np.concatenate([self.seq, np.asarray(seqs, dtype=np.int64)])
        self.dead = np.concatenate([self.dead, np.zeros(len(seqs), dtype=bool)])

    def delete_rows(self, rows) -> None:
        """Delete the messages at ``rows`` (live rows), committed when this returns."""
        rows = sorted({int(r) for r in rows})
        if self.files is not None:
            self._commit_change(rows, None)
        self._kill(rows)
        if self._postings is not None:
            self._postings.remove(rows)
        self._after_change(rows)

    def replace_row(self, row: int, new: Message, vector: np.ndarray, chunks: tuple[np.ndarray, np.ndarray]) -> None:
        """``new`` (same key) in place of the message at ``row``, with its vector and its
        chunks' (vectors, rows 0)."""
        new_row, seq = self.n_rows, int(self.seq[row])
        new = replace(new, id=new_row)
        if self.files is not None:
            self._commit_change([row], (new, vector, chunks, seq))
        self.vectors.append(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        self._append_chunks(chunks[0], np.zeros(len(chunks[0]), dtype=np.int64), first_row=new_row)
        self._grow_rows([seq])
        pos = int(self.positions_of_rows()[row])
        if self._keeps_place(pos, new.timestamp, seq):
            self._put_back(pos, row, new)
        else:
            self._kill([row])
            self._place([new], new_row)
        if self._postings is not None:
            self._postings.remove([row])
            self._postings.add(self._terms([new]))
        self._after_change([row])

    # -- the views ---------------------------------------------------------------------
    def _kill(self, rows: list[int]) -> None:
        """The rows leave the time-ordered views; later positions move up."""
        positions = np.sort(self.positions_of_rows()[rows])
        self.dead[rows] = True
        self.memory.remove(positions.tolist())
        self.row_of_pos = np.delete(self.row_of_pos, positions)
        if self._ts is not None:
            self._ts = np.delete(self._ts, positions)
        self._moved(int(positions[0]))

    def _keeps_place(self, pos: int, when, seq: int) -> bool:
        """Would a message of time ``when`` and ``seq`` sort at ``pos`` among the others?"""
        ts, rows = self.memory.timestamps, self.row_of_pos
        after_prev = pos == 0 or (ts[pos - 1], int(self.seq[rows[pos - 1]])) < (when, seq)
        before_next = pos + 1 >= len(ts) or (when, seq) < (ts[pos + 1], int(self.seq[rows[pos + 1]]))
        return after_prev and before_next

    def _put_back(self, pos: int, old_row: int, new: Message) -> None:
        self.dead[old_row] = True
        self.memory.put(pos, new)
        self.row_of_pos[pos] = new.id
        if self._ts is not None:
            self._ts[pos] = to_days(new.timestamp)
        self._moved(pos)

    def _moved(self, first: int) -> None:
        """Positions from ``first`` on changed: what is derived from them follows."""
        self._in_order = False
        self._by_pos = self._pos_of_row = self._bm25 = None
        self.generation += 1
        if self._timeline is not None or self._timeline_from is not None:
            self._timeline_from = first if self._timeline_from is None else min(self._timeline_from, first)

    def _after_change(self, dead_rows: list[int]) -> None:
        if self.files is not None:
            self._scrub(dead_rows)
        if self.dead.sum() > COMPACT_OVER * self.n_rows:
            self.compact()

    # -- the files -----------------------------------------------------------------------
    def _commit_change(self, dead_rows: list[int], new) -> None:
        """One commit: the new message's segment (if any), the manifest with the dead rows."""
        m = dict(self.manifest)
        dead = sorted(set(m.get("dead", [])) | set(dead_rows))
        if new is not None:
            message, vector, chunks, seq = new
            name = f"seg-{m['next_segment']:06d}"
            line = {**message_to_json(message), **({"seq": seq} if seq != message.id else {})}
            chunk_rows = np.zeros(len(chunks[0]), dtype=np.int64)
            self.files.write_segment(name, [line], np.reshape(vector, (1, -1)), (chunks[0], chunk_rows))
            m["segments"] = m["segments"] + [{"name": name, "messages": 1}]
            m["next_segment"] += 1
        m["dead"] = dead
        m["messages"] = self.n_rows + (new is not None) - len(dead)
        self.manifest = m
        self.files.commit(m)

    def _scrub(self, dead_rows, recovering: bool = False) -> None:
        """Replace the dead rows' lines in their segments by ``DEAD``, after dropping the
        saved timeline (its positions moved) and saved postings that hold their terms, so a
        crash in between leaves no stale cache. ``recovering`` (an open): only where a
        line still holds its text, the change's scrub having been cut short."""
        starts = np.cumsum([0] + [s["messages"] for s in self.manifest["segments"]])
        by_segment: dict[str, list[int]] = {}
        for row in dead_rows:
            i = int(np.searchsorted(starts, row, side="right")) - 1
            by_segment.setdefault(self.manifest["segments"][i]["name"], []).append(int(row - starts[i]))
        dead = json.dumps(DEAD)
        if recovering:
            by_segment = {n: at for n, at in by_segment.items() if not self.files.lines_are(n, at, dead)}
            if not by_segment:
                return
        stale = ["timeline"]
        if not self._postings_unsaved and self._saved_postings > min(dead_rows):
            stale.append("postings")
            self._postings_unsaved = True
        self.files.drop_derived(stale)
        for name, lines_at in by_segment.items():
            self.files.replace_lines(name, lines_at, dead)

    def compact(self) -> None:
        """Rewrite the store as its live rows in ``seq`` order (rows renumbered, no dead
        ones); the derived indexes are rebuilt on their next use."""
        by_row = self.memory_by_row()
        keep = np.array(sorted(np.flatnonzero(~self.dead), key=lambda r: self.seq[r]), dtype=np.int64)
        dim = self.dim or 0
        vectors = self.vectors.rows[keep] if len(keep) else np.zeros((0, dim), dtype=np.float32)
        messages = [replace(by_row[r], id=i) for i, r in enumerate(keep)]
        renumber = np.full(self.n_rows, -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        owned = renumber[self.chunk_rows] >= 0
        chunk_vectors = self.chunks.rows.reshape(-1, dim)[owned]
        chunk_rows = renumber[self.chunk_rows[owned]]
        order = np.argsort(chunk_rows, kind="stable")
        chunk_vectors, chunk_rows = chunk_vectors[order], chunk_rows[order]
        postings = self._kept_postings(keep)
        if self.files is not None:
            lines = [message_to_json(m) for m in messages]
            self._write_as_one_segment(lines, vectors, (chunk_vectors, chunk_rows), rows_kept=False)
        self._empty_views(self.memory.granularity)
        self.vectors.append(vectors)
        self._append_chunks(chunk_vectors, chunk_rows, first_row=0)
        self._grow_rows(np.arange(len(keep)))
        self._place(messages, first_row=0)
        self._postings = postings

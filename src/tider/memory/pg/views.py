"""A process's read-through copy of a memory for the window sources that read it whole.

Ranking never needs it: the channels run in SQL. But ``MemoryStore.messages`` is a
``Memory`` (the ``rules`` source reads its time span, ``dbscan`` the times of its seeds)
and ``MemoryStore.timeline`` a ``Timeline`` whose prompt lines score every message's
vector (the ``timeline`` and ``locator`` sources). ``MemoryView`` builds those from the
tables inside the caller's snapshot and keeps them per memory version; moving to a newer
version reads only the rows added since (``seq`` beyond the last one seen), so a process
copies each message once, unless a delete or update came in between (the memory row's
``rewritten`` is newer than the copy): rows went or changed in place, so the copy is read
again whole. Vectors are copied only when a timeline is asked for.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

import numpy as np

from tider.memory.pg.gaps import NO_GAPS, Gaps
from tider.memory.pg.write import as_array
from tider.types import Memory, Message

ROW_COLUMNS = "seq, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata"


def message_of(row) -> Message:
    seq, key, ts, text, speaker, session, channel, topic, phase, stage, role, metadata = row
    meta = tuple(sorted(metadata.items()))
    return Message(seq, key, text, ts, speaker, session, channel, topic, phase, stage, role, meta)


@dataclass
class Copy:
    """One version of a memory: messages in time order, the seq at each position, and
    (once asked for) the vectors in position order and the timeline."""

    version: int
    memory: Memory
    seqs: np.ndarray
    vectors: np.ndarray | None = None
    carried: tuple | None = None  # (seqs, vectors) of an older copy: only newer rows are read
    timeline: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _extend(memory: Memory, seqs: np.ndarray, fresh: list[Message]) -> tuple[Memory, np.ndarray]:
    """``memory`` plus ``fresh`` (``Message.id`` = seq), as a new ``Memory``."""
    if not fresh:
        return memory, seqs
    fresh.sort(key=lambda m: (m.timestamp, m.id))
    new_seqs = np.array([m.id for m in fresh], dtype=np.int64)
    if not len(memory) or fresh[0].timestamp >= memory.timestamps[-1]:  # appended: copy the lists, not the messages
        out = memory.copy()
        out.append(fresh)
        return out, np.concatenate([seqs, new_seqs])
    old = [replace(m, id=int(s)) for m, s in zip(memory.messages, seqs)]
    out = Memory(memory.key, old + fresh, memory.granularity)  # sorts by (time, seq), renumbers
    seq_of_key = {m.key: m.id for m in old + fresh}
    return out, np.array([seq_of_key[m.key] for m in out.messages], dtype=np.int64)


class MemoryView:
    def __init__(self, name: str, granularity: str):
        self.name, self.granularity = name, granularity
        self._latest = Copy(-1, Memory(name, [], granularity), np.zeros(0, dtype=np.int64))
        self._lock = threading.Lock()
        self._gaps: tuple[int, Gaps] = (-1, NO_GAPS)  # (version, its gaps)

    def at(self, conn, memory_id: int | None, version: int, rewritten: int = 0) -> Copy:
        """The copy at ``version`` (the snapshot ``conn`` reads), built from the newest one
        when it is older and no delete or update (at version ``rewritten``) came after it,
        else read whole (a reader still on an older snapshot; a memory rewritten since)."""
        with self._lock:
            base = self._latest
        if base.version == version:
            return base
        if memory_id is None:
            return Copy(version, Memory(self.name, [], self.granularity), np.zeros(0, dtype=np.int64))
        extend = rewritten <= base.version < version
        start = base if extend else Copy(-1, Memory(self.name, [], self.granularity), base.seqs[:0])
        last_seq = int(start.seqs.max()) if len(start.seqs) else 0
        rows = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM tider_messages WHERE memory_id = %s AND seq > %s ORDER BY seq",
            (memory_id, last_seq),
        ).fetchall()
        memory, seqs = _extend(start.memory, start.seqs, [message_of(r) for r in rows])
        copy = Copy(version, memory, seqs)
        if start.vectors is not None:  # carry the vectors over: read only the new ones when asked
            copy.carried = (start.seqs, start.vectors)
        with self._lock:
            if version > self._latest.version:
                self._latest = copy
        return copy

    @staticmethod
    def vectors(conn, memory_id: int, copy: Copy) -> np.ndarray:
        """The vectors in position order (read once per message per process)."""
        with copy.lock:
            if copy.vectors is not None:
                return copy.vectors
            old_seqs, old = copy.carried or (copy.seqs[:0], None)
            last = int(old_seqs.max()) if len(old_seqs) else 0
            rows = (
                conn.cursor(binary=True)
                .execute(
                    "SELECT seq, embedding FROM tider_messages WHERE memory_id = %s AND seq > %s ORDER BY seq",
                    (memory_id, last),
                )
                .fetchall()
            )
            seqs = np.concatenate([old_seqs, np.array([r[0] for r in rows], dtype=np.int64)])
            parts = ([old] if old is not None else []) + ([np.stack([as_array(r[1]) for r in rows])] if rows else [])
            everything = np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, 0), np.float32)
            order = np.argsort(seqs)
            copy.vectors = everything[order[np.searchsorted(seqs[order], copy.seqs)]] if len(copy.seqs) else everything
            copy.carried = None
            return copy.vectors

    def gaps(self, conn, row):
        """``row``'s gaps (``tider.memory.pg.gaps``), read once per version; none read while it counts 0."""
        if not row.gaps:
            return NO_GAPS
        with self._lock:
            cached = self._gaps
        if cached[0] == row.version:
            return cached[1]
        gaps = Gaps.read(conn, row.id, row.gaps)
        with self._lock:
            if row.version >= self._gaps[0]:
                self._gaps = (row.version, gaps)
        return gaps

    def timeline(self, conn, memory_id: int | None, copy: Copy, embedder, gaps=None):
        from tider.retrieval.timeline import Timeline

        with copy.lock:
            if copy.timeline is not None:
                return copy.timeline
        if memory_id is None:
            return Timeline(copy.memory, [], np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32), embedder)
        vectors = self.vectors(conn, memory_id, copy)
        rows = (
            conn.cursor(binary=True)
            .execute(
                "SELECT start_pos, centroid FROM tider_timeline WHERE memory_id = %s ORDER BY start_pos", (memory_id,)
            )
            .fetchall()
        )
        centroids = np.stack([as_array(r[1]) for r in rows]) if rows else np.zeros((0, vectors.shape[1]))
        starts = (gaps or NO_GAPS).dense(np.array([r[0] for r in rows], dtype=np.int64))
        timeline = Timeline(copy.memory, [int(p) for p in starts], centroids, vectors, embedder)
        with copy.lock:
            copy.timeline = copy.timeline or timeline
            return copy.timeline

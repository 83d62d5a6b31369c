"""Stored positions and the positions the API reports, across the gaps deletes leave.

A delete removes its rows and records their stored positions in ``tider_gaps`` instead of
renumbering every later row (which made deleting an old message cost the whole memory:
its rows, postings and HNSW entries rewritten). The API, the ranking and the embedded
store speak dense positions (0 .. n-1 in (time, seq) order), so a reader translates:

- stored -> dense: a stored position less the gaps below it;
- dense -> stored: the inverse, one bisection over the gaps less their rank.

A reader reads the gaps once per memory version (none are read while the memory row
counts 0, the case of a memory nothing was deleted from). Renumbering the tail (an add
older than the newest message) closes the gaps it passes; when the gaps outnumber the
messages a delete closes them all (``tider.memory.pg.manage.compact``), so a reader's
list stays shorter than the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gaps:
    """The sorted stored positions no message holds, in one snapshot."""

    holes: np.ndarray  # int64, sorted

    @classmethod
    def read(cls, conn, memory_id: int, count: int) -> Gaps:
        if not count:
            return NO_GAPS
        row = conn.execute(
            "SELECT coalesce(array_agg(pos ORDER BY pos), '{}') FROM tider_gaps WHERE memory_id = %s", (memory_id,)
        ).fetchone()
        return cls(np.asarray(row[0], dtype=np.int64))

    def dense(self, stored):
        """Dense position of each stored one (of a live message, or a bound such as a cut:
        then the number of messages before it)."""
        if not len(self.holes):
            return stored
        stored = np.asarray(stored, dtype=np.int64)
        out = stored - np.searchsorted(self.holes, stored)
        return int(out) if out.ndim == 0 else out

    def stored(self, dense):
        """Stored position of the message at each dense position."""
        if not len(self.holes):
            return dense
        dense = np.asarray(dense, dtype=np.int64)
        # the gap of rank j lies before dense position holes[j] - j: count those at or before
        out = dense + np.searchsorted(self.holes - np.arange(len(self.holes)), dense, side="right")
        return int(out) if out.ndim == 0 else out

    def bound(self, dense_cut: int) -> int:
        """The stored bound of the first ``dense_cut`` positions (exclusive)."""
        return 0 if dense_cut <= 0 else int(self.stored(dense_cut - 1)) + 1


NO_GAPS = Gaps(np.zeros(0, dtype=np.int64))

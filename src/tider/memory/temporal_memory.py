"""``TemporalMemory(path, ...)``: open a memory, on the backend its path names.

```python
from tider import TemporalMemory
mem = TemporalMemory("stores/team-chat")          # creates the directory or opens the store
mem.add([{"key": "m1", "text": "...", "timestamp": "2024-02-01T10:00:00", "speaker": "ana"}])
hits = mem.search("what did we decide at the offsite?", asked_at="2024-03-01T09:00:00", k=20)
hits.keys, hits.scores, hits.messages, hits.prediction
```

A directory, or ``None`` for a memory in RAM, opens an ``EmbeddedMemory``
(``tider.memory.embedded``); a PostgreSQL URL with a ``name`` opens a ``PostgresMemory``
(``tider.memory.pg``). Both are ``MemoryBase``s (``tider.memory.base``): same methods,
same query code. A function, as ``threading.Lock`` long was, so that the call users write
names the concept rather than the backend; ``isinstance`` checks take ``MemoryBase``.
"""

from __future__ import annotations

from pathlib import Path

from tider.memory.base import MemoryBase
from tider.memory.pg import is_database_url


def TemporalMemory(path: str | Path | None = None, **options) -> MemoryBase:
    """The memory at ``path``; ``options`` are the backend's (``config``, ``embedder``,
    ``name``, ``granularity``, ``locator``, ``source_options``, ``cache_elements``, and
    ``postgres`` for a URL)."""
    if is_database_url(path):
        from tider.memory.pg.memory import PostgresMemory

        return PostgresMemory(path, **options)
    from tider.memory.embedded import EmbeddedMemory

    return EmbeddedMemory(path, **options)

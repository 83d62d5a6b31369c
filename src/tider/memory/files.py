"""The on-disk layout of a memory store, and the writes that keep it crash-safe.

```
DIR/tider_memory.json          manifest: format version, config, embedding model, segment list
DIR/segments/seg-000001.jsonl  the messages of one add, one JSON object per line
DIR/segments/seg-000001.safetensors   their vectors (float32, rows in the same order), and
                               the chunk vectors of their long messages with each one's row
DIR/index/derived.json         which derived-index folder covers how many messages
DIR/index/<name>-<n>/          BM25 (bm25s save, no pickle), faiss HNSW, timeline
DIR/.lock                      held (flock) by the one process that has the store open
```

The manifest is the commit point. An ``add`` writes its segment files under temporary
names, fsyncs and renames them, then writes the manifest that lists them the same way
(temp file, fsync, ``os.replace``, fsync of the folder). A kill at any moment leaves
either the old manifest (the new segment files are orphans, deleted at the next open)
or the new one: a store that opens, with every message of every ``add`` that returned
and none of a half-written one. Derived indexes are caches of the segments: each records
how many messages it covers, and opening a store extends or rebuilds what is stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
MANIFEST = "tider_memory.json"


def _write_lines(path: Path, lines: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


class StoreError(RuntimeError):
    """A store directory that cannot be opened as asked (another process, another format ...)."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` then fsync and rename onto ``path``: readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1, sort_keys=True)))


@contextlib.contextmanager
def _exclusive(path: Path):
    """``path`` open and exclusively locked (``flock``); ``BlockingIOError`` when another holds it."""
    with open(path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class StoreFiles:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.segments = self.root / "segments"
        self.index = self.root / "index"
        for d in (self.root, self.segments, self.index):
            d.mkdir(parents=True, exist_ok=True)
        # Held for the store's lifetime: close() releases it, as does collecting an unclosed store.
        self._held = contextlib.ExitStack()
        try:
            self._held.enter_context(_exclusive(self.root / ".lock"))
        except BlockingIOError:
            raise StoreError(f"{self.root}: the store is open in another process") from None

    def close(self) -> None:
        self._held.close()

    # -- manifest ---------------------------------------------------------------------
    def read_manifest(self) -> dict | None:
        path = self.root / MANIFEST
        if not path.exists():
            return None
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise StoreError(f"{path}: not valid JSON ({err})") from None
        if manifest.get("format_version") != FORMAT_VERSION:
            raise StoreError(
                f"{path}: format version {manifest.get('format_version')!r}, this tider reads {FORMAT_VERSION}"
            )
        return manifest

    def commit(self, manifest: dict) -> None:
        write_json(self.root / MANIFEST, {**manifest, "format_version": FORMAT_VERSION})

    # -- segments ---------------------------------------------------------------------
    def write_segment(self, name: str, lines: list[dict], vectors: np.ndarray, chunks=None) -> None:
        """``chunks``: ``(vectors, rows)`` of the long messages' extra chunks, ``rows`` the
        line each belongs to (``tider.retrieval.embed.message_chunks``)."""
        from safetensors.numpy import save_file

        arrays = {"vectors": np.ascontiguousarray(vectors, dtype=np.float32)}
        if chunks is not None and len(chunks[1]):
            arrays["chunk_vectors"] = np.ascontiguousarray(chunks[0], dtype=np.float32)
            arrays["chunk_rows"] = np.ascontiguousarray(chunks[1], dtype=np.int64)

        atomic_write(
            self.segments / f"{name}.safetensors",
            lambda tmp: save_file(arrays, str(tmp)),
        )
        atomic_write(self.segments / f"{name}.jsonl", lambda tmp: _write_lines(tmp, lines))

    def read_segment(self, name: str) -> tuple[list[dict], np.ndarray]:
        lines = self.read_lines(name)
        vectors = self.read_vectors(name)["vectors"]
        if len(lines) != len(vectors):
            raise StoreError(f"{self.segments / name}: {len(lines)} messages but {len(vectors)} vectors")
        return lines, vectors

    def read_lines(self, name: str) -> list[dict]:
        # split at "\n" only: JSON escapes it in a string, not U+2028 and the like, which splitlines() splits at
        text = (self.segments / f"{name}.jsonl").read_text(encoding="utf-8")
        return [json.loads(x) for x in text.split("\n") if x]

    def replace_lines(self, name: str, at: Sequence[int], line: str) -> None:
        """Lines ``at`` of a segment's messages file become ``line`` (its vectors stay), the
        others copied unparsed: how a deleted text leaves the file."""
        path = self.segments / f"{name}.jsonl"
        lines = path.read_text(encoding="utf-8").split("\n")
        for j in at:
            lines[j] = line
        atomic_write(path, lambda tmp: tmp.write_text("\n".join(lines), encoding="utf-8"))

    def lines_are(self, name: str, at: Sequence[int], line: str) -> bool:
        lines = (self.segments / f"{name}.jsonl").read_text(encoding="utf-8").split("\n")
        return all(lines[j] == line for j in at)

    def read_vectors(self, name: str) -> dict[str, np.ndarray]:
        from safetensors.numpy import load_file

        return load_file(str(self.segments / f"{name}.safetensors"))

    def read_chunks(self, name: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """``(vectors, rows)`` of a segment's chunks (none in a segment written before them)."""
        arrays = self.read_vectors(name)
        if "chunk_rows" not in arrays:
            return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=np.int64)
        return arrays["chunk_vectors"], arrays["chunk_rows"]

    def remove_unlisted(self, keep: set[str]) -> None:
        """Delete segment files no manifest lists (what a killed ``add`` or merge left)."""
        for path in self.segments.iterdir():
            stem = path.name.split(".")[0] if not path.name.startswith(".") else None
            if stem is None or stem not in keep:
                path.unlink(missing_ok=True)

    # -- derived indexes --------------------------------------------------------------
    def derived(self) -> dict:
        path = self.index / "derived.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def save_derived(self, name: str, covers: int, save: Callable[[Path], None], extra: dict | None = None) -> None:
        """Write a derived index into a fresh folder, then point ``derived.json`` at it."""
        folder = self.index / f"{name}-{covers}"
        shutil.rmtree(folder, ignore_errors=True)
        save(folder)
        fsync_dir(folder)
        meta = self.derived()
        old = meta.get(name, {}).get("dir")
        meta[name] = {"dir": folder.name, "messages": covers, **(extra or {})}
        write_json(self.index / "derived.json", meta)
        if old and old != folder.name:
            shutil.rmtree(self.index / old, ignore_errors=True)

    def derived_dir(self, name: str) -> tuple[Path, dict] | None:
        entry = self.derived().get(name)
        if not entry or not (self.index / entry["dir"]).is_dir():
            return None
        return self.index / entry["dir"], entry

    def drop_derived(self, names: Sequence[str] | None = None) -> None:
        """Forget the derived indexes ``names`` (None: all of them, the rows changed under them)."""
        listed = self.derived()
        if names is not None and not set(names) & set(listed):
            return
        kept = {} if names is None else {k: v for k, v in listed.items() if k not in names}
        write_json(self.index / "derived.json", kept)
        self.remove_stale_derived()

    def remove_stale_derived(self) -> None:
        listed = {e["dir"] for e in self.derived().values()}
        for path in self.index.iterdir():
            if path.is_dir() and path.name not in listed:
                shutil.rmtree(path, ignore_errors=True)

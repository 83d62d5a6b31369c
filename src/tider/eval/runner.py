"""Stage-wise, append-only, resumable runs (T-Mem App. D).

A ``Stage`` is a name plus a function from one item (e.g. a query) to a JSON-able
record. ``StageRunner.run(stage, items, key=...)`` appends one line per item to
``<out>/<stage>.jsonl``::

    {"key": ..., "stage": ..., "status": "ok" | "error", "record": {...}, "error": "..."}

On restart the file is read back: keys whose latest line is ``ok`` are skipped, failed
keys are retried, a torn last line (a kill mid-write) is ignored and re-done. Lines are
flushed one by one, so a SIGKILL loses at most the record being written, and the result
(latest ``ok`` record per key, in item order) never has duplicates or gaps.

``<out>/manifest.json`` holds the run's config, package versions and data hash; a
restart with a different manifest refuses to mix results (pass ``overwrite=True`` to
start over). Engineer C's QA stages and E's compare reuse this runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tqdm.auto import tqdm

VERSIONED_PACKAGES = ("tider", "torch", "transformers", "trl", "sentence-transformers", "faiss-cpu", "bm25s", "rank-bm25",
                      "scikit-learn", "numpy", "scipy")


@dataclass
class Stage:
    name: str
    fn: Callable[[object], dict]


def package_versions(names: Iterable[str] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    out["python"] = platform.python_version()
    return out


def file_hash(path: str | os.PathLike | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_records(path: str | os.PathLike) -> dict[str, dict]:
    """Latest line per key (torn or unparsable lines are skipped)."""
    latest: dict[str, dict] = {}
    path = Path(path)
    if not path.exists():
        return latest
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "key" in row:
                latest[row["key"]] = row
    return latest


class StageRunner:
    def __init__(self, out_dir: str | os.PathLike, manifest: dict, overwrite: bool = False):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "manifest.json"
        manifest = json.loads(json.dumps(manifest, default=str))  # normalise to what JSON round-trips
        if path.exists() and not overwrite:
            old = json.loads(path.read_text())
            if old.get("config") != manifest.get("config") or old.get("data_hash") != manifest.get("data_hash"):
                raise ValueError(f"{path} was written by a run with a different config or data; use another --out "
                                 "or overwrite to start over")
        if overwrite:
            for stale in self.out_dir.glob("*.jsonl"):
                stale.unlink()
        manifest.setdefault("versions", package_versions())
        manifest["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        self.manifest = manifest

    def stage_path(self, name: str) -> Path:
        return self.out_dir / f"{name}.jsonl"

    def run(self, stage: Stage, items: Sequence, key: Callable[[object], str], progress: bool = True) -> dict[str, dict]:
        """Run ``stage`` on the items not finished yet; return ``{key: record}`` for every
        item that succeeded (now or in an earlier run), in item order."""
        path = self.stage_path(stage.name)
        done = {k for k, row in read_records(path).items() if row.get("status") == "ok"}
        keys = [key(it) for it in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"stage {stage.name!r}: item keys are not unique")
        todo = [(k, it) for k, it in zip(keys, items) if k not in done]
        delay = float(os.environ.get("TIDER_STAGE_DELAY_S", "0"))  # fault-injection hook for resume tests
        if todo:
            # A killed writer may leave a line without its newline: start on a fresh line.
            if path.exists() and path.stat().st_size:
                with open(path, "rb+") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
            with open(path, "a", encoding="utf-8") as f:
                for k, item in tqdm(todo, desc=stage.name, disable=not progress, leave=False):
                    try:
                        row = {"key": k, "stage": stage.name, "status": "ok", "record": stage.fn(item)}
                    except Exception as err:  # recorded, retried on the next run, never silently dropped
                        row = {"key": k, "stage": stage.name, "status": "error", "error": repr(err),
                               "traceback": traceback.format_exc(limit=5)}
                    f.write(json.dumps(row, default=str) + "\n")
                    f.flush()
                    if delay:
                        time.sleep(delay)
        latest = read_records(path)
        return {k: latest[k]["record"] for k in keys if k in latest and latest[k].get("status") == "ok"}

    def errors(self, name: str) -> dict[str, str]:
        return {k: row.get("error", "") for k, row in read_records(self.stage_path(name)).items() if row.get("status") != "ok"}

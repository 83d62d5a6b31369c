"""Stage-wise, append-only, resumable runs (T-Mem App. D).

A ``Stage`` is a name plus a function from one item (e.g. a query) to a JSON-able
record. ``StageRunner.run(stage, items, key=...)`` appends one line per item to
``<out>/<stage>.jsonl``::

    {"key": ..., "stage": ..., "status": "ok" | "partial" | "error", "record": {...},
     "fingerprint": "...", "error": "..."}

On restart the file is read back: keys whose latest line is ``ok`` are skipped, failed
keys are retried, a torn last line (a kill mid-write) is ignored and re-done.
``partial`` records (the stage's ``retry_if`` said so, e.g. an LLM call that still failed
after its bounded retries) are used by this run but retried by the next one. A record
also stores its input ``fingerprint`` (e.g. a hash of the upstream record it was built
from): when the input changed, because an upstream stage was retried, the key is redone,
so a resumed run never mixes a new upstream result with a stale downstream one. Lines are
flushed one by one, so a SIGKILL loses at most the record being written, and the result
(latest ``ok`` record per key, in item order) never has duplicates or gaps.

``<out>/manifest.json`` holds the run's config, package versions and data hash; a
restart with a different manifest refuses to mix results (pass ``overwrite=True`` to
start over). ``tider eval retrieval``, ``eval qa`` and ``eval compare`` all run on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

VERSIONED_PACKAGES = (
    "tider",
    "torch",
    "transformers",
    "trl",
    "sentence-transformers",
    "faiss-cpu",
    "bm25s",
    "rank-bm25",
    "scikit-learn",
    "numpy",
    "scipy",
)


@dataclass
class Stage:
    name: str
    fn: Callable[[object], dict]
    # record -> True when the record is usable now but should be retried on the next run
    retry_if: Callable[[dict], bool] | None = None


def fingerprint_of(*records: object) -> str:
    """A short, stable hash of JSON-able inputs (used as a stage's input fingerprint)."""
    blob = json.dumps(records, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
        # A run that stopped before writing any record (e.g. a refused window source) leaves
        # nothing a new config could be mixed with.
        has_records = any(f.stat().st_size for f in self.out_dir.glob("*.jsonl"))
        if path.exists() and has_records and not overwrite:
            old = json.loads(path.read_text())
            if old.get("config") != manifest.get("config") or old.get("data_hash") != manifest.get("data_hash"):
                raise ValueError(
                    f"{path} was written by a run with a different config or data; use another --out "
                    "or overwrite to start over"
                )
        if overwrite:
            for stale in self.out_dir.glob("*.jsonl"):
                stale.unlink()
        manifest.setdefault("versions", package_versions())
        manifest["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        self.manifest = manifest

    def stage_path(self, name: str) -> Path:
        return self.out_dir / f"{name}.jsonl"

    def run(
        self,
        stage: Stage,
        items: Sequence,
        key: Callable[[object], str],
        progress: bool = True,
        fingerprint: Callable[[object], str] | None = None,
    ) -> dict[str, dict]:
        """Run ``stage`` on the items not finished yet; return ``{key: record}`` for every
        item that succeeded (now or in an earlier run), in item order. ``fingerprint(item)``
        names the stage's input: a finished record with another fingerprint is redone."""
        path = self.stage_path(stage.name)
        keys = [key(it) for it in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"stage {stage.name!r}: item keys are not unique")
        prints = {k: fingerprint(it) for k, it in zip(keys, items)} if fingerprint else {}
        done = {
            k
            for k, row in read_records(path).items()
            if row.get("status") == "ok" and row.get("fingerprint") == prints.get(k)
        }
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
                        record = stage.fn(item)
                        partial = bool(stage.retry_if and stage.retry_if(record))
                        row = {
                            "key": k,
                            "stage": stage.name,
                            "status": "partial" if partial else "ok",
                            "record": record,
                        }
                    except Exception as err:  # recorded, retried on the next run, never silently dropped
                        logger.debug("%s: %s failed", stage.name, k, exc_info=True)
                        row = {
                            "key": k,
                            "stage": stage.name,
                            "status": "error",
                            "error": repr(err),
                            "traceback": traceback.format_exc(limit=5),
                        }
                    if k in prints:
                        row["fingerprint"] = prints[k]
                    f.write(json.dumps(row, default=str) + "\n")
                    f.flush()
                    if delay:
                        time.sleep(delay)
        latest = read_records(path)
        return {k: latest[k]["record"] for k in keys if k in latest and latest[k].get("status") in ("ok", "partial")}

    def errors(self, name: str) -> dict[str, str]:
        """Keys whose latest line is an exception (``partial`` records are not errors)."""
        return {
            k: row.get("error", "")
            for k, row in read_records(self.stage_path(name)).items()
            if row.get("status") == "error"
        }

    def raise_if_failed(self, name: str) -> None:
        """Stop the run when a stage left errors: later stages would build on missing records."""
        failed = self.errors(name)
        if failed:
            key, error = next(iter(failed.items()))
            raise RuntimeError(
                f"{name}: {len(failed)} queries failed (e.g. {key}: {error}); "
                f"rerun to retry them, see {self.stage_path(name)}"
            )

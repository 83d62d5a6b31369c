"""Where the public benchmarks come from, and ``get``: download one, checksummed, laid out as
its loader reads it (``tider data get NAME --out DIR``).

``DIR/NAME/`` receives the files, ``SOURCE.md`` (where they came from, their licence) and
``SHA256SUMS``. A file whose checksum tider pins (the RealMem personas tider was developed
on, at the repository commit named below) must match it; a file with no pinned checksum
(LoCoMo and LongMemEval, which tider only ever saw as subsets) is recorded on its first
download and must match that record afterwards, so a changed upstream file is an error, not
a silently different benchmark. A file already there with the right checksum is kept.
Each file is written to a temporary name and renamed once verified: an interrupted
download leaves nothing half-written under its real name.

``mirror``: a base URL (``file://`` works) laid out like the output, ``BASE/NAME/FILE``,
read instead of the public URLs (a cluster's local copy; the tests, which touch no network).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REALMEM_COMMIT = "067c486a"  # the RealMemBench commit the personas below were taken from
REALMEM_SHA256 = {
    "Adeleke_Okonjo": "9dc2a8bf2777c182108b3859be6987b4203b65bd6df5cbb6e1a02e4e9f871fdb",
    "Ethan_Hunt": "67bd20d962cd0b01c1531cc82a73a0b1a1e58ef17db6e2f743fc9b35273734ac",
    "Kenta_Tanaka": "b8fe2e606db96dbce1ffa0ab7c21b23ce83d4b5d472d80cd4bd23cd8a259d397",
    "Kim_Ji_young": "e3e286120bc5e42d3dbe513d720f969ecebf3518fbe1a4782595e927474356a9",
    "Liam_O_Connor": "2427ab7d7012b28c0da9b2a70b1763cb60630f5198cf6eeed1ee68d0271c551c",
    "Lin_Wanyu": "a7a751066c48e829b3012a94f2b365febd0e6fb6db454a6d5f4ec01f9c55008a",
    "Oliver_Smith": "25a829eb690d7f81bd47141a0cd7c174e1aa98d899111d8b04e9115f0b92e1f3",
}


@dataclass(frozen=True)
class File:
    name: str  # its name under DIR/NAME/
    url: str
    sha256: str | None = None  # pinned; None: recorded on the first download


@dataclass(frozen=True)
class Source:
    name: str
    licence: str
    homepage: str
    files: tuple[File, ...]
    note: str = ""


REALMEM_RAW = "https://raw.githubusercontent.com/zhiyuan5986/RealMemBench/main/dataset"
SOURCES = {
    "locomo": Source(
        "locomo",
        "CC BY-NC 4.0 (non-commercial)",
        "https://github.com/snap-research/locomo",
        (File("locomo10.json", "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"),),
        "10 conversations; --dataset locomo --path DIR/locomo/locomo10.json",
    ),
    "longmemeval": Source(
        "longmemeval",
        "MIT",
        "https://github.com/xiaowu0162/LongMemEval",
        (
            File(
                "longmemeval_s.json",
                "https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned/resolve/main/longmemeval_s_cleaned.json",
            ),
        ),
        "500 questions, the cleaned release; --dataset longmemeval --path DIR/longmemeval/longmemeval_s.json",
    ),
    "realmem": Source(
        "realmem",
        "Apache-2.0",
        "https://github.com/zhiyuan5986/RealMemBench",
        tuple(
            File(f"{p}_dialogues_256k.json", f"{REALMEM_RAW}/{p}_dialogues_256k.json", sha)
            for p, sha in REALMEM_SHA256.items()
        ),
        f"the 7 personas tider was developed on (commit {REALMEM_COMMIT}; the benchmark has 3 more); "
        "--dataset realmem --path DIR/realmem",
    ),
}


class DownloadError(RuntimeError):
    """A file could not be fetched, or is not the file it should be."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _recorded(folder: Path) -> dict[str, str]:
    sums = folder / "SHA256SUMS"
    if not sums.exists():
        return {}
    return {name: sha for sha, name in (line.split(None, 1) for line in sums.read_text().splitlines() if line.strip())}


def _fetch(url: str, dest: Path, expected: str | None) -> str:
    """``url`` into ``dest`` through a temporary file; its checksum, checked if ``expected``."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"{url}: {err}") from None
    got = sha256_of(tmp)
    if expected is not None and got != expected:
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"{url}: sha256 {got}, expected {expected}: not the file tider knows; nothing written")
    os.replace(tmp, dest)
    return got


def get(name: str, out: str | os.PathLike, mirror: str | None = None, log=print) -> Path:
    """Download benchmark ``name`` into ``out/name/``; returns that folder."""
    if name not in SOURCES:
        raise DownloadError(f"unknown dataset {name!r}; known: {', '.join(sorted(SOURCES))}")
    source = SOURCES[name]
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    recorded = _recorded(folder)
    log(f"{name}: {source.homepage}, licence {source.licence}")
    for f in source.files:
        expected = f.sha256 or recorded.get(f.name)
        dest = folder / f.name
        if dest.exists() and expected is not None and sha256_of(dest) == expected:
            log(f"  {f.name}: present, sha256 ok")
            continue
        url = f"{mirror.rstrip('/')}/{name}/{f.name}" if mirror else f.url
        recorded[f.name] = _fetch(url, dest, expected)
        log(f"  {f.name}: {dest.stat().st_size:,} bytes, sha256 {recorded[f.name][:16]}...")
    (folder / "SHA256SUMS").write_text("".join(f"{sha}  {n}\n" for n, sha in sorted(recorded.items())))
    (folder / "SOURCE.md").write_text(
        f"# {name}\n\nFrom {source.homepage}, licence {source.licence}.\n{source.note}\n\n"
        + "".join(f"- `{f.name}`: {f.url}\n" for f in source.files)
    )
    log(f"  -> {folder} ({source.note})")
    return folder

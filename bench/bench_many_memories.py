"""One memory service, many small memories: the server's resident memory (RSS) as memories open.

Starts ``tider memory serve`` as a user would (a directory store, an API key, loopback),
then for each of ``--memories`` memories (``user-0000`` ...) adds ``--messages`` messages and
searches it once, reading the server's RSS (``/proc/PID/status``, VmRSS) as it goes. Run
twice: with the default bound on open memories (``TIDER_MAX_OPEN_MEMORIES``, 256: the least
recently used close) and with every memory kept open (the bound set to ``--memories``). One
embedder (MiniLM) serves every memory in both.

    .venv/bin/python bench/bench_many_memories.py --out bench/results/bench_many_memories.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench_service import start_service
from benchlib import commit, hardware, load

CHECKPOINTS = (1, 10, 100, 250, 500, 1000, 2000, 5000)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for process {pid}")


def one_run(memories: int, messages: int, max_open: int) -> dict:
    import httpx

    token = "bench-key"
    root = tempfile.mkdtemp(prefix="tider-many-")
    server, url = start_service(root, token, {"TIDER_MAX_OPEN_MEMORIES": str(max_open)})
    out = {"max_open": max_open, "rss_mib_started": rss_mib(server.pid), "rss_mib": {}}
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
            t0 = time.perf_counter()
            for i in range(memories):
                name = f"user-{i:04d}"
                batch = [
                    {
                        "key": f"m{j}",
                        "text": f"note {j} of {name}: the plan for week {j}",
                        "timestamp": f"2024-01-0{1 + j}T10:00:00",
                    }
                    for j in range(messages)
                ]
                client.post(f"{url}/memories/{name}/messages", json={"messages": batch}).raise_for_status()
                body = {"text": "what was the plan?", "k": 3, "windows": "none"}
                client.post(f"{url}/memories/{name}/search", json=body).raise_for_status()
                if i + 1 in CHECKPOINTS:
                    out["rss_mib"][str(i + 1)] = rss_mib(server.pid)
            out["seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=5)
    ap.add_argument("--out", default="runs/bench_many_memories.json")
    args = ap.parse_args()
    runs = [one_run(args.memories, args.messages, bound) for bound in (256, args.memories)]
    result = {
        "commit": commit(),
        "command": " ".join(["bench/bench_many_memories.py", *sys.argv[1:]]),
        "hardware": hardware(),
        "memories": args.memories,
        "messages_each": args.messages,
        "runs": runs,
        "load_1min": load(),
    }
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

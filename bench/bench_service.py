"""A bounded loopback load test of the HTTP memory service (``tider memory serve``).

Starts the server as a user would (a subprocess on 127.0.0.1, a free port, an API key),
adds one synthetic-benchmark conversation through ``POST /messages`` in batches, then
sends ``--requests`` searches (the benchmark's own questions, ``windows`` none and
timeline alternating) from ``--concurrency`` client threads, and reports throughput and
the client-side latency p50/p95/p99. Every request has a timeout; the loop stops after
``--requests`` or ``--max-seconds``, whichever comes first, and the server is stopped.

    .venv/bin/python bench/bench_service.py --out runs/bench_service.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from benchlib import hardware, load


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(root: str, token: str, env: dict | None = None):
    """``tider memory serve`` on ``root`` as a user starts it (an API key, a free loopback
    port); ``(process, url)`` once ``/health`` answers."""
    import httpx

    port = free_port()
    env = {**os.environ, "TIDER_API_KEY": token, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    server = subprocess.Popen(
        [sys.executable, "-m", "tider.cli", "memory", "serve", "--path", root, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError("the service did not start")


def main() -> None:
    import httpx

    from tider.data import load_dataset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--out", default="runs/bench_service.json")
    args = parser.parse_args()

    ds = load_dataset("synthetic")
    key = min(ds.memories)
    memory = ds.memories[key]
    questions = [q for q in ds.queries if q.memory_key == key]
    token = "bench-key"
    headers = {"Authorization": f"Bearer {token}"}
    root = tempfile.mkdtemp(prefix="tider-bench-service-")
    server, url = start_service(root, token)
    try:
        with httpx.Client(headers=headers, timeout=60) as client:
            t0 = time.perf_counter()
            for i in range(0, len(memory), 200):
                batch = [
                    {
                        "key": m.key,
                        "text": m.text,
                        "timestamp": m.timestamp.isoformat(),
                        "speaker": m.speaker,
                        "session": m.session,
                    }
                    for m in memory.messages[i : i + 200]
                ]
                client.post(f"{url}/memories/{key}/messages", json={"messages": batch}).raise_for_status()
            add_s = time.perf_counter() - t0
            bodies = [
                {
                    "text": questions[i % len(questions)].text,
                    "asked_at": questions[i % len(questions)].asked_at.isoformat(),
                    "k": 20,
                    "windows": "timeline" if i % 2 else "none",
                }
                for i in range(args.requests)
            ]
            for body in bodies[:2]:  # warm: BM25 and the timeline are built on the first search that needs them
                client.post(f"{url}/memories/{key}/search", json=body).raise_for_status()
            deadline = time.perf_counter() + args.max_seconds

            def one(body):
                if time.perf_counter() > deadline:
                    return None
                t = time.perf_counter()
                status = client.post(f"{url}/memories/{key}/search", json=body).status_code
                return status, 1e3 * (time.perf_counter() - t)

            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = [r for r in pool.map(one, bodies) if r is not None]
            wall = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait(timeout=60)
    lat = np.array([ms for _, ms in results])
    out = {
        "hardware": hardware(),
        "server": "uvicorn, one process, FastAPI thread pool",
        "memory_messages": len(memory),
        "add_s": round(add_s, 2),
        "requests": len(results),
        "concurrency": args.concurrency,
        "non_200": sum(s != 200 for s, _ in results),
        "throughput_rps": round(len(results) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p95_ms": round(float(np.percentile(lat, 95)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "load_1min": load(),
    }
    print(json.dumps(out, indent=1))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

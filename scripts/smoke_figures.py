"""One line per step of scripts/gpu_smoke.py, read from what the step wrote under OUT."""

from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path


def preflight(out: Path, run) -> str:
    import torch
    import transformers
    import vllm

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    python = sys.version.split()[0]
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}"
    return f"{device}: python {python}, {versions}"


def data(out: Path, run) -> str:
    m, q = (len((out / "data" / f"{n}.jsonl").read_text().splitlines()) for n in ("messages", "queries"))
    return f"{m} messages, {q} questions"


def embedder(out: Path, run) -> str:
    c = json.loads((out / "embedder" / "bert" / "config.json").read_text())
    shape = f"{c['num_hidden_layers']} layers x {c['hidden_size']}, vocab {c['vocab_size']}"
    return f"random-init sentence-transformer: {shape}"


def base(out: Path, run) -> str:
    from safetensors import safe_open

    c, n = json.loads((out / "base" / "config.json").read_text()), 0
    for f in glob.glob(str(out / "base" / "*.safetensors")):
        with safe_open(f, "pt") as s:
            n += sum(math.prod(s.get_slice(k).get_shape()) for k in s.keys())  # noqa: SIM118  safe_open is no dict
    shape = f"{c['num_hidden_layers']} layers x {c['hidden_size']}, vocab {c['vocab_size']}, {c['dtype']}"
    return f"{n / 1e6:,.1f}M params: {shape}"


def _history(folder: Path, key: str) -> list[dict]:
    return [x for x in json.loads((folder / "trainer_state.json").read_text())["log_history"] if key in x]


def sft(out: Path, run) -> str:
    h = _history(out / "sft", "loss")
    return f"loss {h[0]['loss']:.3f} -> {h[-1]['loss']:.3f} ({h[-1]['step']} steps)"


def grpo(out: Path, run) -> str:
    h = _history(out / "grpo", "reward")
    ac = [x["rewards/answer_correct/mean"] for x in h if "rewards/answer_correct/mean" in x]
    calls, fails = (sum(x.get(k, 0) for x in h) for k in ("reader/calls", "reader/failures"))
    reader = f", answer_correct {sum(ac) / len(ac):.3f} ({calls:.0f} reader calls, {fails:.0f} failed)" if ac else ""
    n = h[-1]["step"]
    return f"reward {sum(x['reward'] for x in h) / len(h):.3f} over {n} step{'s' * (n != 1)}{reader}"


def export(out: Path, run) -> str:
    r = json.loads((out / "export" / "export_report.json").read_text())
    where = f"{r['dtype']} on {r['device']}"
    return f"greedy identical {r['greedy_identical']}, max logit diff {r['max_abs_logit_diff']:.2g}, {where}"


def compare(out: Path, run) -> str:
    t = json.loads((out / "compare" / "compare.json").read_text())["table"]
    r = ", ".join(f"{m} {t[m]['recall@5']:.3f}/{t[m]['recall@20']:.3f}" for m in t)
    return f"recall@5/@20 {r}; locator parse_fail {t['locator']['parse_fail']:.2f} (n {t['locator']['n']})"


FIGURES = {
    "preflight": preflight,
    "data": data,
    "embedder": embedder,
    "base": base,
    "sft": sft,
    "reader": lambda out, run: "vLLM serving models/tiny-locator-v3 as 'reader'",
    "grpo": grpo,
    "export": export,
    "serve": lambda out, run: "vLLM serving the export as 'tider-locator'",
    "compare": compare,
}

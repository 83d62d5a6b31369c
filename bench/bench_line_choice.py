"""Which line should the locator pick, and which does it pick? A diagnosis of the real-data
locator on the train and validation splits of ``configs/sft/tiny-real.yaml`` (never test).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_line_choice.py --checkpoint runs/bench_real/grpo \
        --out bench/results/line_choice.json   # ~13 min on 2 cores

For every question with evidence, under the shipped retriever, the evidence gain over no
window (``tider.scoring.evidence_gain`` at k 20, per question) of:

- each shown line alone (the answer ``{"mark": ...}`` / ``{"entry": k}``), and ``oracle``:
  the best of them or no window (the most a one-line locator can reach with this prompt);
- ``H1``: the top hit's line (what ``top-day`` does, with the line's span), and ``H1-3``:
  the lines of the first three hits together (learning-free);
- ``model``: the line (or no window) the checkpoint gives the highest probability among
  these single-line answers, teacher-forced (its greedy answer is almost always one line);
- ``probe``: a least-squares fit of a line's gain on what the prompt shows about it (its
  hit mark, ``h<n>/<m>`` counts, ``R``/``T``/cue marks, span), fitted on train, choosing
  the best predicted line or none: how much the visible marks alone can teach.

Writes the mean gains per split and dataset to ``--out`` (JSON) and prints them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import ROOT, hardware, recipe_args

SHARED = ROOT.parent / "shared" / "data"
LINE = re.compile(r"^\S+(?P<span> \.\. \S+)?(?P<marks>(?: [A-Z][^ |]*)*) \| h(?P<n>\d+)/(?P<m>\d+) \|.*\| L(?P<k>\d+)$")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/bench_real/grpo")
    ap.add_argument("--out", default="bench/results/line_choice.json")
    ap.add_argument("--locomo", default=str(SHARED / "locomo" / "locomo_dev.json"))
    ap.add_argument("--realmem", default=str(SHARED / "realmem"))
    return ap.parse_args(argv)


def line_features(prompt: str) -> dict[int, list[float]]:
    """Line number -> what the prompt shows about it."""
    out = {}
    for text in prompt.splitlines():
        m = LINE.match(text)
        if not m:
            continue
        marks = m["marks"].split()
        hit = next((int(x[1:]) for x in marks if re.fullmatch(r"H\d+", x)), 0)
        n, total = int(m["n"]), int(m["m"])
        out[int(m["k"])] = [
            1.0,
            np.log1p(n),
            np.log1p(total),
            n / max(total, 1),
            *(float(hit == i) for i in range(1, 6)),
            float("R" in marks),
            float("T" in marks),
            float(any(x.startswith("C") for x in marks)),
            float(bool(m["span"])),
        ]
    return out


def answer_logprobs(model, tokenizer, messages, answers) -> list[float]:
    """log P(answer | prompt) of each answer, teacher-forced in one batch."""
    import torch

    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    seqs = []
    for answer in answers:
        full = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": json.dumps(answer)}], tokenize=False, enable_thinking=False
        )
        seqs.append(head + tokenizer(full[len(prompt) :], add_special_tokens=False)["input_ids"])
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    return [
        float(logp[i, torch.arange(len(head) - 1, len(s) - 1), torch.tensor(s[len(head) :])].sum())
        for i, s in enumerate(seqs)
    ]


def question_rows(split, queries, builder, model, tokenizer) -> list[dict]:
    from tider.train.examples import ABSTAIN, line_refs

    rows = []
    for q in queries:
        table = builder.build(q)
        answers = [ABSTAIN] + [{"temporal": True, "windows": [ref]} for ref in line_refs(table)]
        marks = {m for m, _ in table.marks}
        hits = [{"mark": f"H{i}"} for i in (1, 2, 3) if f"H{i}" in marks]
        tops = [{"temporal": True, "windows": hits[:1]}, {"temporal": True, "windows": hits}] if hits else []
        gain = builder.evidence_gains(q, table)
        gains = [gain(a) for a in answers[1:] + tops]
        n = len(answers) - 1
        rows.append(
            {
                "key": q.key,
                "split": split,
                "dataset": "locomo" if q.memory_key.startswith("conv-") else "realmem",
                "gains": [0.0] + gains[:n],
                "h1": gains[n] if hits else 0.0,
                "h1_3": gains[n + 1] if hits else 0.0,
                "logprobs": answer_logprobs(model, tokenizer, table.messages, answers),
                "features": line_features(table.messages[-1]["content"]),
            }
        )
    return rows


def summarize(rows: list[dict], weights: np.ndarray) -> dict:
    def probe(r) -> float:
        scored = [(float(weights @ np.array(f)), k) for k, f in r["features"].items() if k < len(r["gains"])]
        best = max(scored, default=(0.0, 0))
        return r["gains"][best[1]] if best[0] > 0 else 0.0

    return {
        "n": len(rows),
        "H1": float(np.mean([r["h1"] for r in rows])),
        "H1-3": float(np.mean([r["h1_3"] for r in rows])),
        "model": float(np.mean([r["gains"][int(np.argmax(r["logprobs"]))] for r in rows])),
        "model_no_window_share": float(np.mean([int(np.argmax(r["logprobs"])) == 0 for r in rows])),
        "probe": float(np.mean([probe(r) for r in rows])),
        "oracle": float(np.mean([max(r["gains"]) for r in rows])),
    }


def fit_probe(rows: list[dict]) -> np.ndarray:
    x = [f for r in rows for k, f in r["features"].items() if k < len(r["gains"])]
    y = [r["gains"][k] for r in rows for k in r["features"] if k < len(r["gains"])]
    x, y = np.array(x), np.array(y)
    return np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ y)  # ridge 1


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.modules.setdefault("numba", None)
    import torch
    from transformers import AutoModelForCausalLM

    from tider.train.stage import prepare

    overrides = ["--dataset_path", f"{args.locomo},{args.realmem}", "--output_dir", "unused", "--report_to", "none"]
    script_args, _, _ = recipe_args("sft/tiny-real", overrides)
    _, _, tokenizer, builder, splits = prepare(script_args, args.checkpoint, stage="eval")
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    t0, rows = time.time(), []
    for split in ("train", "validation"):
        queries = [q for q in splits[split] if q.gold.evidence_ids and str(q.category) != "5"]
        rows += question_rows(split, queries, builder, model, tokenizer)
    weights = fit_probe([r for r in rows if r["split"] == "train"])
    table = {}
    for split in ("train", "validation"):
        for name in ("locomo", "realmem", "all"):
            chosen = [r for r in rows if r["split"] == split and name in ("all", r["dataset"])]
            table[f"{split}/{name}"] = summarize(chosen, weights)
    result = {"checkpoint": args.checkpoint, "hardware": hardware(), "seconds": time.time() - t0, "gain": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for name, row in table.items():
        print(f"{name:22s}", {k: round(v, 3) for k, v in row.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

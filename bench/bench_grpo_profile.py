"""Where a GRPO step goes: generation, each reward function, the optimizer step, the rest
(forward/backward of the policy and the reference), on the tiny-cpu recipe, with
transformers generation and with vLLM colocated in the trainer.

    .venv/bin/python bench/bench_grpo_profile.py [--steps 6] [--out runs/bench_grpo_profile]

1. `tider sft` of configs/sft/tiny-cpu.yaml, briefly (loss on the completion only), so that
   sampled completions parse and the retrieval rewards really retrieve;
2. `tider grpo --config configs/grpo/tiny-cpu.yaml` twice from that checkpoint, each in
   its own process: `--use_vllm false`, then `--use_vllm true --vllm_mode colocate`.
Timings come from TRL's own profiling contexts (`transformers.generate`, `vLLM.generate`,
`sync_weights`, one per reward function), torch's global optimizer-step hooks and the
trainer's step callbacks; the first step (warm-up, vLLM start) is left out.
Writes OUT/profile.json and prints the README table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = [
    "--synthetic_messages",
    "1600",
    "--synthetic_conversations",
    "4",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
]


def worker(args) -> None:
    """One GRPO run with the timers installed; writes the raw timings as JSON."""
    import transformers
    from transformers import TrainerCallback
    from trl.extras import profiling

    timings: dict = defaultdict(list)
    state = {"step": 0}
    original = profiling.ProfilingContext._log_metrics

    def record(self, duration):
        timings[self.name.split(".", 1)[-1]].append((state["step"], duration))
        return original(self, duration)

    profiling.ProfilingContext._log_metrics = record
    started = {}
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda *a: started.__setitem__("opt", time.perf_counter()))
    register_optimizer_step_post_hook(
        lambda *a: timings["optimizer.step"].append((state["step"], time.perf_counter() - started["opt"]))
    )

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            state["step"], started["step"] = s.global_step + 1, time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            timings["step"].append((state["step"], time.perf_counter() - started["step"]))

    transformers.trainer.DEFAULT_CALLBACKS.append(StepTimer)  # every Trainer built in this process gets it
    from tider.cli import main

    assert main(["grpo", *args.grpo]) == 0
    Path(args.worker).write_text(json.dumps(timings))


def summarize(raw: dict, skip_first: int = 1) -> dict:
    """Mean seconds per step of each timer, over steps after the warm-up."""
    steps = sorted({s for s, _ in raw["step"]})[skip_first:]
    per: dict = {}
    for name, values in raw.items():
        kept = [d for s, d in values if s in steps]
        per[name] = sum(kept) / len(steps) if steps else 0.0
    return {"steps": len(steps), "seconds_per_step": per}


def table(results: dict) -> str:
    import yaml

    rewards = yaml.safe_load((REPO / "configs/grpo/tiny-cpu.yaml").read_text())["reward_funcs"]
    generation = ("transformers.generate", "transformers.generate_batch", "vLLM.generate", "sync_weights")
    rows = [
        ("generation (+ vLLM weight sync)", generation),
        *[(f"reward `{r}`", (r,)) for r in rewards],
        ("optimizer step", ("optimizer.step",)),
    ]
    head = (
        "| part of a GRPO step | "
        + " | ".join(f"{k} (s)" for k in results)
        + " | "
        + " | ".join(f"{k} share" for k in results)
        + " |"
    )
    lines = [head, "|" + "---|" * (1 + 2 * len(results))]
    for label, names in rows:
        secs = [sum(r["seconds_per_step"].get(n, 0.0) for n in names) for r in results.values()]
        shares = [s / r["seconds_per_step"]["step"] for s, r in zip(secs, results.values())]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{s:.3f}" for s in secs)
            + " | "
            + " | ".join(f"{x:.1%}" for x in shares)
            + " |"
        )
    parts = [n for _, names in rows for n in names]
    rest = [
        r["seconds_per_step"]["step"] - sum(r["seconds_per_step"].get(n, 0.0) for n in parts) for r in results.values()
    ]
    lines.append(
        "| rest: policy/reference log-probs, loss, backward | "
        + " | ".join(f"{x:.3f}" for x in rest)
        + " | "
        + " | ".join(f"{x / r['seconds_per_step']['step']:.1%}" for x, r in zip(rest, results.values()))
        + " |"
    )
    rew = [
        sum(r["seconds_per_step"].get(n, 0.0) for n in rewards) / r["seconds_per_step"]["step"]
        for r in results.values()
    ]
    lines.append(
        "| all rewards | " + " | ".join("" for _ in results) + " | " + " | ".join(f"**{x:.1%}**" for x in rew) + " |"
    )
    lines.append(
        "| whole step | "
        + " | ".join(f"{r['seconds_per_step']['step']:.2f}" for r in results.values())
        + " | "
        + " | ".join("100%" for _ in results)
        + " |"
    )
    return "\n".join(lines)


def run(args) -> None:
    from tider import hardware

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }
    sft = out / "sft"
    if not (sft / "tider_locator.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tider.cli",
                "sft",
                "--config",
                str(REPO / "configs/sft/tiny-cpu.yaml"),
                "--model_name_or_path",
                str(out / "base"),
                "--output_dir",
                str(sft),
                "--max_steps",
                str(args.sft_steps),
                "--completion_only_loss",
                "true",
                "--tiny_structured_date_init",
                "false",
                *DATA,
            ],
            check=True,
            cwd=REPO,
            env=env,
        )
    variants = {
        "transformers": ["--use_vllm", "false"],
        "vllm-colocate": ["--use_vllm", "true", "--vllm_mode", "colocate"],
    }
    results = {}
    for name, flags in variants.items():
        raw_path = out / f"{name}.json"
        grpo = [
            "--config",
            str(REPO / "configs/grpo/tiny-cpu.yaml"),
            "--model_name_or_path",
            str(sft),
            "--output_dir",
            str(out / f"grpo-{name}"),
            "--max_steps",
            str(args.steps + 1),
            *DATA,
            *flags,
        ]
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, __file__, "--worker", str(raw_path), "--", *grpo], check=True, cwd=REPO, env=env
        )
        results[name] = {**summarize(json.loads(raw_path.read_text())), "wall_s": round(time.monotonic() - t0, 1)}
    report = {"hardware": hardware.describe(), "load_average": os.getloadavg(), "steps": args.steps, "results": results}
    (out / "profile.json").write_text(json.dumps(report, indent=2))
    print(f"GRPO step profile, tiny-cpu recipe, {hardware.describe()}, load average {os.getloadavg()[0]:.1f}:")
    print(table(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps", type=int, default=6, help="measured GRPO steps per variant (one warm-up step more runs)"
    )
    parser.add_argument("--sft-steps", type=int, default=80)
    parser.add_argument("--out", default="runs/bench_grpo_profile")
    parser.add_argument("--report", action="store_true", help="print the table of an existing OUT/profile.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("grpo", nargs="*", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.report:
        print(table(json.loads((Path(parsed.out) / "profile.json").read_text())["results"]))
    else:
        worker(parsed) if parsed.worker else run(parsed)

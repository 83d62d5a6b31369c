"""Training curves of a learning-benchmark run, read from each stage's ``trainer_state.json``:
GRPO's training rewards by quarter of the run, its held-out evaluations, and the plot of
both beside the SFT loss. Used by ``bench_learning.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def history(run: Path) -> list[dict]:
    return json.loads((run / "trainer_state.json").read_text())["log_history"]


def grpo_quarters(grpo_dir: Path, reward_names) -> dict:
    """Training curves in four equal parts of the run: mean composite reward, each reward,
    KL and the share of groups with one reward (no gradient), so the README can say
    whether window IoU rose with the reward."""
    steps = [h for h in history(grpo_dir) if "reward" in h]
    keys = {
        "reward": "reward",
        "kl": "kl",
        "frac_reward_zero_std": "frac_reward_zero_std",
        **{n: f"rewards/{n}/mean" for n in reward_names},
    }
    parts = [part for part in np.array_split(np.arange(len(steps)), 4) if len(part)]
    return {
        name: [round(float(np.mean([steps[i][key] for i in part])), 4) for part in parts]
        for name, key in keys.items()
        if all(key in h for h in steps)
    }  # kl is logged only when beta > 0


def grpo_eval_curve(grpo_dir: Path, reward_names) -> list[dict]:
    """The held-out reward at each evaluation: step, composite and each reward."""
    return [
        {
            "step": h["step"],
            "reward": round(h["eval_reward"], 4),
            **{n: round(h[f"eval_rewards/{n}/mean"], 4) for n in reward_names if f"eval_rewards/{n}/mean" in h},
        }
        for h in history(grpo_dir)
        if "eval_reward" in h
    ]


def plot_curves(sft_dirs: list[Path], grpo_dir: Path, out_png: Path, reward_names) -> None:
    """SFT loss of each phase one after the other (step numbers continue), GRPO rewards."""
    from matplotlib.figure import Figure

    def ema(xs, a=0.1):
        out, m = [], None
        for x in xs:
            m = x if m is None else (1 - a) * m + a * x
            out.append(m)
        return out

    fig = Figure(figsize=(12, 4))
    left, right = fig.subplots(1, 2)
    offset = 0
    for phase in sft_dirs:
        sft = [h for h in history(phase) if "loss" in h]
        left.plot([offset + h["step"] for h in sft], [h["loss"] for h in sft], label=phase.name)
        offset += max((h["step"] for h in sft), default=0)
    left.set(
        title="SFT loss (tiny Qwen3 from scratch, then the answer-only phase)",
        xlabel="step",
        ylabel="loss",
        yscale="log",
    )
    left.legend(fontsize=7)
    grpo = [h for h in history(grpo_dir) if "reward" in h]
    steps = [h["step"] for h in grpo]
    right.plot(steps, ema([h["reward"] for h in grpo]), label="composite (EMA)", linewidth=2)
    for name in reward_names:
        right.plot(steps, ema([h.get(f"rewards/{name}/mean", np.nan) for h in grpo]), label=f"{name} (EMA)", alpha=0.7)
    held_out = grpo_eval_curve(grpo_dir, reward_names)
    if held_out:
        for key, color in (("reward", "C0"), ("window_iou", "C3")):
            right.plot(
                [h["step"] for h in held_out],
                [h.get(key, np.nan) for h in held_out],
                "o--",
                color=color,
                label=f"{key}, held-out prompts (eval)",
            )
    right.set(title="GRPO rewards: training (EMA) and held-out evaluations", xlabel="step", ylabel="reward")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)

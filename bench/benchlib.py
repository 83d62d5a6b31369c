"""What the bench scripts share: the learning benchmark's data and prompt designs, reward
scoring of a checkpoint's completions (and ``HeldOut``, the stage of ``tider.pipeline`` the
learning benchmarks add), the paired bootstrap behind the README's intervals, and the
machine's description.

Bench scripts run as ``python bench/X.py`` from the repository root, so ``bench/`` is on
``sys.path`` and they ``import benchlib``; tests/test_benchlib.py tests it. Heavy imports
(tider's training and models) stay inside the functions.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tider.eval.stats import paired_bootstrap_ci

ROOT = Path(__file__).resolve().parents[1]
# The learning benchmark's designs (bench_learning.py --design): its rewards, and whether
# train-only conversations join the train split; the prompt is the code's own. The prompt
# ablation rows (v1, +lines, +cues, +pointers, +marks, +repeat) need the prompt switches of
# fa11d15, the last commit that has them (docs/experiments.md).
DESIGNS = {"shipped": {"rewards": "v2", "fresh": True}}
# The learning benchmark's data: bench_learning.py's defaults.
BENCHMARK_DATA = argparse.Namespace(
    synthetic_messages=22400, synthetic_conversations=16, train_conversations=16, train_seed=1000
)


def commit() -> str:
    """The checked-out commit, ``-dirty`` when the tree has uncommitted changes to tracked files."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def hardware() -> str:
    try:
        from tider.hardware import describe  # the project's own description, where it exists

        return describe()
    except ImportError:
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown CPU",
        )
        return f"{model}, {os.cpu_count()} cores visible, no GPU used"


def load() -> str:
    """The 1-minute load average (``/proc/loadavg``), as text."""
    return Path("/proc/loadavg").read_text().split()[0]


def matmul_ms() -> float:
    from tider.hardware import matmul_ms as probe

    return probe()


def data_overrides(args, design: dict) -> list[str]:
    """Recipe overrides that give every stage the benchmark's data."""
    fresh = args.train_conversations if design["fresh"] else 0
    return [
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        # the synthetic benchmark alone (the pretrain recipes also read RealMem's train personas)
        "--dataset_name",
        "synthetic",
        "--dataset_path",
        "",
        "--validation_memories",
        "",
        "--test_memories",
        "",
        "--synthetic_messages",
        str(args.synthetic_messages),
        "--synthetic_conversations",
        str(args.synthetic_conversations),
        "--synthetic_train_conversations",
        str(fresh),
        "--synthetic_train_seed",
        str(args.train_seed),
    ]


def reward_columns(queries, tables, dataset, store) -> dict:
    """The columns TRL passes the rewards for these prompts (``tider.train.examples``)."""
    from tider.train.examples import PromptBuilder, as_columns
    from tider.train.examples import reward_columns as columns_of

    builder = PromptBuilder(dataset, store)  # the targets switch and window_iou score against
    g = dataset.granularity
    return as_columns([columns_of(q, t, g, builder.target(q, t)) for q, t in zip(queries, tables)])


def prompted(model: str, queries, dataset, store, names, weights):
    """``model``'s locator source, its prompts for ``queries``, and ``score(texts, queries,
    tables)``: each reward of those completions by name, and their weighted ``composite``
    (the recipe's reward_weights)."""
    from tider.locator.sources import make_source
    from tider.train.rewards import RewardContext, make_rewards, reward_scores

    source = make_source("locator", model=model, batch_size=32, max_tokens=64)
    tables = source.inputs(queries, store)
    fns = make_rewards(names, RewardContext(dataset=dataset, store=store, k=20))

    def score(texts, qs, ts) -> dict[str, np.ndarray]:
        scores = reward_scores(fns, texts, reward_columns(qs, ts, dataset, store))
        return {**scores, "composite": sum(float(w) * scores[n] for n, w in zip(names, weights))}

    return source, tables, score


def sampled_rewards(
    model_dir: Path, queries, dataset, store, names, weights, samples: int, temperature: float, seed: int = 1
) -> dict[str, np.ndarray]:
    """Per query, each reward and the composite averaged over ``samples`` completions at
    ``temperature``: the policy's expected reward, which is what GRPO maximizes (serving
    decodes greedily)."""
    source, tables, score = prompted(str(model_dir), queries, dataset, store, names, weights)
    rep = [t for t in tables for _ in range(samples)]
    drawn = source.client.backend.generate_batch(
        [t.messages for t in rep], max_tokens=64, temperature=temperature, seed=seed
    )
    scores = score([c.text for c in drawn], [q for q in queries for _ in range(samples)], rep)
    return {k: v.reshape(len(queries), samples).mean(axis=1) for k, v in scores.items()}


def held_out_rewards(model_dir: Path, queries, dataset, store, reward_names, weights) -> tuple[list[dict], list[str]]:
    """Greedy completions of ``model_dir`` on ``queries``, scored by the GRPO rewards.

    Greedy whatever the checkpoint records: a GRPO checkpoint of the real-data recipes answers
    with a vote of sampled completions, whose text is the samples joined, and the rewards would
    score its first sample (one draw at the rollout temperature) against SFT's greedy answer."""
    from tider.locator.contract import Decoding
    from tider.locator.sources import make_source
    from tider.train.rewards import RewardContext, make_rewards, reward_scores

    source = make_source("locator", model=str(model_dir), batch_size=16, max_tokens=64, decoding=Decoding())
    texts, tables = [], []
    for i in range(0, len(queries), 32):
        chunk = queries[i : i + 32]
        source.predict_batch([q.public() for q in chunk], store)
        texts += [o.text for o in source.last_outcomes]
        tables += source.last_inputs
    fns = make_rewards(reward_names, RewardContext(dataset=dataset, store=store, k=20))
    scores = reward_scores(fns, texts, reward_columns(queries, tables, dataset, store))
    rows = []
    for i, q in enumerate(queries):
        row = {"query": q.key, "type": q.category, **{f"r/{k}": float(v[i]) for k, v in scores.items()}}
        row["composite"] = float(sum(w * scores[k][i] for k, w in zip(reward_names, weights)))
        rows.append(row)
    return rows, texts


@dataclass
class HeldOut:
    """A ``tider.pipeline`` stage: held-out composite reward of each trained stage (``stages``:
    label, folder) on the queries ``queries(run)`` picks, greedy and, with ``samples``, of the
    sampled policy (that many completions a query at ``temperature``: the expected reward
    GRPO maximizes; serving decodes greedily). Result: ``{"queries", "names", "rows", "texts"}``,
    rows and texts by label; a row's ``sampled/*`` are its sampled means."""

    queries: Callable
    stages: Sequence[tuple[str, Path]]
    names: Sequence[str]  # the GRPO recipe's rewards
    weights: Sequence[float]  # and its reward_weights: the composite
    samples: int
    temperature: float
    name: str = "held_out"
    title = "held-out composite reward"

    def __call__(self, run) -> None:
        queries = self.queries(run)
        data, store, names, weights = run.dataset, run.store, self.names, self.weights
        rows, texts = {}, {}
        for label, folder in self.stages:
            rows[label], texts[label] = held_out_rewards(folder, queries, data, store, names, weights)
            if self.samples:
                means = sampled_rewards(folder, queries, data, store, names, weights, self.samples, self.temperature)
                for i, row in enumerate(rows[label]):
                    row.update({f"sampled/{k}": float(v[i]) for k, v in means.items()})
        run.results[self.name] = {"queries": queries, "names": list(names), "rows": rows, "texts": texts}


def grpo_minus_sft(rows: dict, key: str = "composite") -> dict | None:
    """The paired bootstrap of GRPO - SFT on the rows' ``key`` (None without a GRPO stage)."""
    diffs = [g[key] - s[key] for g, s in zip(rows.get("grpo", ()), rows["sft"]) if key in s]
    return paired_bootstrap_ci(diffs) if diffs else None

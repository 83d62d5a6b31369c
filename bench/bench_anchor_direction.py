"""Does the locator answer an anchored question on the side the question asks for?

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_anchor_direction.py \
        runs/marks/bench_learning:sft,grpo runs/mB:grpo --samples runs/marks/bench_learning/grpo \
        --out runs/anchor_direction.json

"The first offsite after the reorg" is the line marked ``A+1``; "the last review before
the reorg" is ``A-1`` (``tider.locator.lines``). On the learning benchmark's test split
(the benchmark's data and split, ``benchlib.benchmark_split``), this counts which mark
each run's greedy answer names first, by the question's direction. Direction is read off
the synthetic templates' words (``preced``/``before`` vs ``after``/``following``/``next``):
an analysis of this benchmark, not a rule any source uses.

1. ``RUN:STAGES``: ``RUN/completions.json`` (what ``bench_learning.py`` writes: the greedy
   test completions per stage); an ``{"entry": k}`` answer is mapped to the mark line k
   carries in its prompt.
2. ``--samples GRPO_DIR``: the GRPO training samples (``GRPO_DIR/completions/*.parquet``),
   per quarter of the run: the share of each first mark by direction.
3. The SFT targets of the test split's anchored questions, by direction (they are
   consistent: "after" is ``A+1``, "before" ``A-1``, but for "the first two ..." and dates).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from benchlib import benchmark_split


def direction(question: str) -> str:
    if re.search(r"preced|before", question):
        return "before"
    return "after" if re.search(r"after|following|next", question) else "other"


def first_mark(answer: str, prompt: str) -> str:
    """The mark the answer's first window names: its own ``{"mark"}``, or the mark on the
    line an ``{"entry": k}`` points at ("L" for an unmarked line)."""
    try:
        window = json.loads(answer)["windows"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return "unparsed"
    if not isinstance(window, dict):
        return "unparsed"
    if "mark" in window:
        return str(window["mark"])
    if "entry" in window:
        line = re.search(rf"^([^\n]*)\| L{int(window['entry'])}$", prompt, re.MULTILINE)
        mark = re.search(r" (A[-+]?\d*) ", line.group(1)) if line else None
        return mark.group(1) if mark else "L"
    return "dates" if "start" in window else "cue"


def stage_dir(run: Path, stage: str) -> Path:
    """The checkpoint behind a stage label of ``bench_learning.py`` (``--answer-steps`` puts
    the SFT start in ``sft-answer``)."""
    return run / "sft-answer" if stage == "sft" and (run / "sft-answer").exists() else run / stage


def greedy_counts(run: Path, stages, test, dataset, store) -> dict:
    """First marks of the greedy test answers, against the prompts that checkpoint saw."""
    from tider.locator.sources import make_source

    texts = json.loads((run / "completions.json").read_text())
    picked = [i for i, q in enumerate(test) if q.category == "anchored"]
    queries = [test[i] for i in picked]
    out = {}
    for stage in stages:
        source = make_source("locator", model=str(stage_dir(run, stage)))
        tables = source.inputs(queries, store)
        counts = Counter(
            (direction(q.text), first_mark(texts[stage][i], t.messages[-1]["content"]))
            for i, q, t in zip(picked, queries, tables)
        )
        out[stage] = {f"{d} -> {m}": n for (d, m), n in sorted(counts.items())}
    return out


def sample_shares(grpo_dir: Path) -> dict:
    import pandas as pd

    d = pd.concat([pd.read_parquet(f) for f in sorted((grpo_dir / "completions").glob("*.parquet"))])
    prompts = d.prompt.map(lambda p: p[-1]["content"])
    d = d.assign(
        dir=prompts.map(lambda p: direction(p.split("\n")[0])),
        text=prompts,
        mark=[first_mark(c[0]["content"], p) for c, p in zip(d.completion, prompts)],
    )
    d = d[prompts.str.contains(" A |") & (d.dir != "other")]
    d = d.assign(quarter=(d.step - 1) * 4 // int(d.step.max()))
    out = defaultdict(dict)
    for (dr, quarter), g in d.groupby(["dir", "quarter"]):
        out[dr][f"q{quarter + 1}"] = g.mark.value_counts(normalize=True).round(2).to_dict()
    return dict(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="RUN:STAGE[,STAGE] with RUN/completions.json")
    ap.add_argument("--samples", nargs="*", default=[], help="GRPO output dirs with completions/*.parquet")
    ap.add_argument("--out", default="runs/anchor_direction.json")
    args = ap.parse_args(argv)
    from tider.train.examples import PromptBuilder, gold_answer

    start = stage_dir(Path(args.runs[0].partition(":")[0]), "sft") if args.runs else "unused"
    g_args, _, dataset, store, splits = benchmark_split(start)  # bench_learning's split
    test = splits["test"]
    builder = PromptBuilder(dataset, store, settings=g_args.prompt_settings())  # targets as marks
    result = {
        "targets": {
            f"{d} -> {m}": n
            for (d, m), n in sorted(
                Counter(
                    (
                        direction(q.text),
                        first_mark(json.dumps(gold_answer(q, builder.build(q), dataset.granularity)), ""),
                    )
                    for q in test
                    if q.category == "anchored"
                ).items()
            )
        }
    }
    for spec in args.runs:
        run, _, stages = spec.partition(":")
        result[run] = greedy_counts(Path(run), stages.split(","), test, dataset, store)
    for grpo in args.samples:
        result[f"{grpo} samples"] = sample_shares(Path(grpo))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

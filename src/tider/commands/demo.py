"""`tider demo`: the whole pipeline in one command, on this machine's data and hardware.

    synthetic benchmark -> timeline + indexes -> SFT -> GRPO -> export -> vLLM serve
    -> comparison report (locator vs dbscan-tuned, timeline, none, oracle)

Each stage writes under ``--out`` and is skipped when its output is already there, so an
interrupted demo resumes (``--fresh`` starts over). ``--recipe tiny-cpu`` (default) is the
2-core CPU recipe; ``--recipe qwen3-1.7b --dataset locomo --path ...`` runs the production
recipes on a GPU box (configs/{sft,grpo}/qwen3-1.7b.yaml). Arguments the demo does not
know go to both TrlParser recipes (e.g. ``--tiny_hidden_size 64``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from tider import resources

DEMO_KS = (5, 10, 20, 50)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="synthetic data -> SFT -> GRPO -> export -> vLLM -> comparison report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--recipe", default="tiny-cpu", help="recipe name: configs/sft/NAME.yaml and configs/grpo/NAME.yaml")
    p.add_argument("--dataset", default="synthetic", help="dataset loader (synthetic is generated into --out/data)")
    p.add_argument("--path", default=None, help="dataset file for file-backed loaders (e.g. LoCoMo JSON)")
    p.add_argument("--out", default="runs/demo", help="run folder")
    # 1,100 messages a conversation: ~45 near-identical twins per frequent event, more than the
    # k=20 a retriever returns; 10 conversations hold out 2 (~440 questions) for the comparison.
    p.add_argument("--synthetic-messages", type=int, default=11000, help="size of the generated synthetic benchmark")
    p.add_argument("--synthetic-conversations", type=int, default=10)
    p.add_argument("--sft-steps", type=int, default=None, help="override the SFT recipe's max_steps")
    p.add_argument("--grpo-steps", type=int, default=None, help="override the GRPO recipe's max_steps")
    p.add_argument("--export-dtype", default=None, help="default: float32 on CPU (exact vLLM parity), bfloat16 on GPU")
    p.add_argument(
        "--baselines",
        default="none,rules,top-day,top-days,dbscan-tuned,timeline",
        help="learning-free window sources to compare",
    )
    p.add_argument(
        "--split",
        default="heldout",
        choices=["train", "validation", "test", "heldout", "all"],
        help="conversations to evaluate on (the locator trains on 'train'; heldout = validation + test)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N eligible queries in the comparison")
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="run the locator with local transformers instead of a vLLM server (no vLLM venv needed)",
    )
    p.add_argument("--port", type=int, default=None, help="vLLM port (default: a free one)")
    p.add_argument("--fresh", action="store_true", help="delete --out first")
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="tiny recipes: build a fresh tiny Qwen3 under --out instead of starting from the recipe's "
        "pretrained model_name_or_path (models/tiny-locator-v3)",
    )
    p.set_defaults(func=run, passthrough=True)


def _sft_start(recipe: dict, out: Path, from_scratch: bool) -> str | None:
    """Where SFT starts: the recipe's own model (a shipped one, e.g. models/tiny-locator-v3,
    made absolute so the demo runs from any directory, or a Hub id), unless a tiny recipe is
    asked to build a fresh model under ``out`` (``--from-scratch``, or the shipped start is missing)."""
    named = recipe.get("model_name_or_path")
    if recipe.get("tiny_model"):
        shipped = resources.path(str(named)) if named else None
        if from_scratch or shipped is None or not (shipped / "config.json").exists():
            return str(out / "base")
        return str(shipped)
    return None


def run(args) -> int:
    from tider import pipeline
    from tider.train.output import quiet_libraries

    quiet_libraries()  # model-loading bars and library INFO stay out of the demo's own output
    out = Path(args.out).resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    done = pipeline.run(_stages(args, out), out)
    _report(done.results["compare"], out, done.times)
    _report_grpo(out)
    return 0


def _stages(args, out: Path) -> list:
    """The demo's pipeline: its dataset, the named recipes and the comparison's options."""
    from dataclasses import replace

    import yaml

    from tider.commands.serve import export_server
    from tider.eval.compare import CompareConfig
    from tider.pipeline import Compare, Data, Export, Indexes, Serve, Train
    from tider.retrieval.config import RetrievalConfig

    sft_recipe, grpo_recipe = _recipes(args.recipe)
    sft_start = _sft_start(yaml.safe_load(sft_recipe.read_text()), out, args.from_scratch)
    data = Data(args.dataset, args.path)
    if args.dataset == "synthetic" and args.path is None:
        data = Data(args.dataset, str(out / "data"), (args.synthetic_messages, args.synthetic_conversations))
    data_args = ["--dataset_name", args.dataset] + (["--dataset_path", data.path] if data.path else [])
    extra = list(getattr(args, "extra", []) or [])  # unknown arguments go to both recipes

    def train(kind, recipe, start, steps):
        steps_args = ["--max_steps", str(steps)] if steps is not None else []
        return Train(kind, recipe, out / kind, start, [*data_args, *steps_args, *extra], fresh_process=True)

    compare = CompareConfig(
        baselines=[b for b in args.baselines.split(",") if b],
        limit=args.limit,
        retrieval=RetrievalConfig(),
        ks=DEMO_KS,
        mcnemar_k=20,
    )
    return [
        data,
        Indexes(),
        train("sft", sft_recipe, sft_start, args.sft_steps),
        train("grpo", grpo_recipe, str(out / "sft"), args.grpo_steps),
        Export(args.export_dtype),
        Serve(None if args.no_serve else export_server(args.port)),
        # overwrite: the locator behind the URL may be a new model (or the port a new one).
        Compare(
            compare, memory_keys=_split_keys(args.split), overwrite=True, title=f"compare on the {args.split} split"
        ),
        # What GRPO did: the SFT checkpoint on the same questions (local transformers, the
        # same greedy decoding), paired with the GRPO export in the report.
        Compare(
            replace(compare, baselines=[], oracle=False),
            folder="compare-sft",
            locator={"model": str(out / "sft")},
            memory_keys=_split_keys(args.split),
            overwrite=True,
            progress=False,
            name="compare-sft",
            title="the SFT checkpoint on the same questions",
        ),
    ]


def _split_keys(split: str):
    """The memories of ``split`` as the locator's training split them (its export's seed)."""

    def keys(run):
        from tider.data.splits import memory_keys_of
        from tider.locator.contract import LocatorMetadata

        return memory_keys_of(run.dataset.memories, split, seed=LocatorMetadata.read(run.model).split_seed or 0)

    return keys


def _recipes(name: str) -> tuple[Path, Path]:
    """The SFT and GRPO recipes called ``name``; exits naming the known ones when one is missing."""
    sft_recipe, grpo_recipe = (resources.path(f"configs/{s}/{name}.yaml") for s in ("sft", "grpo"))
    for recipe in (sft_recipe, grpo_recipe):
        if not recipe.exists():
            known = sorted(p.stem for p in resources.path("configs/sft").glob("*.yaml"))
            raise SystemExit(f"recipe {name!r}: {recipe} not found; known recipes: {', '.join(known)}")
    return sft_recipe, grpo_recipe


def _report(comparison: dict, out: Path, times: dict) -> None:
    """The comparison table, its significance section, the stage timings and where the report is."""
    from rich.console import Console

    from tider.commands.eval_compare import rich_table
    from tider.eval.compare import markdown

    console = Console(width=max(Console().width, 150))  # the table is wide; a pipe defaults to 80 columns
    console.print(rich_table(comparison))
    sections = markdown(comparison).split("\n## ", 1)
    if len(sections) == 2:
        console.print("## " + sections[1], markup=False, soft_wrap=True)
    (out / "timings.json").write_text(json.dumps(times, indent=2))
    console.print(f"stage timings (s): {times}; total {sum(times.values()):.0f} s")
    console.print(
        f"report: {out / 'compare' / 'compare.md'}; plots: {out / 'compare'}/compare.png, "
        f"{out / 'compare' / 'retrieval'}/*.png"
    )


def _report_grpo(out: Path) -> None:
    """SFT against SFT+GRPO on the same held-out questions: recall@20 of each, the paired
    difference with its 95% bootstrap interval, McNemar on hit_all@20; written to
    ``compare/grpo_vs_sft.json`` whatever its sign."""
    from tider.eval.compare import paired_locators

    paired = paired_locators(out / "compare-sft", out / "compare")
    (out / "compare" / "grpo_vs_sft.json").write_text(json.dumps(paired, indent=2))
    d, m = paired["after_minus_before"], paired["mcnemar"]
    print(
        f"SFT vs SFT+GRPO, {paired['n']} held-out questions: recall@20 {paired['recall@20']['before']:.3f} -> "
        f"{paired['recall@20']['after']:.3f}, GRPO - SFT {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] "
        f"(95% paired bootstrap); hit_all@20 McNemar b {m['b']} / c {m['c']}, p {m['p']:.3g}"
    )

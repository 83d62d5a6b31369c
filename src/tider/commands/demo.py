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
import subprocess
import sys
import time
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


def _banner(step: str, text: str) -> float:
    print(f"\n=== [{step}] {text}", flush=True)
    return time.monotonic()


def _done(t0: float, times: dict, name: str) -> None:
    times[name] = round(time.monotonic() - t0, 1)
    print(f"--- {name}: {times[name]} s", flush=True)


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


def _train(stage: str, recipe: Path, out: Path, model: str | None, data_args: list[str], steps, extra) -> None:
    argv = [sys.executable, "-m", "tider.cli", stage, "--config", str(recipe), "--output_dir", str(out), *data_args]
    if model:
        argv += ["--model_name_or_path", model]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    argv += list(extra)
    print("$", " ".join(argv[2:]), flush=True)
    # The caller's directory, as for the demo's own stages: every path handed over is absolute,
    # and an installed package has no checkout to run in.
    subprocess.run(argv, check=True)


def _trained(folder: Path) -> bool:
    from tider.locator.contract import METADATA_FILE

    return (folder / METADATA_FILE).exists() and any(folder.glob("*.safetensors"))


def run(args) -> int:
    import yaml

    from tider.train.output import quiet_libraries

    quiet_libraries()  # model-loading bars and library INFO stay out of the demo's own output
    extra = list(getattr(args, "extra", []) or [])
    out = Path(args.out).resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    sft_recipe, grpo_recipe = _recipes(args.recipe)
    sft_start = _sft_start(yaml.safe_load(sft_recipe.read_text()), out, args.from_scratch)
    times: dict[str, float] = {}
    dataset, data_path = _stage_data(args, out, times)
    data_args = ["--dataset_name", args.dataset] + (["--dataset_path", data_path] if data_path else [])
    _stage_indexes(dataset, times)
    grpo_dir = _stage_training(args, (sft_recipe, grpo_recipe), sft_start, out, data_args, extra, times)
    export_dir, dtype = _stage_export(args, grpo_dir, out, times)
    # 6-7. Serve with vLLM and compare on held-out conversations.
    comparison = _serve_and_compare(args, dataset, data_path, export_dir, out, dtype, times)
    _report(comparison, out, times)
    return 0


def _recipes(name: str) -> tuple[Path, Path]:
    """The SFT and GRPO recipes called ``name``; exits naming the known ones when one is missing."""
    sft_recipe, grpo_recipe = (resources.path(f"configs/{s}/{name}.yaml") for s in ("sft", "grpo"))
    for recipe in (sft_recipe, grpo_recipe):
        if not recipe.exists():
            known = sorted(p.stem for p in resources.path("configs/sft").glob("*.yaml"))
            raise SystemExit(f"recipe {name!r}: {recipe} not found; known recipes: {', '.join(known)}")
    return sft_recipe, grpo_recipe


def _stage_data(args, out: Path, times: dict):
    """1. Benchmark: the synthetic one is written to disk so training and evaluation read the
    same file. Returns ``(dataset, data_path)``."""
    from tider.data import load_dataset

    t0 = _banner("1/7", f"dataset: {args.dataset}")
    data_path = args.path
    if args.dataset == "synthetic" and args.path is None:
        data_path = str(out / "data")
        if not (out / "data").exists():
            from tider.data.synth import generate, write

            write(generate(args.synthetic_messages, seed=0, n_conversations=args.synthetic_conversations), data_path)
    dataset = load_dataset(args.dataset, data_path)
    n_msgs = sum(len(m) for m in dataset.memories.values())
    print(f"{dataset.name}: {len(dataset.memories)} memories, {n_msgs} messages, {len(dataset.queries)} queries")
    _done(t0, times, "data")
    return dataset, data_path


def _stage_indexes(dataset, times: dict) -> None:
    """2. Timeline and indexes, query embeddings and time expressions (cached on disk;
    training and evaluation reuse them)."""
    t0 = _banner("2/7", "timeline + BM25/faiss indexes + time expressions")
    from tider.locator.rules import prepare_cues, shared_resolver
    from tider.memory import MemoryCollection

    store = MemoryCollection(dataset.memories)
    store.prepare(dataset.queries)
    n_entries = sum(len(store.timeline(k)) for k in dataset.memories)
    print(f"timeline: {n_entries} event clusters over {len(dataset.memories)} memories")
    resolved = prepare_cues(shared_resolver(), dataset.queries, dataset.memories)
    print(f"time expressions: {len(dataset.queries)} questions ({resolved} resolved now, the rest cached)")
    _done(t0, times, "indexes")


def _stage_training(args, recipes: tuple[Path, Path], sft_start, out: Path, data_args, extra, times: dict) -> Path:
    """3-4. SFT from ``sft_start`` then GRPO (subprocesses: each trainer gets a clean process
    and frees its memory). Returns the GRPO folder."""
    sft_recipe, grpo_recipe = recipes
    sft_dir, grpo_dir = out / "sft", out / "grpo"
    t0 = _banner("3/7", f"SFT (configs/sft/{sft_recipe.name})")
    if not _trained(sft_dir):
        _train("sft", sft_recipe, sft_dir, sft_start, data_args, args.sft_steps, extra)
    _done(t0, times, "sft")
    t0 = _banner("4/7", f"GRPO (configs/grpo/{grpo_recipe.name})")
    if not _trained(grpo_dir):
        _train("grpo", grpo_recipe, grpo_dir, str(sft_dir), data_args, args.grpo_steps, extra)
    _done(t0, times, "grpo")
    return grpo_dir


def _stage_export(args, grpo_dir: Path, out: Path, times: dict) -> tuple[Path, str]:
    """5. Export (verified by reload: logits + greedy outputs). Returns ``(folder, dtype)``."""
    t0 = _banner("5/7", "export")
    from tider.train.export import export_locator

    export_dir = out / "export"
    dtype = args.export_dtype or ("float32" if _on_cpu() else "bfloat16")
    if not (export_dir / "export_report.json").exists():
        report = export_locator(grpo_dir, export_dir, dtype=dtype, overwrite=True)
        if not report.greedy_identical:
            raise SystemExit(f"export differs from the GRPO checkpoint: {report.greedy_mismatches[:1]}")
    exported = json.loads((export_dir / "export_report.json").read_text())
    print(
        f"export: {exported['dtype']} ({exported['source_layout']}), "
        f"max |logit diff| {exported['max_abs_logit_diff']}, greedy identical: {exported['greedy_identical']}"
    )
    _done(t0, times, "export")
    return export_dir, dtype


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


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def _serve_and_compare(args, dataset, data_path, export_dir: Path, out: Path, dtype: str, times: dict) -> dict:
    from contextlib import nullcontext

    from tider.eval.compare import CompareConfig, run_compare
    from tider.locator.contract import LocatorMetadata
    from tider.retrieval.config import RetrievalConfig
    from tider.train.examples import memory_keys_of

    meta = LocatorMetadata.read(export_dir)
    memory_keys = memory_keys_of(dataset.memories, args.split, seed=meta.split_seed or 0)
    t0 = _banner("6/7", "serve the export with vLLM" if not args.no_serve else "locator via local transformers")
    if args.no_serve:
        server, options = nullcontext(), {"locator": {"model": str(export_dir)}}
    else:
        from tider.commands import serve

        parser = argparse.ArgumentParser()
        serve.register(parser.add_subparsers())
        # Eager on CPU: vLLM's compile warm-up costs ~100 s there and buys a tiny model nothing.
        eager = ["--enforce-eager"] if _on_cpu() else []
        serve_args = parser.parse_args(
            [
                "serve",
                "--model",
                str(export_dir),
                "--dtype",
                dtype,
                *eager,
                "--max-model-len",
                "4096",
                "--log",
                str(out / "vllm.log"),
            ]
        )
        serve_args.port = args.port  # None: a free port
        server = serve.make_server(serve_args)
        options = None
    with server:
        if options is None:
            print(f"vLLM serving {export_dir} at {server.base_url} (log {out / 'vllm.log'})")
            options = {"locator": {"url": server.base_url}}
        _done(t0, times, "serve")
        t0 = _banner("7/7", f"compare on the {args.split} split")
        config = CompareConfig(
            baselines=[b for b in args.baselines.split(",") if b],
            source_options=options,
            memory_keys=memory_keys,
            limit=args.limit,
            retrieval=RetrievalConfig(),
            ks=DEMO_KS,
            mcnemar_k=20,
        )
        # overwrite: the locator behind the URL may be a new model (or the port a new one).
        comparison = run_compare(dataset, config, out / "compare", data_path=data_path, overwrite=True)
        _done(t0, times, "compare")
    return comparison

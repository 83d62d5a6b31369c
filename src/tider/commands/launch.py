"""`tider stage` (models into $HF_HOME) and `tider launch check` (the preflight a cluster job
runs before it queues): ``tider.train.launch``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SLURM_SCRIPT = Path("scripts/slurm/train.slurm")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "stage",
        help="download every model recipes need into $HF_HOME, for compute nodes without internet",
        description="Download the policy, reader and embedder that each recipe names (Hub ids) into the Hub "
        "cache of $HF_HOME: put HF_HOME on the filesystem the compute nodes share.",
    )
    p.add_argument("recipes", nargs="*", help="sft or grpo recipes, e.g. configs/grpo/qwen3-1.7b.yaml")
    p.add_argument("--model", action="append", default=[], help="also stage this Hub id (repeatable)")
    p.set_defaults(func=_stage)

    p = subparsers.add_parser("launch", help="cluster launch: the preflight of a recipe for a job's shape")
    sub = p.add_subparsers(dest="launch_command", metavar="<launch-command>", required=True)
    c = sub.add_parser(
        "check",
        help="on the login node, before sbatch: checks and the per-node plan of scripts/slurm/train.slurm",
    )
    c.add_argument("recipe")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--gpus-per-node", type=int, required=True)
    c.add_argument("--accelerate", default="zero2", help="accelerate config under configs/accelerate (zero2)")
    c.set_defaults(func=_check, passthrough=True)
    v = sub.add_parser("verify", help="the checks alone, for a known number of training processes (train.slurm)")
    v.add_argument("stage", choices=["sft", "grpo"])
    v.add_argument("recipe")
    v.add_argument("--processes", type=int, required=True)
    v.add_argument("--serve-reader", default=None, help="the reader model the launcher serves (checked staged)")
    v.set_defaults(func=_verify, passthrough=True)


def _stage(args) -> int:
    from tider.staging import ModelNotStaged, stage_models
    from tider.train.launch import LaunchRefused, parse_here, recipe_needs, recipe_stage

    models = list(args.model)
    try:
        for recipe in args.recipes:
            stage = recipe_stage(recipe)
            script_args, _, model_args = parse_here(stage, recipe)
            for need in recipe_needs(stage, script_args, model_args, reader=script_args.reader_model):
                print(f"{recipe}: {need}")
                models.append(need.model)
        if not models:
            print("tider stage: name a recipe or --model", file=sys.stderr)
            return 2
        for place in stage_models(list(dict.fromkeys(models))):
            print(place)
    except (LaunchRefused, ModelNotStaged) as exc:
        print(f"tider stage: {exc}", file=sys.stderr)
        return 2
    return 0


def _verify(args) -> int:
    from tider.staging import ModelNotStaged
    from tider.train.launch import LaunchRefused, verify

    try:
        lines = verify(args.stage, args.recipe, args.processes, args.extra, serve_reader=args.serve_reader)
    except (LaunchRefused, ModelNotStaged) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _check(args) -> int:
    """train.slurm's dry run on a simulated allocation of ``--nodes`` nodes: the same role
    arithmetic, the same checks (it runs ``verify`` first), the per-node commands."""
    from tider.train.launch import LaunchRefused, recipe_stage

    if not SLURM_SCRIPT.exists():
        print(f"tider launch check: run it from the repository root ({SLURM_SCRIPT} not found)", file=sys.stderr)
        return 2
    try:
        stage = recipe_stage(args.recipe)
    except LaunchRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    nodes = " ".join(f"node-{i}" for i in range(args.nodes))
    env = {**os.environ, "TIDER_DRY_RUN": "1", "TIDER_DRY_RUN_NODES": nodes, "GPUS_PER_NODE": str(args.gpus_per_node)}
    cmd = ["bash", str(SLURM_SCRIPT), stage, args.recipe, args.accelerate, *args.extra]
    return subprocess.run(cmd, env=env, check=False).returncode

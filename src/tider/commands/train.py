"""`tider sft --config RECIPE` and `tider grpo --config RECIPE`: train the locator.

Everything after the recipe goes to TRL's ``TrlParser`` (e.g. ``--max_steps 5
--output_dir runs/x``), so any SFTConfig/GRPOConfig/ModelConfig field can be overridden.
"""

from __future__ import annotations


def register(subparsers) -> None:
    for stage, helptext in (
        ("sft", "supervised warm-up of the locator (TRL SFTTrainer)"),
        ("grpo", "GRPO of the locator with composite rewards (TRL GRPOTrainer)"),
    ):
        p = subparsers.add_parser(stage, help=helptext, description=helptext + ". Extra arguments go to TrlParser.")
        p.add_argument("--config", required=True, help=f"YAML recipe, e.g. configs/{stage}/tiny-cpu.yaml")
        p.set_defaults(func=_run, stage=stage, passthrough=True)


def _run(args) -> int:
    import os

    from tider.train.config import parse_recipe
    from tider.train.output import quiet_libraries, setup_logging

    quiet_libraries()
    script_args, training_args, model_args = parse_recipe(args.stage, ["--config", args.config, *args.extra])
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        # Offline (a compute node): a model that is not staged is a refusal now, naming it,
        # not a load error deep in the trainer or a reader that never answers.
        from tider.staging import ModelNotStaged, require_staged
        from tider.train.launch import recipe_needs

        try:
            require_staged(recipe_needs(args.stage, script_args, model_args), args.config)
        except ModelNotStaged as exc:
            raise SystemExit(f"tider {args.stage}: {exc}") from None
    setup_logging(training_args.output_dir, rank=int(os.environ.get("RANK", "0")))
    if getattr(model_args, "dtype_was_auto", False):
        from tider.hardware import log_choice

        log_choice(model_args.dtype)
    if args.stage == "sft":
        from tider.train.sft import run_sft

        run_sft(script_args, training_args, model_args)
    else:
        from tider.train.grpo import run_grpo

        run_grpo(script_args, training_args, model_args)
    return 0

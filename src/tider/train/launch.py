"""What a cluster job needs before it queues: the models a recipe names, staged where the
compute nodes read them offline, and a preflight of the recipe for the job's shape.

    tider stage configs/grpo/qwen3-1.7b.yaml        # where the Hub is reachable: into $HF_HOME
    tider launch check configs/grpo/qwen3-1.7b-multinode.yaml --nodes 3 --gpus-per-node 8

Compute nodes often have no internet, and ``tider serve`` runs vLLM with ``HF_HUB_OFFLINE=1``:
a model that is not staged there is a refusal at start naming it and ``tider stage``, never a
reader or trainer that times out 300 s later. ``scripts/slurm/train.slurm`` runs the same
checks (``verify``) before it starts a single server.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tider.staging import Need, require_staged, where

THINK_TOKENS = 64  # the empty <think> block Qwen3's template appends with enable_thinking: false


class LaunchRefused(ValueError):
    """A recipe that cannot run at the job's shape; the message says what to change."""


def parse_here(stage: str, recipe: str, overrides: Sequence[str] = ()):
    """The recipe's arguments as its job will see them, parsed on a machine that may have no
    GPU (a login node): there ``use_cpu`` lets a bf16 recipe parse; nothing checked here
    depends on it."""
    import torch

    from tider.train.config import parse_recipe

    cpu = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    return parse_recipe(stage, ["--config", recipe, *cpu, *overrides])


def recipe_value(recipe: str, overrides: Sequence[str], name: str):
    """A field as the recipe or a later ``--name value`` override sets it; None if neither."""
    import yaml

    value = (yaml.safe_load(Path(recipe).read_text()) or {}).get(name)
    for i, arg in enumerate(overrides[:-1]):
        if arg == f"--{name}":
            value = overrides[i + 1]
    return value


def recipe_stage(recipe: str) -> str:
    """``sft`` or ``grpo``: the recipe's folder under configs/ says it; elsewhere the stage
    whose parser reads it. The folder is trusted without a parse (seconds of TRL imports):
    ``verify`` parses the recipe with the job's overrides and refuses what does not parse."""
    if not Path(recipe).is_file():
        raise LaunchRefused(f"{recipe}: no such recipe file")
    parent = Path(recipe).parent.name
    if parent in ("sft", "grpo"):
        return parent
    errors = []
    for stage in ("grpo", "sft"):
        try:
            parse_here(stage, recipe)
            return stage
        except (ValueError, SystemExit) as exc:
            errors.append(f"{stage}: {exc}")
    raise LaunchRefused(f"{recipe} is not an sft or grpo recipe ({'; '.join(errors)})")


def recipe_needs(stage: str, script_args, model_args, reader: str | None = None) -> list[Need]:
    """The models a stage needs: the policy (unless the recipe builds a tiny one), the
    retrieval embedder, and the reader ``answer_correct`` asks where it is loaded here
    (no ``reader_base_url``) or where ``reader`` names the model a launcher serves for it
    (with a URL, ``reader_model`` is only the served name)."""
    needs = []
    if not script_args.tiny_model:
        needs.append(Need("policy", model_args.model_name_or_path))
    if stage == "grpo" and "answer_correct" in script_args.reward_funcs:
        local = script_args.reader_model if not script_args.reader_base_url else None
        if reader or local:
            needs.append(Need("reader", reader or local))
    embedder = script_args.retrieval().embedding_model
    if embedder:  # None: the offline all-MiniLM-L6-v2 package, installed with tider
        needs.append(Need("embedder", embedder))
    return needs


def check_lengths(script_args, training_args) -> str:
    """Prompt + completion (+ the empty think block) must fit the vLLM engine's context."""
    need = script_args.max_prompt_tokens + training_args.max_completion_length + THINK_TOKENS
    limit = training_args.vllm_max_model_length
    line = (
        f"lengths: prompt {script_args.max_prompt_tokens} + completion {training_args.max_completion_length} "
        f"+ {THINK_TOKENS} (empty think block) = {need}"
    )
    if not training_args.use_vllm or limit is None:
        return f"{line} (no vLLM context to fit)"
    if need > limit:
        raise LaunchRefused(f"{line} > vllm_max_model_length {limit}: raise it or lower max_prompt_tokens")
    return f"{line} <= vllm_max_model_length {limit}"


def check_rewards(script_args, training_args) -> str:
    from tider.train.rewards import REWARDS

    names, weights = list(script_args.reward_funcs), training_args.reward_weights
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise LaunchRefused(f"unknown reward(s) {unknown}; known: {REWARDS.known()}")
    if weights is not None and len(weights) != len(names):
        raise LaunchRefused(f"{len(names)} reward_funcs but {len(weights)} reward_weights")
    if "answer_correct" in names and not script_args.reader_model:
        raise LaunchRefused("answer_correct needs reader_model (the reader the launcher serves)")
    shown = ", ".join(f"{n} {w:g}" for n, w in zip(names, weights or [1.0] * len(names)))
    return f"rewards: {shown}"


def verify(
    stage: str, recipe: str, processes: int, overrides: Sequence[str] = (), serve_reader: str | None = None
) -> list[str]:
    """The preflight of ``recipe`` on ``processes`` training processes: batch arithmetic,
    lengths and rewards (GRPO), and every model staged. Lines to print; ``LaunchRefused`` or
    ``ModelNotStaged`` on the first problem."""
    from tider.train.config import check_generation_batch

    script_args, training_args, model_args = parse_here(stage, recipe, overrides)
    lines = [f"recipe {recipe} ({stage}) on {processes} training processes"]
    per_step = training_args.per_device_train_batch_size * processes * training_args.gradient_accumulation_steps
    if stage == "grpo":
        global_batch = training_args.per_device_train_batch_size * processes
        fixed = recipe_value(recipe, overrides, "generation_batch_size")
        if fixed is not None and int(fixed) % global_batch:
            # TRL then derives steps_per_generation = generation_batch_size / global batch.
            raise LaunchRefused(
                f"generation_batch_size {fixed} is not divisible by the global batch {global_batch} "
                f"(= {training_args.per_device_train_batch_size} per device x {processes} processes)"
            )
        try:
            batch = int(fixed) if fixed is not None else check_generation_batch(training_args, processes)
        except ValueError as exc:
            raise LaunchRefused(f"{exc}: change per_device_train_batch_size or gradient_accumulation_steps") from None
        g = training_args.num_generations
        lines.append(f"batch: {batch} completions a generation = {batch // g} prompts x {g} generations")
        lines += [check_lengths(script_args, training_args), check_rewards(script_args, training_args)]
    else:
        lines.append(f"batch: {per_step} sequences an optimizer step")
    needs = recipe_needs(stage, script_args, model_args, reader=serve_reader)
    require_staged(needs, recipe)
    lines += [f"model: {need} ({where(need.model)})" for need in needs]
    if not any(need.role == "embedder" for need in needs):
        lines.append("model: embedder all-MiniLM-L6-v2 (the offline package installed with tider)")
    return lines

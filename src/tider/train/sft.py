"""Supervised warm-up of the locator with TRL's ``SFTTrainer`` on conversational
prompt-completion records (the gold JSON is the completion). The loss covers the
completion only unless the recipe sets ``completion_only_loss: false``, as the tiny CPU
recipe does so that a from-scratch model also learns to read the timeline dates."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tider.train.data import eval_queries, to_hf
from tider.train.examples import reachability, sft_records
from tider.train.stage import prepare, start_wandb_run, train_and_save

logger = logging.getLogger(__name__)


def model_init_kwargs(training_args, model_args) -> dict:
    """TRL 1.16 loads in float32 unless told otherwise; the recipe's ``dtype`` wins."""
    kwargs = dict(training_args.model_init_kwargs or {})
    if model_args.dtype and "dtype" not in kwargs:
        kwargs["dtype"] = model_args.dtype
    if model_args.attn_implementation and "attn_implementation" not in kwargs:
        kwargs["attn_implementation"] = model_args.attn_implementation
    return kwargs


def run_sft(script_args, training_args, model_args, *, dataset=None, store=None):
    from trl import SFTTrainer, get_peft_config

    run = start_wandb_run(training_args, script_args.wandb_project)
    model_path = model_args.model_name_or_path
    dataset, store, tokenizer, builder, splits = prepare(
        script_args, model_path, stage="sft", dataset=dataset, store=store, training_args=training_args
    )
    records = sft_records(splits["train"], builder)
    report_reachability(records, dataset, training_args)
    train = to_hf(records, script_args.max_train_samples, ["prompt", "completion"])
    evaluate = training_args.eval_strategy != "no"
    val = None
    if evaluate:
        queries = eval_queries(splits["validation"], script_args.max_eval_samples, training_args.seed)
        val = to_hf(sft_records(queries, builder), columns=["prompt", "completion"])
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)
    trainer = SFTTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train,
        eval_dataset=val,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    return train_and_save(trainer, "sft", script_args, training_args, dataset, store, tokenizer, splits, run=run)


def report_reachability(records, dataset, training_args) -> dict:
    """How much of the gold the training prompts can express (``examples.reachability``),
    pooled and per dataset: logged, and written to ``output_dir/reachability.json``. A gold
    window no line or cue touches is a target SFT cannot teach."""
    from tider.data import MEMORIES_OF

    groups = dataset.stats.get(MEMORIES_OF) or {dataset.name: list(dataset.memories)}
    shares = reachability(records, groups, {q.key: q.memory_key for q in dataset.queries})
    for name, row in shares.items():
        if row["gold_windows"] and not (name == "pooled" and len(groups) == 1):  # one dataset: its row is the pool
            logger.info(
                "reachability (%s, train): %d temporal questions; gold windows touched %.3f, exact %.3f; "
                "targets naming every gold window %.3f, abstaining %.3f; every question's target: %s",
                name,
                row["questions"],
                row["gold_windows_touched"],
                row["gold_windows_exact"],
                row["targets_whole"],
                row["targets_abstain"],
                ", ".join(f"{k} {v:.3f}" for k, v in row["targets_by_kind"].items()),
            )
    if training_args.process_index == 0:
        out = Path(training_args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "reachability.json").write_text(json.dumps(shares, indent=2))
    return shares

"""GRPO of the locator with TRL's ``GRPOTrainer`` (TIDER Sec. 3.3): composite rewards from
``tider.train.rewards`` weighted by ``reward_weights``, DAR-resampled prompts, and the
gold columns the rewards read passed through the dataset (TRL forwards extra columns
to reward functions as keyword arguments)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tider.train.dar import dar_resample, effective_probabilities
from tider.train.locator_data import grpo_records, prepare, resume_arg, start_wandb_run, to_hf, training_metadata
from tider.train.rewards import RewardContext, make_rewards
from tider.train.sft import model_init_kwargs

logger = logging.getLogger(__name__)


def reward_context(script_args, dataset, store=None) -> RewardContext:
    reader = None
    if "answer_correct" in script_args.reward_funcs:
        from tider.llm.client import make_client

        if not script_args.reader_model:
            raise ValueError("reward 'answer_correct' needs reader_model (and reader_base_url) in the recipe")
        # reader_base_url: a server (reader_model names the served model); else reader_model is a checkpoint.
        url = script_args.reader_base_url
        reader = make_client(url or script_args.reader_model, model=script_args.reader_model if url else None)
    return RewardContext(dataset=dataset, k=script_args.retrieval_k, proximity_tau_units=script_args.proximity_tau, reader=reader,
                         store=store)


def run_grpo(script_args, training_args, model_args, *, dataset=None, store=None):
    from trl import GRPOTrainer, get_peft_config

    run = start_wandb_run(training_args, script_args.wandb_project)
    model_path = model_args.model_name_or_path
    dataset, store, tokenizer, builder, splits = prepare(script_args, model_path, stage="grpo", dataset=dataset, store=store)
    records = grpo_records(splits["train"], builder)
    if script_args.dar:
        probs = effective_probabilities([r["n_gold_windows"] for r in records], script_args.dar_factors)
        records = dar_resample(records, script_args.dar_factors, seed=training_args.seed)
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / "dar.json").write_text(json.dumps({"factors": script_args.dar_factors, "effective_probabilities": probs}, indent=2))
    train = to_hf(records, script_args.max_train_samples)
    evaluate = training_args.eval_strategy != "no"
    val = to_hf(grpo_records(splits["validation"], builder), script_args.max_eval_samples) if evaluate else None
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=make_rewards(script_args.reward_funcs, reward_context(script_args, dataset, store)),
        args=training_args,
        train_dataset=train,
        eval_dataset=val,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    if script_args.dar:
        _log_dar(probs)
    trainer.train(resume_from_checkpoint=resume_arg(training_args))
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json (log history) next to the final weights
    tokenizer.save_pretrained(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        training_metadata(script_args, dataset, store, train_query_keys=[q.key for q in splits["train"]],
                          chat_template_kwargs=training_args.chat_template_kwargs).write(training_args.output_dir)
    if run is not None:
        run.finish()  # the next stage in this process opens its own run
    return trainer


def _log_dar(probs: dict) -> None:
    logger.info("DAR effective probabilities: %s", probs)
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        wandb.config.update({f"dar_effective_probability/{k}": v for k, v in probs.items()}, allow_val_change=True)

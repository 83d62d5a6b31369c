"""Data and model plumbing shared by ``tider sft`` and ``tider grpo``: load the benchmark,
split it by conversation, build the tiny model when a recipe asks for one, and turn the
splits into TRL records with prompts truncated by the policy's own tokenizer.

What shapes the run's prompts is written next to the checkpoint (``tider_locator.json``,
``training_metadata``) so the ``locator`` window source, export and serving rebuild exactly
the training prompt.
"""

from __future__ import annotations

import logging
import os
import random
from datetime import timedelta
from pathlib import Path

from tider.locator.contract import METADATA_FILE, NO_THINKING, OUTPUT_SCHEMA, LocatorMetadata, input_settings
from tider.train.examples import PromptBuilder, corpus_texts, grpo_records, sft_records, split_queries
from tider.types import Dataset

logger = logging.getLogger(__name__)


def start_wandb_run(training_args, project: str):
    """Open the wandb run the trainer's callback then logs into (it reuses an open run):
    in ``project`` unless ``WANDB_PROJECT`` says otherwise, and offline unless the user has
    an API key or chose ``WANDB_MODE``. Passed as arguments, so the process environment is
    left as the caller set it. Main process only, like the callback itself."""
    if "wandb" not in (training_args.report_to or []) or training_args.process_index != 0:
        return None
    import wandb

    if wandb.run is not None:
        return wandb.run
    offline = not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", project),
        name=training_args.run_name,
        mode="offline" if offline else None,
    )


def load_training_dataset(script_args) -> Dataset:
    """The recipe's data (``dataset_name``/``dataset_path``, comma-separated for several),
    plus ``synthetic_train_conversations`` train-only conversations."""
    from tider.data import combine

    names = [n.strip() for n in script_args.dataset_name.split(",")]
    paths = [p.strip() or None for p in (script_args.dataset_path or "").split(",")]
    if len(paths) < len(names):
        paths += [None] * (len(names) - len(paths))
    dataset = combine([_load_one(script_args, name, path) for name, path in zip(names, paths)])
    if script_args.synthetic_train_conversations:
        dataset = with_train_conversations(
            dataset, script_args.synthetic_train_conversations, script_args.synthetic_train_seed
        )
    return dataset


def _load_one(script_args, name: str, path: str | None) -> Dataset:
    from tider.data import load_dataset

    if name != "synthetic" or path is not None:
        return load_dataset(name, path)
    if script_args.synthetic_messages:
        from tider.data.synth import generate

        return generate(
            script_args.synthetic_messages,
            seed=script_args.dataset_seed,
            n_conversations=script_args.synthetic_conversations,
        )
    return load_dataset("synthetic", seed=script_args.dataset_seed)


def with_train_conversations(dataset: Dataset, n: int, seed: int) -> Dataset:
    """``dataset`` plus ``n`` synthetic conversations (seed ``seed``, as long as the
    dataset's on average) that only ever land in the train split (``examples.TRAIN_ONLY``)."""
    from tider.data.synth import generate
    from tider.train.examples import TRAIN_ONLY

    seeds = [dataset.stats.get("seed")] + [v.get("seed") for v in dataset.stats.values() if isinstance(v, dict)]
    if seed in seeds:
        raise ValueError(
            f"synthetic_train_seed {seed} is the benchmark's own seed: train-only conversations must differ"
        )
    per_conversation = round(sum(len(m) for m in dataset.memories.values()) / max(1, len(dataset.memories)))
    extra = generate(per_conversation * n, seed=seed, n_conversations=n, key_prefix=f"synth-t{seed}")
    if dataset.granularity != extra.granularity:
        raise ValueError(
            f"train-only synthetic conversations are {extra.granularity!r}-grained, "
            f"{dataset.name!r} is {dataset.granularity!r}"
        )
    stats = {**dataset.stats, TRAIN_ONLY: sorted(extra.memories)}
    return Dataset(
        dataset.name,
        dataset.granularity,
        {**dataset.memories, **extra.memories},
        dataset.queries + extra.queries,
        stats,
    )


def date_range_tokens(dataset: Dataset, margin_days: int = 60) -> list[str]:
    """Every ISO date the data (messages and question times) can mention, with a margin
    for relative questions that point before the first message."""
    from tider.train.tiny import iso_dates

    stamps = [m.timestamp for mem in dataset.memories.values() for m in mem] + [q.asked_at for q in dataset.queries]
    first, last = min(stamps).date(), max(stamps).date()
    return iso_dates(first - timedelta(days=margin_days), last + timedelta(days=margin_days))


def ensure_tiny_model(script_args, model_path: str, dataset: Dataset, builder: PromptBuilder) -> None:
    """Build the tiny Qwen3 at ``model_path`` unless a checkpoint is already there (so a
    resumed or repeated run keeps the same tokenizer and initial weights)."""
    from tider.train.tiny import build_tiny_qwen3

    if (Path(model_path) / "config.json").exists():
        return
    train_queries = split_queries(dataset, script_args.split_seed, **fixed_split(script_args))["train"]
    corpus = corpus_texts(dataset, train_queries, sft_records(train_queries, builder))
    dates = date_range_tokens(dataset) if script_args.tiny_date_tokens else []
    logger.info("building tiny Qwen3 at %s (%d corpus texts, %d date tokens)", model_path, len(corpus), len(dates))
    build_tiny_qwen3(
        model_path,
        corpus,
        vocab_size=script_args.tiny_vocab_size,
        date_tokens=dates,
        hidden_size=script_args.tiny_hidden_size,
        num_layers=script_args.tiny_num_layers,
        num_heads=script_args.tiny_num_heads,
        num_kv_heads=max(1, script_args.tiny_num_heads // 2),
        intermediate_size=2 * script_args.tiny_hidden_size,
        structured_date_init=script_args.tiny_structured_date_init and bool(dates),
        lexical_init=script_args.tiny_lexical_init,
    )


def prepare(
    script_args, model_path: str, *, stage: str, dataset: Dataset | None = None, store=None, training_args=None
):
    """Return ``(dataset, store, tokenizer, builder, splits)``; builds the tiny model if asked
    (the main process builds it, the other ranks then load the same files).
    ``store`` (a ``tider.memory.MemoryCollection``) is built once here and shared by prompts and rewards."""
    from transformers import AutoTokenizer

    from tider.memory import MemoryCollection

    dataset = dataset or load_training_dataset(script_args)
    store = store or MemoryCollection(dataset.memories)
    builder = PromptBuilder(dataset, store, settings=script_args.prompt_settings())
    store.prepare(dataset.queries)  # one batched encode of every question the prompts need
    if script_args.tiny_model:
        with main_process_first(training_args, "tiny model"):
            ensure_tiny_model(script_args, model_path, dataset, builder)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    builder.tokenizer = tokenizer
    splits = split_queries(dataset, script_args.split_seed, **fixed_split(script_args))
    logger.info("%s on %s: %s", stage, dataset.name, {k: len(v) for k, v in splits.items()})
    return dataset, store, tokenizer, builder, splits


def fixed_split(script_args) -> dict:
    """The recipe's fixed split (``validation_memories`` / ``test_memories``), if any."""
    # An empty name is no memory: a command line clears a recipe's list with `--test_memories ""`.
    return {
        "validation": [k for k in script_args.validation_memories if k],
        "test": [k for k in script_args.test_memories if k],
    }


def main_process_first(training_args, what: str):
    """``TrainingArguments.main_process_first``: rank 0 runs the block, then the others do
    (and find its files); a no-op context without training arguments."""
    from contextlib import nullcontext

    return training_args.main_process_first(local=False, desc=what) if training_args is not None else nullcontext()


def is_main_process(training_args) -> bool:
    return training_args is None or training_args.process_index == 0


def train_and_save(
    trainer,
    stage: str,
    script_args,
    training_args,
    dataset: Dataset,
    store,
    tokenizer,
    splits,
    run=None,
    chat_template_kwargs: dict | None = None,
):
    """Both stages' tail: one progress line, which process this is (in the rank's log; the
    2-rank test reads it), train (resuming if asked), save weights and state (the trainer
    writes from the main process), then tokenizer and locator metadata from rank 0 only."""
    from tider.train.output import install_progress

    install_progress(trainer, stage)
    acc = trainer.accelerator
    logger.info("%s: process %d of %d (%s)", stage, acc.process_index, acc.num_processes, acc.distributed_type)
    trainer.train(resume_from_checkpoint=resume_arg(training_args))
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json (log history) next to the final weights
    if is_main_process(training_args):
        tokenizer.save_pretrained(training_args.output_dir)
        training_metadata(
            script_args,
            dataset,
            store,
            train_query_keys=[q.key for q in splits["train"]],
            chat_template_kwargs=chat_template_kwargs,
        ).write(training_args.output_dir)
        logger.info("wrote %s", Path(training_args.output_dir) / METADATA_FILE, extra={"file_only": True})
    if run is not None:
        run.finish()  # the next stage in this process opens its own run
    return trainer


def eval_queries(queries: list, limit: int | None, seed: int) -> list:
    """The validation queries an in-training evaluation scores: all of them, or a seeded
    sample of ``limit`` in their original order, so that a cap spans every conversation and
    question type instead of the first conversation's first questions."""
    if not limit or limit >= len(queries):
        return list(queries)
    keep = sorted(random.Random(seed).sample(range(len(queries)), limit))
    return [queries[i] for i in keep]


def to_hf(records: list[dict], limit: int | None = None, columns: list[str] | None = None):
    from datasets import Dataset as HFDataset

    records = records[:limit] if limit else records
    if columns is not None:
        records = [{c: r[c] for c in columns} for r in records]
    return HFDataset.from_list(records)


def training_data_hash(dataset: Dataset, query_keys) -> str:
    """Identifies the training data: dataset name + the training query keys."""
    import hashlib

    blob = dataset.name + "\n" + "\n".join(sorted(query_keys))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def training_metadata(
    script_args, dataset: Dataset, store, *, train_query_keys=(), chat_template_kwargs: dict | None = None
) -> LocatorMetadata:
    """What shapes the locator's input in this run (``tider.locator.contract``): the prompt
    settings, and the store's timeline settings and embedding model. Written next to the
    checkpoint; read by the ``locator`` source, export and serving."""
    settings = script_args.prompt_settings().to_json()
    return LocatorMetadata(
        granularity=dataset.granularity,
        prompt_settings=settings,
        output_schema=OUTPUT_SCHEMA,
        chat_template_kwargs=dict(chat_template_kwargs or NO_THINKING),
        training_data_hash=training_data_hash(dataset, train_query_keys),
        dataset_name=dataset.name,
        split_seed=script_args.split_seed,
        validation_memories=list(script_args.validation_memories) or None,
        test_memories=list(script_args.test_memories) or None,
        **input_settings(store.config),
    )


def resume_arg(training_args):
    """``resume_from_checkpoint: true`` means the newest *complete* checkpoint in output_dir,
    if any: one whose ``trainer_state.json`` (which transformers writes last) exists, so a
    run killed while saving resumes from the checkpoint before."""
    value = training_args.resume_from_checkpoint
    if value in (None, False, "", "false", "False"):
        return None
    _load_cpu_ranks_checkpoints()
    if value in (True, "true", "True"):
        return last_complete_checkpoint(training_args.output_dir)
    return value


def _load_cpu_ranks_checkpoints() -> None:
    """transformers 5.17 loads the optimizer state of a multi-process run with
    ``map_location=args.device``, which on CPU ranks is ``cpu:0``/``cpu:1``, a location
    torch's loader does not know ("don't know how to restore data location ... cpu:0").
    Teach it that ``cpu:N`` is the CPU (registered once; every other location unchanged)."""
    import re

    from torch import serialization

    if getattr(_load_cpu_ranks_checkpoints, "done", False):
        return

    def indexed_cpu(obj, location):
        return obj if isinstance(location, str) and re.fullmatch(r"cpu:\d+", location) else None

    serialization.register_package(97, lambda obj: None, indexed_cpu)  # a priority of its own
    _load_cpu_ranks_checkpoints.done = True


def last_complete_checkpoint(output_dir: str) -> str | None:
    folder = Path(output_dir)
    done = [
        p
        for p in folder.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").exists()
    ]
    if not done:
        return None
    newest = max(done, key=lambda p: int(p.name.split("-")[-1]))
    logger.info("resuming from %s", newest)
    return str(newest)


__all__ = [
    "eval_queries",
    "grpo_records",
    "prepare",
    "resume_arg",
    "sft_records",
    "start_wandb_run",
    "to_hf",
    "train_and_save",
    "training_metadata",
]

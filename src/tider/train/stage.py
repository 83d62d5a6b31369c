"""What ``tider sft`` and ``tider grpo`` run around their trainer: ``prepare`` before it
(dataset, store, tokenizer, prompt builder, splits; rank 0 builds the tiny model if asked),
``train_and_save`` after it (train, resume, save weights, tokenizer and locator metadata),
and the rank, wandb and checkpoint-resume plumbing both stages share.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from tider.data.splits import split_queries
from tider.locator.contract import METADATA_FILE
from tider.train.data import fixed_split, load_training_dataset, training_metadata
from tider.train.examples import PromptBuilder
from tider.train.tiny import ensure_tiny_model
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


def prepare(
    script_args, model_path: str, *, stage: str, dataset: Dataset | None = None, store=None, training_args=None
):
    """Return ``(dataset, store, tokenizer, builder, splits)``; builds the tiny model if asked.
    ``store`` (a ``tider.memory.MemoryCollection``) is built once here and shared by prompts and rewards.

    The data is prepared once: rank 0 embeds every message and question and resolves every
    question's time expressions into the on-disk caches (``$TIDER_CACHE``, default
    ``.cache/tider`` under the working directory: on a cluster, a filesystem every node
    shares) while the other ranks wait; they then read the same caches and compute nothing."""
    from transformers import AutoTokenizer

    with main_process_first(training_args, "prepare data"):
        t0 = time.monotonic()
        dataset, store, builder, resolved = _prepare_data(script_args, dataset, store)
        rank = os.environ.get("RANK", "0")
        logger.info("data on rank %s: %d time expressions resolved here, %.1f s", rank, resolved, time.monotonic() - t0)
        if script_args.tiny_model:
            ensure_tiny_model(script_args, model_path, dataset, builder)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    builder.tokenizer = tokenizer
    splits = split_queries(dataset, script_args.split_seed, **fixed_split(script_args))
    logger.info("%s on %s: %s", stage, dataset.name, {k: len(v) for k, v in splits.items()})
    return dataset, store, tokenizer, builder, splits


def _prepare_data(script_args, dataset, store):
    from tider.locator.rules import prepare_cues
    from tider.memory import MemoryCollection

    dataset = dataset or load_training_dataset(script_args)
    store = store or MemoryCollection(dataset.memories, script_args.retrieval())
    builder = PromptBuilder(dataset, store, settings=script_args.prompt_settings())
    held_out = set(script_args.test_memories or ())
    for key in dict.fromkeys(q.memory_key for q in dataset.queries):
        if key not in held_out and len(dataset.memories[key]):
            store.get(key)  # embeds its messages: rank 0 writes the cache the others read
    store.prepare(dataset.queries)  # one batched encode of every question the prompts need
    resolved = prepare_cues(builder.resolver, dataset.queries, dataset.memories)  # on every core
    return dataset, store, builder, resolved


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
    decoding: dict | None = None,
):
    """Both stages' tail: one progress line, which process this is (in the rank's log; the
    2-rank test reads it), train (resuming if asked), save weights and state (the trainer
    writes from the main process), then tokenizer and locator metadata from rank 0 only."""
    from tider.train.output import install_progress

    install_progress(trainer, stage)
    stop = StopOnRequest(training_args.output_dir)
    trainer.add_callback(stop)
    acc = trainer.accelerator
    logger.info("%s: process %d of %d (%s)", stage, acc.process_index, acc.num_processes, acc.distributed_type)
    trainer.train(resume_from_checkpoint=resume_arg(training_args))
    if stop.stopped:  # a checkpoint, not the final model: the requeued job resumes from it
        return trainer
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
            decoding=decoding,
        ).write(training_args.output_dir)
        logger.info("wrote %s", Path(training_args.output_dir) / METADATA_FILE, extra={"file_only": True})
    if run is not None:
        run.finish()  # the next stage in this process opens its own run
    return trainer


STOP_FILE = "tider-stop-requested"


class StopOnRequest(TrainerCallback):
    """Save a checkpoint and stop at the next step when ``OUTPUT_DIR/tider-stop-requested``
    appears: scripts/slurm/train.slurm creates it when SLURM signals that the time limit is
    near (``--signal``), then requeues the job, which resumes from that checkpoint. Every
    rank decides together (a max over ranks), so no rank saves alone. train.slurm removes
    the file when a job (re)starts; by hand, delete it to train on."""

    def __init__(self, output_dir: str):
        self.flag = Path(output_dir) / STOP_FILE
        self.stopped = False

    def on_step_end(self, args, state, control, **kwargs):
        import torch
        import torch.distributed as dist

        asked = torch.tensor([float(self.flag.exists())])
        if dist.is_available() and dist.is_initialized():
            if dist.get_backend() != "gloo":
                asked = asked.to(args.device)  # NCCL reduces on the GPU
            dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if asked.item() > 0:
            logger.info("%s exists: saving a checkpoint at step %d and stopping", self.flag, state.global_step)
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control


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

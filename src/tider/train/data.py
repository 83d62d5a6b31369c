"""The training data of ``tider sft`` and ``tider grpo``: the recipe's benchmark (plus
train-only synthetic conversations), its fixed split, the validation sample an in-training
evaluation scores, Hugging Face datasets for TRL, and ``training_metadata``: the data and
prompt settings a checkpoint was trained on, written next to it (``tider_locator.json``) so
the ``locator`` window source, export and serving rebuild exactly the training prompt.
"""

from __future__ import annotations

import random

from tider.locator.contract import NO_THINKING, LocatorMetadata, input_settings, recorded_schema
from tider.types import Dataset


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
    dataset's on average) that only ever land in the train split (``tider.data.splits.TRAIN_ONLY``)."""
    from tider.data.splits import TRAIN_ONLY
    from tider.data.synth import generate

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


def fixed_split(script_args) -> dict:
    """The recipe's fixed split (``validation_memories`` / ``test_memories``), if any."""
    # An empty name is no memory: a command line clears a recipe's list with `--test_memories ""`.
    return {
        "validation": [k for k in script_args.validation_memories if k],
        "test": [k for k in script_args.test_memories if k],
    }


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
    script_args,
    dataset: Dataset,
    store,
    *,
    train_query_keys=(),
    chat_template_kwargs: dict | None = None,
    decoding: dict | None = None,
) -> LocatorMetadata:
    """What shapes the locator's input in this run (``tider.locator.contract``): the prompt
    settings, and the store's timeline settings and embedding model. Written next to the
    checkpoint; read by the ``locator`` source, export and serving."""
    settings = script_args.prompt_settings().to_json()
    return LocatorMetadata(
        granularity=dataset.granularity,
        prompt_settings=settings,
        output_schema=recorded_schema(settings),
        chat_template_kwargs=dict(chat_template_kwargs or NO_THINKING),
        training_data_hash=training_data_hash(dataset, train_query_keys),
        dataset_name=dataset.name,
        split_seed=script_args.split_seed,
        validation_memories=list(script_args.validation_memories) or None,
        test_memories=list(script_args.test_memories) or None,
        decoding=decoding,
        **input_settings(store.config),
    )

"""The locator's whole job as one pipeline, its stages as data:

    prepare (data, indexes) -> SFT -> GRPO -> export -> serve -> compare

``run(stages, out)`` runs the stages in order, each under a numbered banner and timed; they
share a ``Run``: the data, the latest model (what the next stage exports, serves or
compares), the locator's source options and each stage's result. A stage whose output is
already there is skipped, so an interrupted run resumes. ``tider demo`` and the learning
benchmarks (bench/bench_real.py, bench/bench_learning.py) only name their data, recipes and
options; bench/benchlib.py adds the benchmarks' held-out reward stage.

It sits above ``tider.train`` and ``tider.eval`` (it drives both): nothing below imports it.
Heavy imports stay inside the stages.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# What tider.train.data.load_training_dataset reads: recipes that agree on these load the
# same data, so in-process trainers share one loaded dataset and its store.
DATA_FIELDS = (
    "dataset_name",
    "dataset_path",
    "dataset_seed",
    "synthetic_messages",
    "synthetic_conversations",
    "synthetic_train_conversations",
    "synthetic_train_seed",
)


@dataclass
class Run:
    """What the stages of one run share."""

    out: Path
    dataset: Any = None
    store: Any = None
    data_key: tuple | None = None  # the recipe data ``dataset`` was loaded from
    data_path: str | None = None  # the benchmark file the comparison reports
    model: Path | None = None  # the latest checkpoint or export
    dtype: str | None = None  # the export's
    locator: dict | None = None  # the locator's source options once served
    results: dict = field(default_factory=dict)  # each stage's output, by stage name
    times: dict = field(default_factory=dict)  # seconds per stage, this run
    skipped: set = field(default_factory=set)  # stages whose output was already there
    stack: ExitStack = field(default_factory=ExitStack)  # a server lives until the run ends

    def data_for(self, script_args):
        """``(dataset, store)`` of a recipe's data: the run's own when the recipe reads the
        same data, else loaded (and kept as the run's when it has none yet)."""
        key = tuple(getattr(script_args, name) for name in DATA_FIELDS)
        if self.dataset is not None and key == self.data_key:
            return self.dataset, self.store
        from tider.memory.collection import MemoryCollection
        from tider.train.data import load_training_dataset

        dataset = load_training_dataset(script_args)
        store = MemoryCollection(dataset.memories)
        if self.dataset is None:
            self.dataset, self.store, self.data_key = dataset, store, key
        return dataset, store


def run(stages: Sequence, out: str | Path) -> Run:
    """Run ``stages`` (callables on a ``Run``, each with a ``name`` and a ``title``) under ``out``."""
    state = Run(Path(out))
    state.out.mkdir(parents=True, exist_ok=True)
    with state.stack:
        for i, stage in enumerate(stages, 1):
            print(f"\n=== [{i}/{len(stages)}] {stage.title}", flush=True)
            t0 = time.monotonic()
            stage(state)
            state.times[stage.name] = round(time.monotonic() - t0, 1)
            print(f"--- {stage.name}: {state.times[stage.name]} s", flush=True)
    return state


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def trained(folder: Path) -> bool:
    from tider.locator.contract import METADATA_FILE

    return (folder / METADATA_FILE).exists() and any(folder.glob("*.safetensors"))


@dataclass
class Data:
    """Prepare: a benchmark by its loader. ``synthetic`` = (messages, conversations) generates
    the synthetic benchmark (seed 0) at ``path`` first, so training and evaluation read one file."""

    loader: str
    path: str | None = None
    synthetic: tuple[int, int] | None = None
    name = "data"

    @property
    def title(self) -> str:
        return f"dataset: {self.loader}"

    def __call__(self, run: Run) -> None:
        from tider.data import load_dataset

        if self.synthetic and not Path(self.path).exists():
            from tider.data.synth import generate, write

            messages, conversations = self.synthetic
            write(generate(messages, seed=0, n_conversations=conversations), self.path)
        dataset = run.dataset = load_dataset(self.loader, self.path)
        run.data_path = self.path
        n_msgs = sum(len(m) for m in dataset.memories.values())
        print(f"{dataset.name}: {len(dataset.memories)} memories, {n_msgs} messages, {len(dataset.queries)} queries")


@dataclass
class RecipeData:
    """Prepare: the data a training stage's recipe names (loaded once; the trainers share it)."""

    train: Train
    name = "data"

    @property
    def title(self) -> str:
        return f"data of {self.train.recipe.name}"

    def __call__(self, run: Run) -> None:
        dataset, _ = run.data_for(self.train.parse()[0])
        print(f"{dataset.name}: {len(dataset.memories)} memories, {len(dataset.queries)} queries")


class Indexes:
    """Prepare: timeline and indexes, query embeddings and time expressions (cached on disk;
    training and evaluation reuse them)."""

    name = "indexes"
    title = "timeline + BM25/faiss indexes + time expressions"

    def __call__(self, run: Run) -> None:
        from tider.locator.rules import prepare_cues, shared_resolver
        from tider.memory import MemoryCollection

        dataset = run.dataset
        store = MemoryCollection(dataset.memories)
        store.prepare(dataset.queries)
        n_entries = sum(len(store.timeline(k)) for k in dataset.memories)
        print(f"timeline: {n_entries} event clusters over {len(dataset.memories)} memories")
        resolved = prepare_cues(shared_resolver(), dataset.queries, dataset.memories)
        print(f"time expressions: {len(dataset.queries)} questions ({resolved} resolved now, the rest cached)")


@dataclass
class Train:
    """SFT or GRPO (``kind``) with ``recipe`` from ``start`` (None: the recipe's own model)
    into ``folder``; ``args`` override the recipe. ``fresh_process``: the trainer runs as
    ``tider sft|grpo`` in a subprocess (a clean process that frees its memory, and one that
    has not loaded numba, as vLLM colocated on CPU needs); else in this one, on the run's data."""

    kind: str
    recipe: Path
    folder: Path
    start: str | None = None
    args: Sequence[str] = ()
    fresh_process: bool = False

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def title(self) -> str:
        return f"{self.kind.upper()} (configs/{self.kind}/{self.recipe.name})"

    def argv(self) -> list[str]:
        model = ["--model_name_or_path", self.start] if self.start else []
        return ["--config", str(self.recipe), "--output_dir", str(self.folder), *model, *self.args]

    def parse(self):
        """The recipe with its overrides: ``(script_args, training_args, model_args)``."""
        from tider.train.config import parse_recipe

        return parse_recipe(self.kind, self.argv())

    def __call__(self, run: Run) -> None:
        if trained(self.folder):
            run.skipped.add(self.name)
        elif self.fresh_process:
            argv = [sys.executable, "-m", "tider.cli", self.kind, *self.argv()]
            print("$", " ".join(argv[2:]), flush=True)
            # The caller's directory: every path handed over is absolute, and an installed
            # package has no checkout to run in.
            subprocess.run(argv, check=True)
        else:
            from tider.train.grpo import run_grpo
            from tider.train.sft import run_sft

            script, training, model = self.parse()
            dataset, store = run.data_for(script)
            (run_sft if self.kind == "sft" else run_grpo)(script, training, model, dataset=dataset, store=store)
        run.model = self.folder


@dataclass
class Export:
    """The latest checkpoint exported to ``out/export``, verified by reload (logits and greedy
    outputs). ``dtype`` None: float32 on CPU (exact vLLM parity), bfloat16 on GPU."""

    dtype: str | None = None
    name = "export"
    title = "export"

    def __call__(self, run: Run) -> None:
        import json

        from tider.train.export import export_locator

        folder = run.out / "export"
        run.dtype = self.dtype or ("float32" if on_cpu() else "bfloat16")
        if (folder / "export_report.json").exists():
            run.skipped.add(self.name)
        else:
            report = export_locator(run.model, folder, dtype=run.dtype, overwrite=True)
            if not report.greedy_identical:
                raise SystemExit(f"export differs from the checkpoint: {report.greedy_mismatches[:1]}")
        exported = json.loads((folder / "export_report.json").read_text())
        print(
            f"export: {exported['dtype']} ({exported['source_layout']}), "
            f"max |logit diff| {exported['max_abs_logit_diff']}, greedy identical: {exported['greedy_identical']}"
        )
        run.model = folder


@dataclass
class Serve:
    """The export behind a server for the rest of the run: ``server(model, dtype, log)``
    makes it (a vLLM server, e.g. ``tider.commands.serve.make_server``'s: the caller's, as
    the commands sit above this module); None: the locator through local transformers."""

    server: Callable[[Path, str, Path], Any] | None = None
    name = "serve"

    @property
    def title(self) -> str:
        return "serve the export with vLLM" if self.server else "locator via local transformers"

    def __call__(self, run: Run) -> None:
        if self.server is None:
            run.locator = {"model": str(run.model)}
            return
        log = run.out / "vllm.log"
        server = self.server(run.model, run.dtype, log)
        run.stack.enter_context(server)
        print(f"vLLM serving {run.model} at {server.base_url} (log {log})")
        run.locator = {"url": server.base_url}


@dataclass
class Compare:
    """``tider eval compare`` (``run_compare``) into ``out/folder`` with ``config``, its
    locator ``locator``, else the run's served model, else its latest one. ``memory_keys`` picks the memories
    once the run knows them (e.g. from the export's split seed); ``dataset`` None: the run's."""

    config: Any  # tider.eval.compare.CompareConfig
    folder: str = "compare"
    locator: dict | None = None  # the locator's source options; None: the run's served or latest model
    memory_keys: Callable[[Run], Sequence[str] | None] | None = None
    dataset: Any = None
    overwrite: bool = False
    progress: bool = True
    name: str = "compare"
    title: str = "compare"

    def __call__(self, run: Run) -> None:
        from tider.eval.compare import run_compare

        locator = self.locator or run.locator or {"model": str(run.model)}
        options = {**self.config.source_options, "locator": locator}
        keys = self.memory_keys(run) if self.memory_keys else self.config.memory_keys
        config = replace(self.config, source_options=options, memory_keys=keys)
        dataset, data_path = (run.dataset, run.data_path) if self.dataset is None else (self.dataset, None)
        run.results[self.name] = run_compare(
            dataset,
            config,
            run.out / self.folder,
            data_path=data_path,
            overwrite=self.overwrite,
            progress=self.progress,
        )

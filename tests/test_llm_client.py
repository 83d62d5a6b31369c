"""LLMClient: typed parse failures, bounded retries, cache, per-stage usage, errors as
results (never exceptions) -- against the real local transformers backend."""

from __future__ import annotations

import pytest

from tider.llm.backends import Completion, LocalHFBackend, OpenAIBackend
from tider.llm.cache import LLMCache
from tider.llm.client import LLMClient
from tider.llm.jsonout import parse_json_object
from tider.llm.vllm_server import build_server_command, free_port

SCHEMA = {"type": "object", "properties": {"key": {"type": "array", "items": {"type": "integer"}}}, "required": ["key"]}


def test_parse_json_object_typed_failures():
    assert parse_json_object('<think>{"key": "no"}</think> sure: {"key": [1, 2]} done', SCHEMA) == (
        {"key": [1, 2]},
        None,
    )
    assert parse_json_object('```json\n{"key": [3]}\n```', SCHEMA) == ({"key": [3]}, None)
    assert parse_json_object("   ", SCHEMA) == (None, "empty_output")
    assert parse_json_object("no braces here", SCHEMA) == (None, "no_json")
    assert parse_json_object('{"key": [1, ', SCHEMA) == (None, "no_json")
    obj, reason = parse_json_object('{"key": "x"}', SCHEMA)
    assert obj is None and reason.startswith("schema_mismatch")


class ScriptedBackend:
    """A deterministic backend replaying a script (to count retries exactly)."""

    model = "scripted"

    def __init__(self, outputs):
        self.outputs, self.calls = list(outputs), 0

    def describe(self):
        return {"backend": "scripted"}

    def generate(self, messages, **kwargs):
        self.calls += 1
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return Completion(out, prompt_tokens=10, completion_tokens=5)


class BatchFailingBackend(ScriptedBackend):
    """Batched generation fails the way a long batch runs out of memory; one by one works."""

    def __init__(self, outputs, batch_error):
        super().__init__(outputs)
        self.batch_error = batch_error

    def generate_batch(self, batch, **kwargs):
        raise self.batch_error


def test_failed_batch_is_redone_one_by_one_and_counted(caplog):
    backend = BatchFailingBackend(["a", "b"], RuntimeError("CPU out of memory"))
    client = LLMClient(backend, max_retries=0)
    batch = [[{"role": "user", "content": "q1"}], [{"role": "user", "content": "q2"}]]
    with caplog.at_level("WARNING", logger="tider.llm.client"):
        results = client.chat_batch(batch, stage="answer")
    assert [r.text for r in results] == ["a", "b"] and backend.calls == 2
    assert client.usage_by_stage()["answer"]["batch_fallbacks"] == 1
    assert "batched generation of 2 prompts failed (RuntimeError: CPU out of memory)" in caplog.text
    # A programming error in the backend is not swallowed into a fallback.
    broken = LLMClient(BatchFailingBackend(["a", "b"], TypeError("bad argument")), max_retries=0)
    with pytest.raises(TypeError, match="bad argument"):
        broken.chat_batch(batch, stage="answer")


def test_retries_then_success_and_cache(tmp_path):
    backend = ScriptedBackend([TimeoutError("slow"), "garbage", '{"key": [7]}'])
    client = LLMClient(backend, cache=LLMCache(tmp_path / "c.sqlite"), max_retries=2, backoff=0)
    msgs = [{"role": "user", "content": "q"}]
    result = client.chat(msgs, stage="select", json_schema=SCHEMA)
    assert result.ok and result.parsed_json == {"key": [7]} and result.attempts == 3 and backend.calls == 3
    again = client.chat(msgs, stage="select", json_schema=SCHEMA)
    assert again.cached and again.parsed_json == {"key": [7]} and backend.calls == 3
    usage = client.usage_by_stage()["select"]
    assert usage["calls"] == 2 and usage["cached_calls"] == 1 and usage["prompt_tokens"] == 20


def test_persistent_failure_is_an_error_result_not_cached(tmp_path):
    backend = ScriptedBackend(["nope", "still nope", '{"key": [1]}'])
    client = LLMClient(backend, cache=LLMCache(tmp_path / "c.sqlite"), max_retries=1, backoff=0)
    msgs = [{"role": "user", "content": "q"}]
    result = client.chat(msgs, stage="structure", json_schema=SCHEMA)
    assert result.error == "no_json" and result.attempts == 2 and backend.calls == 2
    assert client.usage_by_stage()["structure"]["errors"] == 1
    # failures are not cached: the next run retries and can succeed
    assert client.chat(msgs, stage="structure", json_schema=SCHEMA).parsed_json == {"key": [1]}


def test_unreachable_server_gives_error_results():
    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}/v1", "m", timeout=2)
    client = LLMClient(backend, max_retries=1, backoff=0, concurrency=2)
    results = client.chat_batch([[{"role": "user", "content": f"q{i}"}] for i in range(3)], stage="answer")
    assert all(r.error and r.error.startswith("request_failed") for r in results)
    assert client.usage_by_stage()["answer"]["errors"] == 3


def test_local_hf_backend_batch_matches_single(tiny_qwen3_dir, tmp_path):
    backend = LocalHFBackend(str(tiny_qwen3_dir), batch_size=4, chat_template_kwargs={"enable_thinking": False})
    client = LLMClient(backend, cache=LLMCache(tmp_path / "c.sqlite"), max_retries=0)
    batch = [[{"role": "user", "content": t}] for t in ("hello", "When did Alice move?", "x")]
    together = client.chat_batch(batch, stage="answer", max_tokens=6)
    single = LLMClient(backend, max_retries=0).chat(batch[1], stage="answer", max_tokens=6)
    assert together[1].text == single.text  # greedy + left padding: batching does not change outputs
    assert all(r.usage["prompt_tokens"] > 0 for r in together)
    schema_results = client.chat_batch(batch, stage="select", json_schema=SCHEMA, max_tokens=6)
    assert all(r.parsed_json is None and r.error for r in schema_results)  # random weights: typed failure


def test_server_command_assembly():
    cmd = build_server_command(
        "py",
        "m",
        host="127.0.0.1",
        port=8000,
        served_model_name="x",
        api_key="k",
        max_model_len=2048,
        extra_args=("--tensor-parallel-size", "2"),
    )
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--served-model-name") + 1] == "x" and cmd[-2:] == ["--tensor-parallel-size", "2"]


def test_plain_text_check_is_retried():
    backend = ScriptedBackend(["I think so", "Final: Correct"])
    client = LLMClient(backend, max_retries=2, backoff=0)
    check = lambda text: None if "Final:" in text else "no_verdict"
    result = client.chat([{"role": "user", "content": "judge"}], stage="judge", check=check)
    assert result.ok and result.text == "Final: Correct" and result.attempts == 2


def test_structured_output_rejection_falls_back_to_plain_text():
    from tider.llm.backends import StructuredOutputRejected

    backend = ScriptedBackend([StructuredOutputRejected("json_schema not supported"), 'ok: {"key": [4]}'])
    client = LLMClient(backend, max_retries=0, backoff=0)
    result = client.chat([{"role": "user", "content": "q"}], stage="select", json_schema=SCHEMA)
    assert result.parsed_json == {"key": [4]} and backend.calls == 2  # rejected once, then parsed from plain text


def test_openai_backend_rejects_unknown_structured_mode():
    with pytest.raises(ValueError, match="response_format"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", structured="guided_json")


def test_server_that_dies_reports_its_log(tmp_path):
    import sys

    from tider.llm.vllm_server import VLLMServer, VLLMServerError

    # A model folder that does not exist (offline): the server exits before it is ready,
    # and the error names the exit and carries the log's tail.
    missing = tmp_path / "no-such-model"
    server = VLLMServer(str(missing), python=sys.executable, log_path=tmp_path / "server.log", startup_timeout=120)
    with pytest.raises(VLLMServerError, match=r"exited with code \d+ before it was ready(?s:.*)Traceback"):
        server.start()
    assert server.process is None

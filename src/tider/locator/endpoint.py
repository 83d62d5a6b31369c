"""Window sources that ask a chat model for windows over HTTP (or a local checkpoint):

- the ``locator`` backend for an OpenAI-compatible endpoint (``tider serve``, ``vllm
  serve``, any hosted API) — ``make_endpoint_locator(url)``, which ``tider.locator.policy``
  uses for ``make_source("locator", url=...)``;
- ``prompted``: the same prompt sent to any instruction model, zero-shot — the baseline
  that tells how much of the locator's gain is training rather than prompting.

Both send the exact locator prompt (``tider.locator.prompt.build_messages``) and request
``OUTPUT_SCHEMA`` through structured outputs (vLLM ``response_format`` json_schema); a
server that rejects structured output gets plain text, which the parser reads anyway
(``tider.llm.client`` does the fallback). A completion that does not parse is a typed
failure (``ParseFailure``), counted in ``source.failures``; the query then takes the
semantic-only path (``NON_TEMPORAL``), as a non-temporal prediction would.

Served-model check: vLLM's ``/v1/models`` reports the served folder as ``root``; when
that folder is visible here, its ``tider_locator.json`` is checked (prompt version, schema,
granularity) before the first query — the same check ``tider serve`` runs.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from tider.locator.prompt import OUTPUT_SCHEMA, PromptSettings, locator_input
from tider.locator.sources import BaseSource, register_source
from tider.types import NON_TEMPORAL, Granularity, Memory, Query, WindowPrediction

logger = logging.getLogger(__name__)

# Qwen3's switch: the locator is trained to answer directly, without a think block.
NO_THINKING = {"enable_thinking": False}
LOCATOR_MAX_TOKENS = 160  # 8 windows of two dates fit in ~120 tokens of JSON


@dataclass
class LocatorOutcome:
    """One query's completion and what the parser made of it."""

    text: str
    prediction: Optional[WindowPrediction]
    failure: Optional[str] = None  # ParseFailure value, or the client's error
    detail: str = ""

    def prediction_json(self, granularity: Granularity) -> Optional[dict]:
        return self.prediction.to_json(granularity) if self.prediction is not None else None


def endpoint_client(
    url: str,
    *,
    model: Optional[str] = None,
    api_key: Optional[str] = None,
    structured: str = "response_format",
    chat_template_kwargs: Optional[dict] = NO_THINKING,
    cache_path: Optional[str] = None,
    timeout: float = 120.0,
    concurrency: int = 4,
):
    """An ``LLMClient`` for an OpenAI-compatible server; ``model`` defaults to the first served one."""
    from tider.llm.backends import OpenAIBackend
    from tider.llm.cache import LLMCache
    from tider.llm.client import LLMClient

    key = api_key or os.environ.get("TIDER_API_KEY") or "EMPTY"
    model = model or served_models(url, api_key=key)[0]["id"]
    backend = OpenAIBackend(url, model, api_key=key, timeout=timeout, structured=structured,
                            chat_template_kwargs=chat_template_kwargs)
    # One retry: transport hiccups. A deterministic locator that wrote bad JSON once will
    # write it again, so retrying malformed output would only spend time.
    return LLMClient(backend, cache=LLMCache(cache_path) if cache_path else None, max_retries=1,
                     concurrency=concurrency, default_max_tokens=LOCATOR_MAX_TOKENS)


def served_models(url: str, *, api_key: Optional[str] = None) -> list[dict]:
    """``/v1/models`` entries (``id``, and for vLLM ``root``: the served folder)."""
    from openai import OpenAI

    listed = OpenAI(base_url=url, api_key=api_key or "EMPTY", timeout=30, max_retries=2).models.list().data
    if not listed:
        raise ValueError(f"server {url} lists no models")
    return [m.model_dump() for m in listed]


def predict_batch(
    client,
    inputs: Sequence,
    granularity: Granularity,
    *,
    memory_spans: Optional[Sequence] = None,
    max_tokens: int = LOCATOR_MAX_TOKENS,
    progress: bool = False,
) -> list[LocatorOutcome]:
    """Send each ``LocatorInput`` to ``client`` and parse the answer against its table."""
    from tider.locator.parse import parse_prediction

    results = client.chat_batch([i.messages for i in inputs], stage="locator", json_schema=OUTPUT_SCHEMA,
                                max_tokens=max_tokens, temperature=0.0, progress=progress)
    spans = list(memory_spans) if memory_spans is not None else [None] * len(inputs)
    outcomes = []
    for result, table, span in zip(results, inputs, spans):
        if result.error and result.error.startswith("request_failed"):
            outcomes.append(LocatorOutcome(result.text, None, "request_failed", result.error))
            continue
        parsed = parse_prediction(result.text, granularity=granularity, refs=table, memory_span=span)
        outcomes.append(LocatorOutcome(result.text, parsed.prediction,
                                       parsed.failure.value if parsed.failure else None, parsed.detail))
    return outcomes


class ChatWindowSource(BaseSource):
    """A window source backed by a chat model speaking the locator prompt."""

    def __init__(self, client, *, name: str, tokenizer=None, settings: Optional[PromptSettings] = None,
                 granularity: Optional[Granularity] = None, max_tokens: int = LOCATOR_MAX_TOKENS, resolver=None):
        from tider.locator.rules import shared_resolver

        self.name = name
        self.client = client
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        self.granularity = granularity  # the model's; checked against each memory's
        self.max_tokens = max_tokens
        self.resolver = resolver or shared_resolver()
        self.failures: Counter = Counter()
        self.last_outcomes: list[LocatorOutcome] = []
        self.last_inputs: list = []

    def describe(self) -> dict:
        return {"name": self.name, **self.client.backend.describe(), "prompt_settings": self.settings.to_json()}

    def predict(self, query: Query, memory: Memory, timeline) -> WindowPrediction:
        return self.predict_batch([query], [memory], [timeline])[0]

    def inputs(self, queries: Sequence[Query], memories: Sequence[Memory], timelines: Sequence, granularity) -> list:
        """The prompts (and reference tables) for a batch: what ``predict_batch`` sends."""
        from tider.locator.rules import query_cues

        publics = [q.public() for q in queries]
        embedders = [t.embedder for t in timelines if t is not None and t.embedder is not None]
        vectors = embedders[0].encode([q.text for q in publics]) if embedders else [None] * len(publics)
        out = []
        for q, m, t, v in zip(publics, memories, timelines, vectors):
            visible = t.visible(q.asked_at) if t is not None else None
            out.append(locator_input(q, m, visible, query_cues(self.resolver, q, m), granularity, self.settings,
                                     query_vector=v, tokenizer=self.tokenizer))
        return out

    def predict_batch(self, queries: Sequence[Query], memories: Sequence[Memory], timelines: Sequence) -> list[WindowPrediction]:
        if not queries:
            return []
        granularities = {m.granularity for m in memories}
        if len(granularities) != 1:
            raise ValueError(f"{self.name}: one batch mixes granularities {sorted(granularities)}")
        granularity = granularities.pop()
        if self.granularity and self.granularity != granularity:
            raise ValueError(f"{self.name}: the model speaks {self.granularity!r} times, the data is {granularity!r}")
        inputs = self.inputs(queries, memories, timelines, granularity)
        outcomes = predict_batch(self.client, inputs, granularity, memory_spans=[m.span for m in memories],
                                 max_tokens=self.max_tokens, progress=len(inputs) > 8)
        self.last_inputs, self.last_outcomes = inputs, outcomes
        for o in outcomes:
            if o.failure:
                self.failures[o.failure] += 1
        return [o.prediction if o.prediction is not None else NON_TEMPORAL for o in outcomes]


def check_served_locator(url: str, *, model: Optional[str] = None, api_key: Optional[str] = None) -> tuple[str, Optional[dict], Optional[str]]:
    """(served model name, its tider_locator.json or None, its local folder or None).

    Raises ``ExportError`` when the served folder is visible here and is not a usable
    locator export (wrong prompt version, schema, missing tokenizer ...).
    """
    from tider.train.export import load_locator_metadata

    models = served_models(url, api_key=api_key)
    entry = next((m for m in models if m["id"] == model), None) if model else models[0]
    if entry is None:
        raise ValueError(f"server {url} does not serve {model!r}; it serves {', '.join(m['id'] for m in models)}")
    root = entry.get("root")
    if root and Path(root).is_dir():
        return entry["id"], load_locator_metadata(root), root
    logger.warning("served model %r: folder %r not visible here, tider_locator.json not checked", entry["id"], root)
    return entry["id"], None, None


def make_endpoint_locator(url: str, *, model: Optional[str] = None, api_key: Optional[str] = None,
                          structured: str = "response_format", cache_path: Optional[str] = None,
                          concurrency: int = 4) -> ChatWindowSource:
    """The trained locator behind an OpenAI-compatible endpoint, as a window source.

    The prompt settings are the export's ``tider_locator.json`` (the training prompt),
    else the prompt module's defaults.
    """
    name, meta, root = check_served_locator(url, model=model, api_key=api_key)
    tokenizer = None
    if root is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(root)  # same prompt truncation as in training
    meta = meta or {}
    client = endpoint_client(url, model=name, api_key=api_key, structured=structured, cache_path=cache_path,
                             concurrency=concurrency, chat_template_kwargs=meta.get("chat_template_kwargs", NO_THINKING))
    # The prompt settings the model was trained with win over the defaults.
    settings = PromptSettings.from_json(meta["prompt_settings"]) if "prompt_settings" in meta else None
    return ChatWindowSource(client, name="locator", tokenizer=tokenizer, settings=settings,
                            granularity=meta.get("granularity"))


@register_source("prompted")
def make_prompted_source(url: Optional[str] = None, model: Optional[str] = None, *, api_key: Optional[str] = None,
                         structured: str = "response_format", thinking: bool = False, cache_path: Optional[str] = None,
                         max_tokens: int = 512, concurrency: int = 4) -> ChatWindowSource:
    """Zero-shot baseline: the locator prompt sent to any instruction model.

    ``url``: an OpenAI-compatible base URL (then ``model`` names the served model), or a
    local checkpoint path / Hub id generated with transformers. ``thinking`` lets a Qwen3
    reason first (the parser skips the think block); it needs a larger ``max_tokens``.
    """
    if not url and not model:
        raise ValueError("prompted source: pass url= (OpenAI-compatible base URL) or model= (local checkpoint)")
    kwargs = None if thinking else NO_THINKING
    if url and url.startswith(("http://", "https://")):
        client = endpoint_client(url, model=model, api_key=api_key, structured=structured, chat_template_kwargs=kwargs,
                                 cache_path=cache_path, concurrency=concurrency)
    else:
        from tider.llm.client import make_client

        client = make_client(url or model, cache_path=cache_path, chat_template_kwargs=kwargs, max_retries=0)
    return ChatWindowSource(client, name="prompted", max_tokens=max_tokens)

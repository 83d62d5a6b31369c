"""Window sources backed by a chat model that speaks the locator prompt.

``ChatWindowSource`` sits on one seam, an ``LLMClient`` whose backend turns chat-message
lists into completion texts: ``tider.llm.backends.LocalHFBackend`` (left-padded batched
greedy ``generate``) for a local checkpoint, ``OpenAIBackend`` for an OpenAI-compatible
server (``tider serve``, ``vllm serve``, any hosted API). Prompt building, parsing and
failure accounting live here once, so a served model and a local one see byte-identical
prompts. Two sources are built on it:

- ``locator``: the trained locator (``tider.locator.trained``), with the prompt settings
  it was trained with;
- ``prompted`` (here): the same prompt sent zero-shot to any instruction model, the
  baseline that tells how much of the locator's gain is training rather than prompting.

Both request ``OUTPUT_SCHEMA`` through structured outputs (vLLM ``response_format``
json_schema); a server that rejects structured output gets plain text, which the parser
reads anyway (``tider.llm.client`` does the fallback). A completion that does not parse
is a typed failure (``ParseFailure``), counted in ``source.failures``; the query then
takes the semantic-only path (``NON_TEMPORAL``), as a non-temporal prediction would. Each
outcome keeps the prompt that was sent, so the leak validator checks what the model saw.

The answer is greedy, or, when the locator's contract records a ``Decoding`` with several
samples, a ``vote`` of that many completions at the rollout temperature: the policy GRPO
trains, whose spread over windows is the model's uncertainty. The samples of a query come
from one request (``n`` samples, one seed; ``LLMClient.sample_batch``), not one request each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from tider.locator.contract import MAX_WINDOWS, NO_THINKING, OUTPUT_SCHEMA, VOTE_SEED, Decoding
from tider.locator.prompt import PromptSettings, locator_input
from tider.locator.sources import BaseSource, register_source
from tider.types import NON_TEMPORAL, Granularity, Query, WindowPrediction

LOCATOR_MAX_TOKENS = 160  # 8 windows of two dates fit in ~120 tokens of JSON


@dataclass
class LocatorOutcome:
    """One query's prompt, completion, and what the parser made of it."""

    text: str
    prediction: WindowPrediction | None
    failure: str | None = None  # ParseFailure value, or the client's error
    detail: str = ""
    messages: list[dict] = field(default_factory=list)  # the prompt as sent

    def prediction_json(self, granularity: Granularity) -> dict | None:
        return self.prediction.to_json(granularity) if self.prediction is not None else None


def vote(answers: list[LocatorOutcome], min_votes: int) -> LocatorOutcome:
    """One outcome from several sampled ones: the windows at least ``min_votes`` answers name,
    most named first. Unparsed answers vote for nothing; all unparsed is the first failure."""
    parsed = [a.prediction for a in answers if a.prediction is not None]
    texts = "\n".join(a.text for a in answers)
    if not parsed:
        first = answers[0]
        return LocatorOutcome(texts, None, first.failure, first.detail, first.messages)
    votes = Counter(w for p in parsed if p.temporal for w in dict.fromkeys(p.windows))
    kept = tuple(w for w, n in votes.most_common() if n >= min_votes)[:MAX_WINDOWS]
    prediction = WindowPrediction(temporal=True, windows=kept) if kept else NON_TEMPORAL
    detail = f"{len(answers) - len(parsed)} of {len(answers)} samples unparsed" if len(parsed) < len(answers) else ""
    return LocatorOutcome(texts, prediction, None, detail, answers[0].messages)


def endpoint_client(
    url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    structured: str = "response_format",
    chat_template_kwargs: dict | None = NO_THINKING,
    cache_path: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 4,
):
    """An ``LLMClient`` for an OpenAI-compatible server; ``model`` defaults to the first served one."""
    from tider.llm.backends import OpenAIBackend, served_models
    from tider.llm.cache import LLMCache
    from tider.llm.client import LLMClient

    model = model or served_models(url, api_key=api_key)[0]["id"]
    backend = OpenAIBackend(
        url, model, api_key=api_key, timeout=timeout, structured=structured, chat_template_kwargs=chat_template_kwargs
    )
    # One retry: transport hiccups. A deterministic locator that wrote bad JSON once will
    # write it again, so retrying malformed output would only spend time.
    return LLMClient(
        backend,
        cache=LLMCache(cache_path) if cache_path else None,
        max_retries=1,
        concurrency=concurrency,
        default_max_tokens=LOCATOR_MAX_TOKENS,
    )


def predict_batch(
    client,
    inputs: Sequence,
    granularity: Granularity,
    *,
    memory_spans: Sequence | None = None,
    max_tokens: int = LOCATOR_MAX_TOKENS,
    progress: bool = False,
    temperature: float = 0.0,
    seed: int | None = None,
) -> list[LocatorOutcome]:
    """Send each ``LocatorInput`` to ``client`` and parse the answer against its table."""
    # A served model gets each prompt's own schema: references bounded by its table. A local
    # one is checked against the generic schema.
    results = client.chat_batch(
        [i.messages for i in inputs],
        stage="locator",
        json_schema=OUTPUT_SCHEMA,
        json_schemas=[i.schema() for i in inputs],
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        progress=progress,
    )
    spans = list(memory_spans) if memory_spans is not None else [None] * len(inputs)
    return [_outcome(result, table, span, granularity) for result, table, span in zip(results, inputs, spans)]


def sample_batch(
    client,
    inputs: Sequence,
    granularity: Granularity,
    *,
    samples: int,
    temperature: float,
    seed: int = VOTE_SEED,
    memory_spans: Sequence | None = None,
    max_tokens: int = LOCATOR_MAX_TOKENS,
    progress: bool = False,
) -> list[list[LocatorOutcome]]:
    """``samples`` sampled answers per ``LocatorInput``, each input's from ONE request
    (``n`` = ``samples``, one ``seed``), parsed against its table."""
    results = client.sample_batch(
        [i.messages for i in inputs],
        stage="locator",
        n=samples,
        json_schema=OUTPUT_SCHEMA,
        json_schemas=[i.schema() for i in inputs],
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        progress=progress,
    )
    spans = list(memory_spans) if memory_spans is not None else [None] * len(inputs)
    return [
        [_outcome(result, table, span, granularity) for result in answers]
        for answers, table, span in zip(results, inputs, spans)
    ]


def _outcome(result, table, span, granularity: Granularity) -> LocatorOutcome:
    from tider.locator.parse import parse_prediction

    messages = table.messages
    if result.error and result.error.startswith("request_failed"):
        return LocatorOutcome(result.text, None, "request_failed", result.error, messages)
    parsed = parse_prediction(result.text, granularity=granularity, refs=table, memory_span=span)
    return LocatorOutcome(
        result.text, parsed.prediction, parsed.failure.value if parsed.failure else None, parsed.detail, messages
    )


class ChatWindowSource(BaseSource):
    """A window source backed by a chat model speaking the locator prompt."""

    def __init__(
        self,
        client,
        *,
        name: str,
        tokenizer=None,
        settings: PromptSettings | None = None,
        granularity: Granularity | None = None,
        max_tokens: int = LOCATOR_MAX_TOKENS,
        resolver=None,
        decoding: Decoding | None = None,
    ):
        from tider.locator.rules import shared_resolver

        self.name = name
        self.client = client
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        self.granularity = granularity  # the model's; checked against each memory's
        self.max_tokens = max_tokens
        self.decoding = decoding or Decoding()
        self.resolver = resolver or shared_resolver()
        self.failures: Counter = Counter()
        self.last_outcomes: list[LocatorOutcome] = []
        self.last_inputs: list = []

    def describe(self) -> dict:
        return {
            "name": self.name,
            **self.client.backend.describe(),
            "prompt_settings": self.settings.to_json(),
            "decoding": asdict(self.decoding),
        }

    def predict(self, query: Query, store) -> WindowPrediction:
        return self.predict_batch([query], store)[0]

    def inputs(self, queries: Sequence[Query], store) -> list:
        """The prompts (and reference tables) for a batch: what ``predict_batch`` sends."""
        from tider.locator.rules import query_cues

        publics = [q.public() for q in queries]
        embedder = store.timeline(publics[0].memory_key).embedder if publics else None
        vectors = embedder.encode([q.text for q in publics]) if embedder is not None else [None] * len(publics)
        return [
            locator_input(
                q,
                store,
                query_cues(self.resolver, q, store.messages(q.memory_key)),
                self.settings,
                query_vector=v,
                tokenizer=self.tokenizer,
            )
            for q, v in zip(publics, vectors)
        ]

    def predict_batch(self, queries: Sequence[Query], store, progress: bool | None = None) -> list[WindowPrediction]:
        if not queries:
            return []
        memories = [store.messages(q.memory_key) for q in queries]
        granularities = {m.granularity for m in memories}
        if len(granularities) != 1:
            raise ValueError(f"{self.name}: one batch mixes granularities {sorted(granularities)}")
        granularity = granularities.pop()
        if self.granularity and self.granularity != granularity:
            raise ValueError(f"{self.name}: the model speaks {self.granularity!r} times, the data is {granularity!r}")
        inputs = self.inputs(queries, store)
        ask = {
            "memory_spans": [m.span for m in memories],
            "max_tokens": self.max_tokens,
            "progress": len(inputs) > 8 if progress is None else progress,
        }
        if self.decoding.samples == 1:
            outcomes = predict_batch(self.client, inputs, granularity, **ask)
        else:
            d = self.decoding
            answers = sample_batch(
                self.client, inputs, granularity, samples=d.samples, temperature=d.temperature, **ask
            )
            outcomes = [vote(a, d.min_votes) for a in answers]
        self.last_inputs, self.last_outcomes = inputs, outcomes
        for o in outcomes:
            if o.failure:
                self.failures[o.failure] += 1
        return [o.prediction if o.prediction is not None else NON_TEMPORAL for o in outcomes]


@register_source("prompted")
def make_prompted_source(
    url: str | None = None,
    model: str | None = None,
    *,
    api_key: str | None = None,
    structured: str = "response_format",
    thinking: bool = False,
    cache_path: str | None = None,
    max_tokens: int = 512,
    concurrency: int = 4,
) -> ChatWindowSource:
    """Zero-shot baseline: the locator prompt sent to any instruction model.

    ``url``: an OpenAI-compatible base URL (then ``model`` names the served model), or a
    local checkpoint path / Hub id generated with transformers. ``thinking`` lets a Qwen3
    reason first (the parser skips the think block); it needs a larger ``max_tokens``.
    """
    if not url and not model:
        raise ValueError("prompted source: pass url= (OpenAI-compatible base URL) or model= (local checkpoint)")
    kwargs = None if thinking else NO_THINKING
    if url and url.startswith(("http://", "https://")):
        client = endpoint_client(
            url,
            model=model,
            api_key=api_key,
            structured=structured,
            chat_template_kwargs=kwargs,
            cache_path=cache_path,
            concurrency=concurrency,
        )
    else:
        from tider.llm.client import make_client

        client = make_client(url or model, cache_path=cache_path, chat_template_kwargs=kwargs, max_retries=0)
    return ChatWindowSource(client, name="prompted", max_tokens=max_tokens)

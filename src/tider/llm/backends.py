"""Where completions come from: an OpenAI-compatible endpoint (vLLM, any hosted API) or
local transformers generation. Backends raise on transport failure; the client owns
retries, parsing, caching and accounting.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

Messages = Sequence[dict]

STRUCTURED_MODES = ("response_format", "structured_outputs", "none")


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class StructuredOutputRejected(RuntimeError):
    """The server refused a structured-output request (we then retry as plain text)."""


# The LLM provider's key: what OpenAI-compatible clients (the openai SDK, mem0) and vLLM
# ``--api-key`` users set. ``TIDER_API_KEY`` is the memory service's bearer key, never sent
# to a model server.
LLM_API_KEY_ENV = "OPENAI_API_KEY"


def api_key_from_env(api_key_env: str = LLM_API_KEY_ENV) -> str:
    """The LLM provider key in ``$api_key_env`` (default ``$OPENAI_API_KEY``), else ``EMPTY``
    (vLLM without a key). Only that variable is read: another one named (``--api-key-env``)
    does not fall back to ``OPENAI_API_KEY``, so a key meant for one provider never goes to another."""
    return os.environ.get(api_key_env) or "EMPTY"


def served_models(
    base_url: str, *, api_key: str | None = None, api_key_env: str = LLM_API_KEY_ENV, timeout: float = 30.0
) -> list[dict]:
    """``/v1/models`` entries: ``id``, and for vLLM ``root`` (the folder or Hub id it serves)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key or api_key_from_env(api_key_env), timeout=timeout, max_retries=2)
    listed = client.models.list().data
    if not listed:
        raise ValueError(f"server {base_url} lists no models; pass the model name")
    return [m.model_dump() for m in listed]


class ServedTokenizer:
    """The served model's own tokenizer through vLLM's ``POST /tokenize``, for counting a
    prompt's tokens on a client that has no copy of the model folder.

    It answers the two calls ``tider.locator.prompt.locator_input`` makes of a Hugging Face
    tokenizer, with the same defaults: ``tokenizer(text)["input_ids"]`` (special tokens
    added) and ``apply_chat_template(messages, tokenize=True, add_generation_prompt=True)``
    (the server renders its chat template). Counts of texts are memoised: timeline lines
    repeat across the queries of a memory.
    """

    chat_template = "served"  # truthy: the server applies the model's chat template

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 30.0):
        root = base_url.rstrip("/")
        self.url = (root.removesuffix("/v1")) + "/tokenize"
        self.model = model
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key or api_key_from_env()}"}
        self._texts: dict[str, list[int]] = {}

    def _tokens(self, body: dict) -> list[int]:
        import httpx

        response = httpx.post(self.url, json={"model": self.model, **body}, headers=self._headers, timeout=self.timeout)
        response.raise_for_status()
        return list(response.json()["tokens"])

    def available(self) -> bool:
        """Whether the server has the endpoint (vLLM does; most hosted APIs do not)."""
        import httpx

        try:
            self._tokens({"prompt": "probe"})
        except (httpx.HTTPError, KeyError, ValueError):
            return False
        return True

    def __call__(self, text: str) -> dict:
        if text not in self._texts:
            self._texts[text] = self._tokens({"prompt": text, "add_special_tokens": True})
        return {"input_ids": self._texts[text]}

    def apply_chat_template(
        self, messages: Messages, *, tokenize: bool = True, add_generation_prompt: bool = True, **_ignored
    ) -> list[int]:
        if not tokenize:
            raise ValueError("ServedTokenizer counts tokens; it does not render chat templates to text")
        return self._tokens({"messages": list(messages), "add_generation_prompt": add_generation_prompt})


class OpenAIBackend:
    """Chat completions against an OpenAI-compatible server.

    Structured output (``structured``): ``response_format`` (OpenAI json_schema, also
    understood by vLLM), ``structured_outputs`` (vLLM ``extra_body``; never the removed
    ``guided_json``) or ``none``. If the server rejects it once, the backend switches to
    plain generation for the rest of the run and the client parses the text.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = LLM_API_KEY_ENV,
        api_key: str | None = None,
        timeout: float = 120.0,
        structured: str = "response_format",
        chat_template_kwargs: dict | None = None,
    ):
        if structured not in STRUCTURED_MODES:
            raise ValueError(f"unknown structured-output mode {structured!r}; known: {', '.join(STRUCTURED_MODES)}")
        from openai import OpenAI

        key = api_key or api_key_from_env(api_key_env)
        self.base_url = base_url
        self.model = model
        self.structured = structured
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # Our client does the retrying, so the SDK's own retries are off.
        self._client = OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self.structured_supported = structured != "none"

    def describe(self) -> dict:
        # Structured decoding changes the text, so the mode is part of the cache key.
        return {
            "backend": "openai",
            "model": self.model,
            "chat_template_kwargs": self.chat_template_kwargs,
            "structured": self.structured if self.structured_supported else "none",
        }

    def generate(self, messages: Messages, **kwargs) -> Completion:
        return self.generate_samples(messages, n=1, **kwargs)[0]

    def generate_samples(
        self,
        messages: Messages,
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        json_schema: dict | None = None,
        schema_name: str = "output",
    ) -> list[Completion]:
        """``n`` completions from one request (``n`` choices, in index order). vLLM gives
        choice ``i`` of a seeded request the seed ``seed + i``. The request's token usage
        is on the first completion."""
        import openai

        kwargs: dict = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if n != 1:
            kwargs["n"] = n
        if seed is not None:
            kwargs["seed"] = seed
        extra_body: dict = {}
        if self.chat_template_kwargs:
            extra_body["chat_template_kwargs"] = self.chat_template_kwargs
        use_schema = json_schema is not None and self.structured_supported
        if use_schema and self.structured == "response_format":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": json_schema},
            }
        elif use_schema and self.structured == "structured_outputs":
            extra_body["structured_outputs"] = {"json": json_schema}
        if extra_body:
            kwargs["extra_body"] = extra_body
        try:
            response = self._client.chat.completions.create(**kwargs)
        except openai.BadRequestError as exc:
            if not use_schema:
                raise
            # e.g. a hosted API without json_schema support: fall back to plain text.
            self.structured_supported = False
            raise StructuredOutputRejected(str(exc)[:300]) from exc
        choices = sorted(response.choices or [], key=lambda c: c.index)
        texts = [c.message.content or "" for c in choices] or [""]
        usage = response.usage
        out = [Completion(text) for text in texts]
        out[0].prompt_tokens = getattr(usage, "prompt_tokens", 0) or 0
        out[0].completion_tokens = getattr(usage, "completion_tokens", 0) or 0
        return out


class LocalHFBackend:
    """transformers generation on a local checkpoint; greedy unless temperature > 0.

    Structured output is not enforced here: the client parses and validates the text.
    Generation is serialised by a lock (one model, one device), and batched through
    :meth:`generate_batch` with left padding.
    """

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 8,
        chat_template_kwargs: dict | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = str(model_path)
        self.batch_size = batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        self.hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device).eval()
        self.device = device
        self._lock = threading.Lock()

    def describe(self) -> dict:
        return {"backend": "local_hf", "model": self.model, "chat_template_kwargs": self.chat_template_kwargs}

    def generate(self, messages: Messages, **kwargs) -> Completion:
        return self.generate_batch([messages], **kwargs)[0]

    def generate_samples(self, messages: Messages, *, n: int, **kwargs) -> list[Completion]:
        return self.generate_batch([messages], n=n, **kwargs)

    def generate_batch(
        self,
        batch: Sequence[Messages],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        json_schema: dict | None = None,
        schema_name: str = "output",
        n: int = 1,
    ) -> list[Completion]:
        """Completions in input order; with ``n`` > 1, ``n`` sampled ones per prompt
        (``num_return_sequences``), prompt by prompt, the prompt's tokens counted on its first."""
        import torch

        if n > 1 and temperature <= 0:
            raise TypeError(f"{n} samples need a temperature > 0")  # a caller's bug, not a fallback
        prompts = [
            self.tokenizer.apply_chat_template(
                list(m), tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
            )
            for m in batch
        ]
        out: list[Completion] = []
        with self._lock, torch.inference_mode():
            step = max(1, self.batch_size // n)  # batch_size sequences a generate() call
            for i in range(0, len(prompts), step):
                chunk = prompts[i : i + step]
                enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
                if seed is not None:
                    torch.manual_seed(seed)
                # Plain temperature sampling, as vLLM and TRL's GRPO sample (transformers would
                # otherwise apply its default top_k=50).
                sampling = (
                    {"do_sample": True, "temperature": temperature, "top_k": 0}
                    if temperature > 0
                    else {"do_sample": False}
                )
                if n > 1:
                    sampling["num_return_sequences"] = n
                generated = self.hf_model.generate(
                    **enc, max_new_tokens=max_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
                )
                new_tokens = generated[:, enc["input_ids"].shape[1] :]
                # generate() repeats each prompt n times in place: rows i*n .. i*n+n-1 are prompt i's.
                masks = enc["attention_mask"].repeat_interleave(n, dim=0)
                for r, (row, mask) in enumerate(zip(new_tokens, masks)):
                    ids = row.tolist()
                    n_new = len(ids)
                    if self.tokenizer.eos_token_id in ids:
                        n_new = ids.index(self.tokenizer.eos_token_id) + 1
                    out.append(
                        Completion(
                            text=self.tokenizer.decode(ids[:n_new], skip_special_tokens=True),
                            prompt_tokens=int(mask.sum()) if r % n == 0 else 0,
                            completion_tokens=n_new,
                        )
                    )
        return out

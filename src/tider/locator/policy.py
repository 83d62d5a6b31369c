"""The ``locator`` window source: the trained locator as a window source.

``make_source("locator", model=PATH)`` runs a checkpoint (a training output folder or an
export) with local transformers generation; ``make_source("locator", url=URL, ...)``
talks to an OpenAI-compatible server and is built by ``tider.locator.endpoint`` (imported
only then). Both are the same ``ChatWindowSource`` around one seam, an ``LLMClient``
whose backend turns a batch of chat-message lists into completion texts: the local one
is ``tider.llm.backends.LocalHFBackend`` (left-padded batched greedy ``generate``), the
remote one ``OpenAIBackend``. Prompt building, parsing and failure accounting are shared,
so a served locator and a local one see byte-identical prompts.

Prompt settings come from the checkpoint's ``tider_locator.json`` (written by ``tider
sft``/``tider grpo``): K, the token budget, the granularity, and the chat-template
kwargs the policy was trained with; explicit arguments override them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tider.locator.sources import register_source

LOCATOR_META = "tider_locator.json"


def _checkpoint_meta(model_dir: str) -> dict:
    import json

    for folder in (Path(model_dir), Path(model_dir).parent):
        path = folder / LOCATOR_META
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    return {}


def make_local_locator(
    model: str,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    batch_size: int = 16,
    max_tokens: Optional[int] = None,
    cache_path: Optional[str] = None,
):
    """A locator source generating with transformers on a local checkpoint."""
    from tider.llm.backends import LocalHFBackend
    from tider.llm.cache import LLMCache
    from tider.llm.client import LLMClient
    from tider.locator.endpoint import LOCATOR_MAX_TOKENS, NO_THINKING, ChatWindowSource

    if not (Path(model) / "config.json").exists():
        raise ValueError(f"locator checkpoint {model!r}: no config.json there (pass a training output or export folder)")
    meta = _checkpoint_meta(model)
    template_kwargs = meta.get("chat_template_kwargs", NO_THINKING)
    backend = LocalHFBackend(model, device=device, dtype=dtype, batch_size=batch_size, chat_template_kwargs=template_kwargs)
    max_tokens = max_tokens or LOCATOR_MAX_TOKENS
    # No retries: greedy decoding would write the same malformed JSON again.
    client = LLMClient(backend, cache=LLMCache(cache_path) if cache_path else None, max_retries=0,
                       default_max_tokens=max_tokens)
    from tider.locator.prompt import PromptSettings

    settings = PromptSettings.from_json(meta["prompt_settings"]) if "prompt_settings" in meta else None
    return ChatWindowSource(client, name="locator", tokenizer=backend.tokenizer, settings=settings,
                            granularity=meta.get("granularity"), max_tokens=max_tokens)


@register_source("locator")
def make_locator(model: Optional[str] = None, url: Optional[str] = None, **kwargs):
    """``model=PATH``: local generation; ``url=URL`` (``model`` then names the served model):
    an OpenAI-compatible endpoint via ``tider.locator.endpoint.make_endpoint_locator``."""
    if url:
        from tider.locator.endpoint import make_endpoint_locator

        return make_endpoint_locator(url, model=model, **kwargs)
    if not model:
        raise ValueError("locator source: pass model=PATH (local checkpoint) or url=URL (OpenAI-compatible server)")
    return make_local_locator(model, **kwargs)

"""The ``locator`` window source: the trained locator, local or served, prompted exactly as
it was trained.

``make_source("locator", model=PATH)`` generates with transformers on a checkpoint (a
training output or an export); ``make_source("locator", url=URL[, model=NAME])`` asks the
model an OpenAI-compatible server serves (``tider serve``, ``vllm serve``). Both are a
``tider.locator.chat_source.ChatWindowSource``.

The prompt settings (``tider.locator.prompt.PromptSettings``, granularity, chat-template
kwargs) come from the checkpoint's ``tider_locator.json`` (``tider.locator.contract``).
For a served model they come, in this order, from

1. ``metadata=PATH`` (``--locator-meta``): the export folder, or its ``tider_locator.json``
   copied to the client machine;
2. the folder vLLM reports as the served model's ``root`` in ``/v1/models``, when it is
   visible here (same machine, shared file system) — then it is checked like ``tider serve``
   checks it;

and otherwise the source refuses to run (``LocatorContractError``) unless
``allow_unknown_settings=True`` (``--locator-allow-unknown-settings``), which falls back to
the prompt module's defaults with a warning. The token budget is counted with the
model's own tokenizer: the local folder's, or else the server's through vLLM's
``/tokenize`` endpoint (``tider.llm.backends.ServedTokenizer``), so a remote locator's
prompt is truncated exactly as in training. An explicit ``settings`` overrides the recorded
ones (an experiment, no longer the training prompt).

Given ``store=`` (the evaluation runners pass their ``MemoryCollection``), the store's
timeline settings and embedding model are checked against the ones recorded at training:
a timeline built another way would show the locator lines it never saw.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tider.locator.chat_source import LOCATOR_MAX_TOKENS, ChatWindowSource, endpoint_client
from tider.locator.contract import (
    NO_THINKING,
    TOKENIZER_FILES,
    Decoding,
    LocatorContractError,
    LocatorMetadata,
    check_export_folder,
)
from tider.locator.prompt import PromptSettings
from tider.locator.sources import register_source

logger = logging.getLogger(__name__)

ALLOW_HINT = "allow_unknown_settings=True (--locator-allow-unknown-settings) runs with the defaults anyway"


def _read_given(metadata: str) -> tuple[LocatorMetadata, str | None]:
    """``metadata``: an export folder (its tokenizer is used too) or a ``tider_locator.json``."""
    path = Path(metadata)
    meta = LocatorMetadata.read(path).validate(str(path))
    has_tokenizer = path.is_dir() and any((path / name).exists() for name in TOKENIZER_FILES)
    return meta, (str(path) if has_tokenizer else None)


def _require_known(meta: LocatorMetadata, where: str, allow_unknown_settings: bool) -> None:
    unknown = meta.unknown_prompt_settings()
    if unknown and not allow_unknown_settings:
        raise LocatorContractError(
            f"{where}: records no {', '.join(unknown)}, so the training prompt cannot be rebuilt; {ALLOW_HINT}"
        )
    if unknown:
        logger.warning("%s: %s unknown; using the prompt defaults", where, ", ".join(unknown))


def _template_kwargs(meta: LocatorMetadata) -> dict:
    return NO_THINKING if meta.chat_template_kwargs is None else meta.chat_template_kwargs


def _source(client, meta: LocatorMetadata, tokenizer, settings, max_tokens, decoding=None) -> ChatWindowSource:
    if settings is None and meta.prompt_settings is not None:
        settings = PromptSettings.from_json(meta.prompt_settings)
    source = ChatWindowSource(
        client,
        name="locator",
        tokenizer=tokenizer,
        settings=settings,
        granularity=meta.granularity,
        max_tokens=max_tokens or LOCATOR_MAX_TOKENS,
        # The recorded decoding, unless the caller overrides it (an experiment, as ``settings``).
        decoding=Decoding(**decoding) if isinstance(decoding, dict) else decoding or meta.answer_decoding(),
    )
    source.metadata = meta
    return source


def make_local_locator(
    model: str,
    *,
    metadata: str | None = None,
    allow_unknown_settings: bool = False,
    settings: PromptSettings | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    batch_size: int = 16,
    max_tokens: int | None = None,
    cache_path: str | None = None,
    decoding=None,
) -> ChatWindowSource:
    """A locator source generating with transformers on a local checkpoint."""
    from tider.llm.backends import LocalHFBackend
    from tider.llm.cache import LLMCache
    from tider.llm.client import LLMClient

    if not (Path(model) / "config.json").exists():
        raise ValueError(
            f"locator checkpoint {model!r}: no config.json there (pass a training output or export folder)"
        )
    meta = _read_given(metadata)[0] if metadata else LocatorMetadata.find(model)
    if meta is None:
        if not allow_unknown_settings:
            raise LocatorContractError(
                f"{model}: no tider_locator.json here or in the parent folder, so the prompt "
                f"settings the model was trained with are unknown; {ALLOW_HINT}"
            )
        meta = LocatorMetadata()
    meta.validate(model)
    _require_known(meta, model, allow_unknown_settings)
    backend = LocalHFBackend(
        model, device=device, dtype=dtype, batch_size=batch_size, chat_template_kwargs=_template_kwargs(meta)
    )
    # No retries: greedy decoding would write the same malformed JSON again.
    client = LLMClient(
        backend,
        cache=LLMCache(cache_path) if cache_path else None,
        max_retries=0,
        default_max_tokens=max_tokens or LOCATOR_MAX_TOKENS,
    )
    return _source(client, meta, backend.tokenizer, settings, max_tokens, decoding)


def served_locator_settings(
    url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    metadata: str | None = None,
    allow_unknown_settings: bool = False,
):
    """(served model name, its ``LocatorMetadata``, a tokenizer for the token budget or None);
    see the module docstring for where the settings come from."""
    from tider.llm.backends import ServedTokenizer, served_models

    models = served_models(url, api_key=api_key)
    entry = next((m for m in models if m["id"] == model), None) if model else models[0]
    if entry is None:
        raise ValueError(f"server {url} does not serve {model!r}; it serves {', '.join(m['id'] for m in models)}")
    name, root = entry["id"], entry.get("root")
    tokenizer_dir = None
    if metadata:
        meta, tokenizer_dir = _read_given(metadata)
    elif root and Path(root).is_dir():
        meta, tokenizer_dir = check_export_folder(root), root
    elif allow_unknown_settings:
        logger.warning("served model %r: folder %r not visible here and no metadata given; prompt defaults", name, root)
        meta = LocatorMetadata()
    else:
        raise LocatorContractError(
            f"served model {name!r} at {url}: its folder {root!r} is not visible here, so the prompt settings it was "
            f"trained with are unknown. Pass metadata=PATH (--locator-meta): the export folder or its "
            f"tider_locator.json copied from the serving machine; {ALLOW_HINT}"
        )
    _require_known(meta, f"served model {name!r}", allow_unknown_settings)
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        return name, meta, AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer = ServedTokenizer(url, name, api_key=api_key)
    if not tokenizer.available():
        if not allow_unknown_settings:
            raise LocatorContractError(
                f"server {url}: no /tokenize endpoint (not vLLM?) and no local tokenizer, so the "
                f"prompt cannot be cut to max_prompt_tokens as in training; pass the export "
                f"folder as metadata (--locator-meta); {ALLOW_HINT}"
            )
        tokenizer = None
    return name, meta, tokenizer


def make_served_locator(
    url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    metadata: str | None = None,
    allow_unknown_settings: bool = False,
    structured: str = "response_format",
    cache_path: str | None = None,
    settings: PromptSettings | None = None,
    max_tokens: int | None = None,
    concurrency: int = 16,
    decoding=None,
) -> ChatWindowSource:
    """The trained locator behind an OpenAI-compatible endpoint, as a window source."""
    name, meta, tokenizer = served_locator_settings(
        url, model=model, api_key=api_key, metadata=metadata, allow_unknown_settings=allow_unknown_settings
    )
    client = endpoint_client(
        url,
        model=name,
        api_key=api_key,
        structured=structured,
        cache_path=cache_path,
        concurrency=concurrency,
        chat_template_kwargs=_template_kwargs(meta),
    )
    return _source(client, meta, tokenizer, settings, max_tokens, decoding)


@register_source("locator")
def make_locator(
    model: str | None = None, url: str | None = None, store=None, allow_unknown_settings: bool = False, **kwargs
) -> ChatWindowSource:
    """``model=PATH``: local generation; ``url=URL`` (``model`` then names the served model):
    an OpenAI-compatible endpoint. ``store``: check the timeline it builds against training's."""
    if url:
        source = make_served_locator(url, model=model, allow_unknown_settings=allow_unknown_settings, **kwargs)
    elif model:
        source = make_local_locator(model, allow_unknown_settings=allow_unknown_settings, **kwargs)
    else:
        raise ValueError("locator source: pass model=PATH (local checkpoint) or url=URL (OpenAI-compatible server)")
    mismatches = source.metadata.input_mismatches(store.config) if store is not None else []
    if mismatches and not allow_unknown_settings:
        raise LocatorContractError(
            "the locator was trained on timelines built differently from this store's: "
            f"{'; '.join(mismatches)}. Evaluate with the training's retrieval settings "
            f"(--config), or {ALLOW_HINT}"
        )
    if mismatches:
        logger.warning("locator timeline differs from training: %s", "; ".join(mismatches))
    return source

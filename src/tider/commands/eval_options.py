"""Command-line options shared by ``tider eval retrieval``, ``tider eval qa`` and ``tider
eval compare``: comma-separated lists (``split_csv``) and the options that configure the
model-backed window sources:

    --locator-url URL      the trained locator behind an OpenAI-compatible server (tider serve)
    --locator-model PATH   ... or a local checkpoint / export (transformers generation);
                           with --locator-url it names the served model
    --locator-meta PATH    the export folder or its tider_locator.json, when the served
                           folder is not visible here (the settings the locator trained with)
    --locator-allow-unknown-settings
                           run even when those settings are unknown (prompt defaults)
    --prompted-url URL     the zero-shot `prompted` baseline: any instruction model's server
    --prompted-model NAME  its served model name, or a local checkpoint without --prompted-url

``--store URL_OR_DIR`` (retrieval and compare) searches the memories in a PostgreSQL
database or a directory of stores, importing them there first (idempotent).

They become ``source_options`` (``{"locator": {"url": ...}}``), which the runners hand to
``tider.locator.sources.make_source_from_context``.
"""

from __future__ import annotations


def split_csv(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [t.strip() for t in text.split(",") if t.strip()]


def add_window_source_options(parser) -> None:
    group = parser.add_argument_group("model-backed window sources (locator, prompted)")
    group.add_argument(
        "--locator-url", default=None, help="OpenAI-compatible base URL serving the locator (tider serve)"
    )
    group.add_argument(
        "--locator-model",
        default=None,
        help="local locator checkpoint/export, or the served model name with --locator-url",
    )
    group.add_argument(
        "--locator-meta",
        default=None,
        help="the locator's export folder or tider_locator.json (needed with --locator-url when the "
        "server's model folder is not visible on this machine)",
    )
    group.add_argument(
        "--locator-allow-unknown-settings",
        action="store_true",
        help="run the locator even when its training prompt settings are unknown (prompt defaults)",
    )
    group.add_argument("--prompted-url", default=None, help="OpenAI-compatible base URL of an instruction model")
    group.add_argument(
        "--prompted-model",
        default=None,
        help="served model name with --prompted-url, else a local instruction checkpoint",
    )


def add_store_option(parser) -> None:
    parser.add_argument(
        "--store",
        default=None,
        help="search the memories in this PostgreSQL URL or directory of stores, importing the dataset's "
        "memories there first (idempotent); default: in this process",
    )


def window_source_options(args) -> dict:
    """``{"locator": {...}, "prompted": {...}}`` from the parsed options (empty entries dropped)."""
    options = {}
    for name in ("locator", "prompted"):
        url, model = getattr(args, f"{name}_url", None), getattr(args, f"{name}_model", None)
        entry = {k: v for k, v in (("url", url), ("model", model)) if v}
        if entry and name == "locator":
            if getattr(args, "locator_meta", None):
                entry["metadata"] = args.locator_meta
            if getattr(args, "locator_allow_unknown_settings", False):
                entry["allow_unknown_settings"] = True
        if entry:
            options[name] = entry
    return options


def require_options_for(methods, options: dict) -> None:
    """Fail early, naming the flag, when a model-backed source is asked for without a model."""
    for name in ("locator", "prompted"):
        if any(m.split("@")[0] == name for m in methods) and name not in options:
            raise SystemExit(f"window source {name!r} needs --{name}-url or --{name}-model")

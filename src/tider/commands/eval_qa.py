"""`tider eval qa`: answer accuracy (LLM judge) and token F1 through the forest back end,
for each window source x context kind; stage-wise JSONL, resumable; token accounting."""

from __future__ import annotations

import argparse

from tider.commands.eval_options import add_window_source_options, require_options_for, split_csv, window_source_options
from tider.eval.qa_config import COMPRESSION_MODES, MAX_TOKEN_STAGES, STAGES, QAConfig

DEFAULTS = QAConfig()  # every QA default is QAConfig's


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "qa", help="QA accuracy/F1 through selection, forest structuring, compression, reader, judge"
    )
    p.add_argument("--dataset", required=True, help="dataset loader name (locomo, longmemeval, jsonl, synthetic)")
    p.add_argument("--path", default=None, help="dataset file or directory")
    p.add_argument("--windows", default=",".join(DEFAULTS.windows), help="comma-separated window sources")
    p.add_argument("--context", default=",".join(DEFAULTS.contexts), help="comma-separated context kinds: flat, forest")
    _add_model_options(p)
    p.add_argument("--out", required=True, help="run directory (stage JSONL, manifest, report.json/md, LLM cache)")
    _add_pipeline_options(p)
    _add_request_options(p)
    p.add_argument("--config", default=None, help="YAML/JSON file with RetrievalConfig fields")
    p.add_argument("--memories", default=None, help="comma-separated memory keys (default: all)")
    p.add_argument("--exclude-categories", default="", help="query categories to skip")
    p.add_argument("--limit", type=int, default=None, help="first N queries (smoke runs)")
    p.add_argument(
        "--until",
        default=DEFAULTS.until,
        choices=STAGES,
        help="last stage to run (compress: context statistics, no reader needed)",
    )
    p.add_argument("--overwrite", action="store_true", help="discard earlier records in --out and start over")
    add_window_source_options(p)  # --locator-url/-model/-meta, --prompted-url/-model
    p.set_defaults(func=run)


def _add_model_options(p) -> None:
    """The reader, judge and selector: a served model's URL or a local checkpoint each."""
    p.add_argument(
        "--reader",
        default=None,
        help="OpenAI-compatible base URL (http://host:port/v1) or local checkpoint (needed from --until answer)",
    )
    p.add_argument("--reader-model", default=None, help="model name at the reader URL (default: first listed)")
    p.add_argument("--judge", default=None, help="judge URL or checkpoint (default: the reader)")
    p.add_argument("--judge-model", default=None)
    p.add_argument(
        "--selector",
        default=None,
        help="URL or checkpoint for evidence selection and relation classification (default: the reader)",
    )
    p.add_argument("--selector-model", default=None)


def _add_pipeline_options(p) -> None:
    """Retrieval, selection, structuring and compression (defaults: ``QAConfig``'s)."""
    p.add_argument("--k", type=int, default=DEFAULTS.k, help="seed messages from the dual-channel retriever")
    p.add_argument("--top-n", type=int, default=DEFAULTS.top_n, help="candidates per window sent to evidence selection")
    p.add_argument("--budget", type=int, default=DEFAULTS.budget, help="context budget B in tokens")
    p.add_argument(
        "--compression",
        default=DEFAULTS.compression,
        choices=COMPRESSION_MODES,
        help="idf = T-Mem span compression; truncate = the w/o-compression ablation",
    )
    p.add_argument(
        "--classifier",
        default=DEFAULTS.classifier,
        choices=["llm", "lexical"],
        help="relation classifier for structuring (lexical = named heuristic variant, no LLM)",
    )
    p.add_argument("--no-selection", action="store_true", help="skip evidence utility selection (R'(q) = seeds)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer counting the budget (default: the reader's, local checkpoint or served name; "
        "else whitespace words)",
    )


def _add_request_options(p) -> None:
    """How the LLM requests are made: credentials, JSON mode, retries, limits, sampling."""
    p.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="env var holding the LLM provider's key (default OPENAI_API_KEY; TIDER_API_KEY is the memory service's)",
    )
    p.add_argument(
        "--structured",
        default="response_format",
        choices=["response_format", "structured_outputs", "none"],
        help="how JSON schemas are requested from the server",
    )
    p.add_argument("--no-thinking", action="store_true", help="send chat_template_kwargs enable_thinking=false (Qwen3)")
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4, help="parallel requests to a served model")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    limits = ",".join(f"{stage}={getattr(DEFAULTS, f'{stage}_max_tokens')}" for stage in MAX_TOKEN_STAGES)
    p.add_argument("--max-tokens", default=None, help=f"per-stage output limits, e.g. {limits} (the defaults)")
    p.add_argument(
        "--answer-temperature",
        type=float,
        default=DEFAULTS.answer_temperature,
        help="reader sampling temperature (0 = greedy)",
    )
    p.add_argument(
        "--judge-temperature",
        type=float,
        default=DEFAULTS.judge_temperature,
        help="judge sampling temperature (0 = greedy)",
    )
    p.add_argument("--seed", type=int, default=DEFAULTS.seed, help="sampling seed sent with every request")


def _client(spec, model, args, cache_path):
    from tider.llm.client import make_client

    kwargs = {"enable_thinking": False} if args.no_thinking else None
    return make_client(
        spec,
        model=model,
        cache_path=cache_path,
        api_key_env=args.api_key_env,
        structured=args.structured,
        chat_template_kwargs=kwargs,
        max_retries=args.max_retries,
        concurrency=args.concurrency,
        timeout=args.timeout,
    )


def _budget_tokenizer(explicit, reader_spec, reader):
    """(name, counter) for budget B: ``--tokenizer``, else the reader's own tokenizer (a
    local checkpoint, or the served model's name when it loads as a tokenizer), else
    whitespace words. The choice is recorded in the run manifest."""
    from tider.forest.compress import hf_token_counter

    if explicit:
        return explicit, hf_token_counter(explicit)
    candidates = [reader_spec] if reader_spec and not reader_spec.startswith(("http://", "https://")) else []
    if reader is not None and not candidates:
        candidates = [reader.model]
    for name in candidates:
        try:
            return name, hf_token_counter(name)
        except (OSError, ValueError, ImportError):
            continue  # a served name that is no tokenizer here (e.g. a hosted API model)
    return "whitespace", None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from tider.data import load_dataset
    from tider.eval.qa import run_qa_eval
    from tider.eval.qa_report import qa_markdown

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = str(out / "llm_cache.sqlite")
    dataset = load_dataset(args.dataset, args.path)
    config = _qa_config(args)
    require_options_for(config.windows, config.source_options)
    reader = _client(args.reader, args.reader_model, args, cache) if args.reader else None
    same = lambda spec, model: (
        (spec or args.reader) == args.reader and (model or args.reader_model) == args.reader_model
    )
    other = lambda spec, model: _client(spec, model, args, cache) if spec else None
    judge = reader if same(args.judge, args.judge_model) else other(args.judge, args.judge_model)
    selector = reader if same(args.selector, args.selector_model) else other(args.selector, args.selector_model)
    tokenizer, count = _budget_tokenizer(args.tokenizer, args.reader, reader)
    report = run_qa_eval(
        dataset,
        config,
        out,
        reader,
        judge,
        selector,
        data_path=args.path,
        overwrite=args.overwrite,
        count_tokens=count,
        tokenizer_name=tokenizer,
    )
    console = Console()
    console.print(qa_markdown(report))
    usage = {
        name: client.usage_by_stage()
        for name, client in (("reader", reader), ("judge", judge), ("selector", selector))
        if client is not None
    }
    if judge is reader or selector is reader:  # one shared client: its stages are already split
        usage = {"shared client": reader.usage_by_stage()} if reader is not None else usage
    console.print(f"LLM tokens spent in this process (cached calls cost 0): {usage}")
    console.print(
        f"leak checks: {report['leak_checks']} prompts, leaks: {report['leaks']}; report: {out / 'report.md'}"
    )
    return 0


def _qa_config(args: argparse.Namespace) -> QAConfig:
    from tider.commands.eval_retrieval import load_retrieval_config

    limits = {k: int(v) for k, v in (item.split("=") for item in split_csv(args.max_tokens or ""))}
    unknown = set(limits) - set(MAX_TOKEN_STAGES)
    if unknown:
        raise SystemExit(f"--max-tokens: unknown stage(s) {sorted(unknown)}; known: {', '.join(MAX_TOKEN_STAGES)}")
    return QAConfig(
        windows=split_csv(args.windows),
        contexts=split_csv(args.context),
        k=args.k,
        top_n=args.top_n,
        budget=args.budget,
        compression=args.compression,
        classifier=args.classifier,
        selection=not args.no_selection,
        limit=args.limit,
        memory_keys=split_csv(args.memories) if args.memories else None,
        exclude_categories=split_csv(args.exclude_categories),
        retrieval=load_retrieval_config(args.config, None),
        source_options=window_source_options(args),
        answer_temperature=args.answer_temperature,
        judge_temperature=args.judge_temperature,
        seed=args.seed,
        until=args.until,
        **{f"{k}_max_tokens": v for k, v in limits.items()},
    )

"""`tider memory serve|import`: the HTTP memory service and building stores from benchmarks.

tider memory serve --store URL_OR_DIR [--host 127.0.0.1] [--port 8100] [--locator-url URL | --locator-model PATH]
tider memory import --dataset {jsonl,locomo,longmemeval,realmem,synthetic} [--path P] --out URL_OR_DIR
tider memory reindex --store URL_OR_DIR [--memory NAME ...] [--config YAML]

A store is a directory of embedded stores (one per memory) or a PostgreSQL URL
(``postgresql://user:password@host/db``: every process that opens it shares its
memories); ``$TIDER_STORE`` gives the default.
"""

from __future__ import annotations

import argparse

from tider.data import LOADERS


def register(subparsers) -> None:
    parser = subparsers.add_parser("memory", help="memory stores: the HTTP service, importing benchmarks")
    sub = parser.add_subparsers(dest="memory_command", metavar="<memory command>", required=True)
    serve = sub.add_parser("serve", help="serve the memories of a store over HTTP (FastAPI + uvicorn)")
    serve.add_argument(
        "--store",
        "--path",
        dest="store",
        default=None,
        help="PostgreSQL URL (shared by every process on it) or directory of stores, one per memory name "
        "(created if missing); default $TIDER_STORE. --path is the old name",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default loopback; set TIDER_API_KEY or TIDER_API_KEYS to expose)",
    )
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument(
        "--locator-url", default=None, help="OpenAI-compatible URL serving the locator (windows=locator)"
    )
    serve.add_argument(
        "--locator-model", default=None, help="local locator export, or the served model name with --locator-url"
    )
    serve.set_defaults(func=run_serve)
    imp = sub.add_parser("import", help="build one store per conversation of a benchmark")
    imp.add_argument("--dataset", required=True, choices=sorted(LOADERS))
    imp.add_argument("--path", default=None, help="dataset file or directory (synthetic: optional)")
    imp.add_argument("--out", required=True, help="PostgreSQL URL or directory to create the memories in")
    imp.add_argument("--limit", type=int, default=None, help="first N conversations only")
    imp.set_defaults(func=run_import)
    re = sub.add_parser(
        "reindex",
        help="rebuild memories with this tider's embedder, chunking and lexical analysis (keeps every message)",
    )
    re.add_argument("--store", required=True, help="PostgreSQL URL or directory of stores")
    re.add_argument("--memory", action="append", default=None, help="memory name (repeatable; default: all)")
    re.add_argument("--config", default=None, help="YAML/JSON RetrievalConfig whose build settings to use")
    re.set_defaults(func=run_reindex)


def run_serve(args: argparse.Namespace) -> int:
    from tider.memory.backends import ENV, default_store
    from tider.memory.pg.pool import describe_url
    from tider.memory.service import serve

    store = args.store or default_store()
    if not store:
        raise SystemExit(f"tider memory serve: give --store URL_OR_DIR (or set ${ENV})")
    locator = {k: v for k, v in (("url", args.locator_url), ("model", args.locator_model)) if v} or None
    shown = describe_url(store) if "://" in store else store  # never print a password
    print(f"tider memory: serving {shown} on http://{args.host}:{args.port} (OpenAPI at /docs)", flush=True)
    serve(store, host=args.host, port=args.port, locator=locator)
    return 0


def run_import(args: argparse.Namespace) -> int:
    from tider.data import load_dataset
    from tider.memory.importer import import_dataset

    dataset = load_dataset(args.dataset, args.path)
    counts = import_dataset(dataset, args.out, limit=args.limit)
    from tider.memory.pg.pool import describe_url

    shown = describe_url(args.out) if "://" in args.out else args.out
    print(f"imported {len(counts)} memories ({sum(counts.values())} messages) into {shown}")
    return 0


def run_reindex(args: argparse.Namespace) -> int:
    from tider.commands.eval_retrieval import load_retrieval_config
    from tider.memory.backends import open_backend
    from tider.memory.reindex import SUFFIX, reindex

    config = load_retrieval_config(args.config, None)
    backend = open_backend(args.store)
    try:
        names = args.memory or [n for n in backend.names() if not n.endswith(SUFFIX)]
        for name in names:
            done = reindex(backend, name, config)
            how = "re-embedded" if done["re_embedded"] else "vectors kept"
            print(
                f"reindexed {name}: {done['messages']} messages ({how}), lexical {config.lexical().id}, "
                f"chunking {config.embed_chunking}"
            )
    except KeyError as err:
        raise SystemExit(f"tider memory reindex: {err.args[0]}") from None
    finally:
        backend.close()
    return 0

"""`tider eval <subcommand>`: the evaluation group. Each subcommand lives in its own module
exposing ``register(eval_subparsers)``: ``eval_retrieval`` (retrieval metrics), ``eval_qa``
(answer accuracy) and ``eval_compare`` (locator vs baselines)."""

from __future__ import annotations

from tider.commands import eval_compare, eval_qa, eval_retrieval


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate retrieval, QA and window sources (stage-wise, resumable)")
    sub = parser.add_subparsers(dest="eval_command", metavar="<eval command>", required=True)
    for module in (eval_retrieval, eval_qa, eval_compare):
        module.register(sub)

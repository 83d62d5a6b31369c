"""Hardware facts, in one place: what this machine computes fast, and the dtype that follows.

A CPU without native bf16 (no AVX512-BF16, no AMX) emulates every bf16 matmul: on a
2-core AMD EPYC with AVX2 only, a 512x256x1024 matmul takes ~246 ms in bf16 and ~2.7 ms
in float32. So ``dtype: auto`` means bf16 on CUDA and on CPUs with native bf16, float32
everywhere else. Training recipes, export and the benchmarks' hardware line read it here.
"""

from __future__ import annotations

import logging
import os
import platform
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

# /proc/cpuinfo flags that mean bf16 matmuls run natively on the CPU.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
    """First processor block of /proc/cpuinfo as key -> value ({} where there is none)."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return {}
    info: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            if info:
                break
            continue
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cpu_model() -> str:
    """The CPU's marketing name, e.g. ``AMD EPYC`` (``platform.processor()`` elsewhere)."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """True when the CPU has AVX512-BF16 or AMX: torch's own probe first, cpuinfo flags as fallback."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    answers = []
    for probe in probes:
        try:
            answers.append(bool(probe()) if probe is not None else None)
        except RuntimeError:
            answers.append(None)
    if any(answers):
        return True
    if all(a is False for a in answers):
        return False
    flags = set(_cpuinfo().get("flags", "").split())
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def gpu_name() -> str | None:
    """Name of CUDA device 0, or None without CUDA."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def auto_dtype(use_cpu: bool = False) -> str:
    """``bfloat16`` on CUDA (unless ``use_cpu``) and on CPUs with native bf16, else ``float32``."""
    import torch

    if torch.cuda.is_available() and not use_cpu:
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_native_bf16() else "float32"


_logged: set[str] = set()


def resolve_dtype(value: str | None, use_cpu: bool = False, log: bool = True) -> str | None:
    """A recipe's ``dtype``: ``auto`` becomes :func:`auto_dtype` (logged once per process
    unless ``log=False``), anything else is returned as given."""
    if value != "auto":
        return value
    chosen = auto_dtype(use_cpu)
    if log:
        log_choice(chosen)
    return chosen


def log_choice(chosen: str) -> None:
    """``dtype auto -> X (this machine)``, once per process."""
    if chosen not in _logged:
        _logged.add(chosen)
        logger.info("dtype auto -> %s (%s)", chosen, describe())


def matmul_ms(repeats: int = 50) -> float:
    """Median milliseconds of the float32 512x256x1024 matmul the module docstring quotes,
    with torch's current thread count: a benchmark records it beside its timings, because a
    machine's speed is not its description (one "2-core AMD EPYC" VM here ran the same SFT
    step in 1.0 s and, an hour earlier, in 1.8 s)."""
    import time

    import torch

    a, b = torch.randn(512, 256), torch.randn(256, 1024)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return round(1000 * sorted(times)[len(times) // 2], 3)


def describe() -> str:
    """One line for logs, benchmarks and README figures, e.g.
    ``AMD EPYC, 2 cores, no native bf16, no GPU``."""
    gpu = gpu_name()
    bf16 = "native bf16" if cpu_native_bf16() else "no native bf16"
    return f"{cpu_model()}, {cpu_cores()} cores, {bf16}, " + (f"GPU {gpu}" if gpu else "no GPU")


__all__ = [
    "auto_dtype",
    "cpu_cores",
    "cpu_model",
    "cpu_native_bf16",
    "describe",
    "gpu_name",
    "log_choice",
    "matmul_ms",
    "resolve_dtype",
]

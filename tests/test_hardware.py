"""dtype by hardware: `dtype: auto` is bf16 on CUDA and on CPUs with native bf16, float32
elsewhere, and the tiny recipes' bf16 autocast follows it; explicit settings win."""

from __future__ import annotations

from pathlib import Path

import pytest

from tider import hardware

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cpu_only(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def set_native(native: bool):
        monkeypatch.setattr(hardware, "cpu_native_bf16", lambda: native)

    yield set_native


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_follows_native_bf16(cpu_only, native, expected):
    cpu_only(native)
    assert hardware.auto_dtype() == expected
    assert hardware.resolve_dtype("auto") == expected
    assert hardware.resolve_dtype("bfloat16") == "bfloat16"  # explicit choices pass through
    assert ("native bf16" if native else "no native bf16") in hardware.describe()


def test_cuda_means_bf16_unless_the_recipe_runs_on_cpu(monkeypatch, cpu_only):
    import torch

    cpu_only(False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert hardware.auto_dtype() == "bfloat16"
    assert hardware.auto_dtype(use_cpu=True) == "float32"


def test_native_bf16_probe_reads_torch_then_cpuinfo(monkeypatch, tmp_path):
    import torch

    hardware.cpu_native_bf16.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert hardware.cpu_native_bf16() is False
    hardware.cpu_native_bf16.cache_clear()
    # torch cannot tell (older build): the cpuinfo flags decide
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {"model name": "X", "flags": "fpu avx2 amx_bf16 amx_tile"})
    assert hardware.cpu_native_bf16() is True
    hardware.cpu_native_bf16.cache_clear()
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {"model name": "X", "flags": "fpu avx2 fma"})
    assert hardware.cpu_native_bf16() is False
    hardware.cpu_native_bf16.cache_clear()


def test_this_machine_is_described():
    line = hardware.describe()
    assert hardware.cpu_model() in line and f"{hardware.cpu_cores()} cores" in line
    # The speed probe benchmarks record: a 512x256x1024 float32 matmul is milliseconds.
    assert 0 < hardware.matmul_ms(repeats=3) < 1000


@pytest.mark.parametrize("stage", ["sft", "grpo"])
@pytest.mark.parametrize("native", [True, False])
def test_tiny_recipes_resolve_auto(cpu_only, stage, native):
    from tider.train.config import parse_recipe

    cpu_only(native)
    recipe = ROOT / f"configs/{stage}/tiny-cpu.yaml"
    _, training, model = parse_recipe(stage, ["--config", str(recipe)])
    assert model.dtype == ("bfloat16" if native else "float32")
    assert training.bf16 is native and training.use_cpu
    # an explicit --bf16 on the command line still wins over the hardware default
    _, training, _ = parse_recipe(stage, ["--config", str(recipe), "--bf16", str(not native).lower()])
    assert training.bf16 is (not native)


def test_production_recipes_keep_bf16(cpu_only):
    from tider.train.config import parse_recipe

    cpu_only(False)
    for stage in ("sft", "grpo"):
        _, training, model = parse_recipe(
            stage, ["--config", str(ROOT / f"configs/{stage}/qwen3-1.7b.yaml"), "--use_cpu", "true"]
        )
        assert model.dtype == "bfloat16" and training.bf16

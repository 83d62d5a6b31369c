"""tider export: LoRA merge and full-weights copy verified by reload, and corrupted exports
(missing tokenizer, mismatched tider_locator.json, empty weights, unsupported ZeRO-3) refused
with a message that names the folder and the problem. The export is atomic: a failed
verification or an interrupt leaves the previous export as it was and no temporary folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from datetime import date

import pytest

torch = pytest.importorskip("torch")

from tider.locator.contract import METADATA_FILE, LocatorContractError
from tider.train import export as export_module
from tider.train.export import (
    ExportError,
    ExportVerificationError,
    detect_layout,
    export_locator,
    load_locator_metadata,
)
from tider.train.tiny import build_tiny_qwen3, iso_dates

CORPUS = [
    "Question: When did Alice go to the book club? Asked at: 2023-06-01",
    "Timeline: [2023-05-07 .. 2023-05-09] Alice went to a book club.",
    '{"temporal": true, "windows": [{"start": "2023-05-07", "end": "2023-05-09"}]}',
    '{"temporal": false, "windows": []}',
    "Bob repainted the office and ran a city marathon last month.",
] * 20


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-base")
    build_tiny_qwen3(
        out,
        CORPUS,
        vocab_size=400,
        date_tokens=iso_dates(date(2023, 1, 1), date(2024, 2, 1)),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
    )
    return out


@pytest.fixture(scope="module")
def lora_checkpoint(tiny_base, tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("lora-ckpt")
    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    # init_lora_weights=False: non-zero B, so merging really changes the weights.
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(out)
    (out / METADATA_FILE).write_text(json.dumps({"granularity": "day", "training_data_hash": "abc123"}))
    return out


@pytest.fixture(scope="module")
def lora_export(lora_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "locator"
    report = export_locator(lora_checkpoint, out, dtype="float32")
    return out, report


def test_lora_export_merges_and_matches_source(lora_export):
    from safetensors import safe_open

    out, report = lora_export
    assert report.source_layout == "lora"
    assert report.greedy_identical is True, report.greedy_mismatches
    assert report.max_abs_logit_diff is not None and report.max_abs_logit_diff < 1e-4
    meta = load_locator_metadata(out)
    assert meta.granularity == "day" and meta.training_data_hash == "abc123"
    assert meta.dtype == "float32" and meta.source_layout == "lora"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and not any("lora" in k for k in keys)
    for name in ("tokenizer.json", "generation_config.json", "config.json", "export_report.json"):
        assert (out / name).exists(), name
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template  # ChatML survives the export


def test_merge_really_changes_weights(lora_export, tiny_base):
    from transformers import AutoModelForCausalLM

    out, _ = lora_export
    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base.state_dict()[name], merged.state_dict()[name])


def test_full_weights_export_via_cli(tiny_base, tmp_path):
    import argparse

    from tider.commands import export as export_command

    parser = argparse.ArgumentParser(prog="tider")
    export_command.register(parser.add_subparsers())
    out = tmp_path / "full"
    args = parser.parse_args(["export", "--checkpoint", str(tiny_base), "--out", str(out), "--granularity", "minute"])
    assert args.func(args) == 0
    report = json.loads((out / "export_report.json").read_text())
    assert report["source_layout"] == "full" and report["greedy_identical"] is True
    assert report["max_abs_logit_diff"] == 0.0
    assert load_locator_metadata(out).granularity == "minute"
    # refuses to overwrite without being told
    with pytest.raises(ExportError, match="not empty"):
        export_locator(tiny_base, out, granularity="minute")


def test_granularity_required_without_training_metadata(tiny_base, tmp_path):
    with pytest.raises(ExportError, match="granularity unknown"):
        export_locator(tiny_base, tmp_path / "x", verify=False)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_tokenizer_is_refused(lora_export, tmp_path):
    bad = _copy(lora_export[0], tmp_path / "bad")
    (bad / "tokenizer.json").unlink()
    with pytest.raises(LocatorContractError, match=r"bad: tokenizer missing"):
        load_locator_metadata(bad)


def test_mismatched_metadata_is_refused(lora_export, tmp_path):
    bad = _copy(lora_export[0], tmp_path / "bad")
    meta = json.loads((bad / METADATA_FILE).read_text())
    meta["prompt_version"] = "locator-v0"
    (bad / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(LocatorContractError, match="prompt version 'locator-v0' does not match"):
        load_locator_metadata(bad)
    meta["prompt_version"] = json.loads((lora_export[0] / METADATA_FILE).read_text())["prompt_version"]
    meta["output_schema"] = {"type": "object"}
    (bad / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(LocatorContractError, match="output_schema differs"):
        load_locator_metadata(bad)
    (bad / METADATA_FILE).write_text("{not json")
    with pytest.raises(LocatorContractError, match="not valid JSON"):
        load_locator_metadata(bad)
    (bad / METADATA_FILE).unlink()
    with pytest.raises(LocatorContractError, match="not a tider export"):
        load_locator_metadata(bad)


def test_empty_weights_are_refused(lora_export, tiny_base, tmp_path):
    from safetensors.torch import load_file, save_file

    # What ZeRO-3 without stage3_gather_16bit_weights_on_model_save leaves behind.
    state = load_file(str(lora_export[0] / "model.safetensors"))
    empty = {k: torch.empty(0, dtype=v.dtype) for k, v in state.items()}
    bad = _copy(lora_export[0], tmp_path / "bad")
    save_file(empty, str(bad / "model.safetensors"))
    with pytest.raises(ExportError, match="empty weights"):
        load_locator_metadata(bad)
    ckpt = _copy(tiny_base, tmp_path / "ckpt")
    save_file(empty, str(ckpt / "model.safetensors"))
    with pytest.raises(ExportError, match="stage3_gather_16bit_weights_on_model_save"):
        export_locator(ckpt, tmp_path / "out", granularity="day")


def test_zero3_layout_without_deepspeed_explains_how_to_gather(tiny_base, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    # a box without deepspeed: every import of it fails, submodules imported earlier included
    for name in ["deepspeed", *(m for m in list(sys.modules) if m.startswith("deepspeed."))]:
        monkeypatch.setitem(sys.modules, name, None)
    ckpt = tmp_path / "checkpoint-10"
    (ckpt / "global_step10").mkdir(parents=True)
    shutil.copy(tiny_base / "config.json", ckpt / "config.json")
    (ckpt / "global_step10" / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
    (ckpt / "latest").write_text("global_step10")
    (ckpt / "zero_to_fp32.py").write_text("# written by deepspeed\n")
    assert detect_layout(ckpt) == "zero3"
    with pytest.raises(ExportError, match="zero_to_fp32.py"):
        export_locator(ckpt, tmp_path / "out", granularity="day")


def test_not_a_checkpoint_lists_trainer_checkpoints(tmp_path):
    (tmp_path / "run" / "checkpoint-5").mkdir(parents=True)
    with pytest.raises(ExportError, match="checkpoint-5"):
        detect_layout(tmp_path / "run")


def _snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _corrupt_written_weights(monkeypatch):
    """The export's writer corrupts one weight (as a bad writer or disk would): the final
    norm negated flips every logit, so the reloaded export's greedy output must differ."""
    from safetensors.torch import load_file, save_file

    write = export_module._write_export

    def corrupted(model, tokenizer, meta, folder):
        write(model, tokenizer, meta, folder)
        state = load_file(str(folder / "model.safetensors"))
        state["model.norm.weight"] = -state["model.norm.weight"]
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

    monkeypatch.setattr(export_module, "_write_export", corrupted)


def _cli(*argv) -> int:
    import argparse

    from tider.commands import export as export_command

    parser = argparse.ArgumentParser(prog="tider")
    export_command.register(parser.add_subparsers())
    args = parser.parse_args(["export", *argv])
    return args.func(args)


def test_failed_verification_keeps_the_previous_export(tiny_base, tmp_path, monkeypatch, capsys):
    out = tmp_path / "locator"
    report = export_locator(tiny_base, out, granularity="day", dtype="float32")
    assert report.device == ("cuda" if torch.cuda.is_available() else "cpu")
    before = _snapshot(out)
    _corrupt_written_weights(monkeypatch)
    with pytest.raises(ExportVerificationError, match="nothing was written") as failed:
        export_locator(tiny_base, out, granularity="minute", dtype="float32", overwrite=True)
    assert failed.value.report.greedy_mismatches and failed.value.report.greedy_identical is False
    assert _snapshot(out) == before and load_locator_metadata(out).granularity == "day"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locator"]  # no temporary folder left
    # The CLI: exit 1 with the comparison printed, and a fresh --out never appears.
    assert _cli("--checkpoint", str(tiny_base), "--out", str(tmp_path / "fresh"), "--granularity", "day") == 1
    assert "greedy continuation(s)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locator"]


def test_interrupted_export_keeps_the_previous_export(tiny_base, tmp_path, monkeypatch):
    out = tmp_path / "locator"
    export_locator(tiny_base, out, granularity="day", dtype="float32")
    before = _snapshot(out)
    write = export_module._write_export

    def interrupted(model, tokenizer, meta, folder):
        write(model, tokenizer, meta, folder)
        raise KeyboardInterrupt  # e.g. Ctrl-C after the weights were written

    monkeypatch.setattr(export_module, "_write_export", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_locator(tiny_base, out, granularity="minute", dtype="float32", overwrite=True)
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locator"]


def test_overwrite_replaces_the_export_once_verified(tiny_base, lora_checkpoint, tmp_path):
    out = tmp_path / "locator"
    export_locator(tiny_base, out, granularity="minute", dtype="float32")
    (out / "stale.txt").write_text("from the previous export")
    assert _cli("--checkpoint", str(lora_checkpoint), "--out", str(out), "--dtype", "float32", "--overwrite") == 0
    meta = load_locator_metadata(out)
    assert meta.source_layout == "lora" and meta.granularity == "day"
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "export_report.json").read_text())["greedy_identical"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locator"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700: servers run as others read it

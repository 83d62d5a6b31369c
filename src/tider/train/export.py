"""Turn a training checkpoint into a servable locator folder, and check such folders.

``export_locator(checkpoint, out)`` accepts the three layouts training produces:

- a LoRA adapter (``adapter_config.json``): loaded over its base model and merged with
  peft's ``merge_and_unload``, so vLLM serves one plain set of weights;
- full weights (``config.json`` + safetensors/bin): re-saved as safetensors;
- a DeepSpeed ZeRO-3 checkpoint (``global_step*/`` shards): gathered to fp32 with
  ``deepspeed.utils.zero_to_fp32`` when deepspeed is installed, otherwise a clear error
  with the command that gathers it. ZeRO-3 runs saved without
  ``stage3_gather_16bit_weights_on_model_save`` leave 0-element tensors in
  ``model.safetensors``; those are detected and refused rather than exported as garbage.

The export folder holds safetensors, tokenizer (+ chat template), generation config and
``tider_locator.json`` (``tider.locator.contract.LocatorMetadata``: training's prompt and
timeline settings, plus the export's dtype and layout), which ``tider serve`` and the
``locator`` window source check before use, so a model is never served behind a prompt it
was not trained on.

The export is verified by reloading it and comparing, on fixed prompts, the logits
(max abs difference reported) and the greedy continuations (must be identical) against
a reference loaded on its own from the checkpoint (for LoRA: the unmerged PeftModel), so
whatever export does to the model it writes cannot also change what it is compared with.

The export is atomic: it is written and verified in a temporary folder next to ``out`` (same
filesystem), and only a verified folder is renamed into place. With ``overwrite`` the old
export is moved aside only then, so a failed or interrupted export leaves the previous one
intact and never a half-written ``out``. Loading, merging and verification run on CUDA when
there is a GPU (``device="auto"``): a 1.7B merge and its greedy check take minutes on CPU.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

# The export-folder checks live with the contract so that serving reads them without the
# training stack; imported here because export runs them and callers import them from here.
from tider.locator.contract import (
    GRANULARITIES,
    METADATA_FILE,
    TOKENIZER_FILES,
    ExportError,
    LocatorContractError,
    LocatorMetadata,
    check_weights_not_empty,
    load_locator_metadata,
)

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")

# Fixed verification prompts: locator-shaped questions, no dataset needed. Short, so the
# check costs seconds on CPU for the tiny model and well under a minute for a 1.7B one.
VERIFY_PROMPTS = (
    (
        "Timeline:\n2023-05-07 to 2023-05-09: Alice went to a book club.\n"
        "Question (asked 2023-06-01): When did Alice go to the book club?"
    ),
    (
        "Timeline:\n2023-03-02: Bob repainted the office.\n2023-08-14: Bob ran a city marathon.\n"
        "Question (asked 2023-09-01): What did Bob do last month?"
    ),
    "Question (asked 2024-01-10): What is Jon's favourite food?",
)


class ExportVerificationError(ExportError):
    """The reloaded export's greedy output differs from the source; nothing was installed.
    ``report`` holds the comparison (mismatched continuations, logit difference)."""

    def __init__(self, report: ExportReport):
        self.report = report
        super().__init__(
            f"{report.out_dir}: export differs from the source on {len(report.greedy_mismatches)} greedy "
            f"continuation(s) (max |logit diff| {report.max_abs_logit_diff}); nothing was written there"
        )


@dataclass
class ExportReport:
    out_dir: str
    source_layout: str  # "lora" | "full" | "zero3"
    dtype: str
    device: str = "cpu"
    max_abs_logit_diff: float | None = None
    greedy_identical: bool | None = None
    greedy_mismatches: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- layouts


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))


def _zero_shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("global_step*/*model_states.pt"))


def detect_layout(checkpoint: Path) -> str:
    """``lora``, ``full`` or ``zero3``; raises ExportError naming what is missing."""
    if not checkpoint.is_dir():
        raise ExportError(f"{checkpoint}: checkpoint folder does not exist")
    if (checkpoint / "adapter_config.json").exists():
        return "lora"
    if _weight_files(checkpoint):
        return "full"
    if _zero_shards(checkpoint):
        return "zero3"
    subdirs = sorted(p.name for p in checkpoint.glob("checkpoint-*") if p.is_dir())
    hint = f" (trainer checkpoints inside: {', '.join(subdirs)}; pass one of them)" if subdirs else ""
    raise ExportError(
        f"{checkpoint}: no adapter_config.json, no *.safetensors/pytorch_model*.bin and no "
        f"DeepSpeed global_step*/ shards — not a model checkpoint{hint}"
    )


def _torch_dtype(name: str, config) -> object:
    import torch

    if name == "auto":
        # The config's dtype is what training declared; fall back to fp32 when absent.
        name = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
        name = name.replace("torch.", "")
    if name not in DTYPES[1:]:
        raise ExportError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def _load_zero3(checkpoint: Path, dtype):
    """Gather ZeRO-3 shards into a model built from the checkpoint's config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as exc:
        script = checkpoint / "zero_to_fp32.py"
        gather = (
            f"python {script} {checkpoint} {checkpoint}/gathered --safe_serialization"
            if script.exists()
            else "pip install 'tider[gpu]'  # deepspeed"
        )
        raise ExportError(
            f"{checkpoint}: DeepSpeed ZeRO-3 shards ({_zero_shards(checkpoint)[0].parent.name}/) need "
            f"deepspeed to be gathered, and it is not installed. Either install it and rerun "
            f"tider export, or gather them first:\n  {gather}\nthen copy config.json and the "
            f"tokenizer next to the gathered weights and export that folder."
        ) from exc
    if not (checkpoint / "config.json").exists():
        raise ExportError(f"{checkpoint}: ZeRO-3 shards found but no config.json to build the model from")
    state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    if not state or all(t.numel() == 0 for t in state.values()):
        raise ExportError(f"{checkpoint}: empty weights after gathering the ZeRO-3 shards")
    config = AutoConfig.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.to(dtype)


def load_source(
    checkpoint: Path, *, layout: str, dtype_name: str = "auto", base_model: str | None = None, device: str = "cpu"
):
    """(model to export, reference model for verification, tokenizer source folder), both
    models on ``device`` (LoRA is merged there)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if layout == "lora":
        from peft import PeftConfig, PeftModel

        peft_config = PeftConfig.from_pretrained(checkpoint)
        base = base_model or peft_config.base_model_name_or_path
        if not base:
            raise ExportError(f"{checkpoint}/adapter_config.json names no base model; pass --base-model")
        dtype = _torch_dtype(dtype_name, AutoConfig.from_pretrained(base))
        load_base = lambda: AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device)
        reference = PeftModel.from_pretrained(load_base(), checkpoint)
        reference.eval()
        # merge into a second copy: the unmerged one stays as the verification reference.
        merged = PeftModel.from_pretrained(load_base(), checkpoint).merge_and_unload()
        tok_dir = checkpoint if _has_tokenizer(checkpoint) else Path(base)
        return merged, reference, tok_dir
    if layout == "full":
        check_weights_not_empty(checkpoint)
        dtype = _torch_dtype(dtype_name, AutoConfig.from_pretrained(checkpoint))
        load = lambda: AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(device)
        return load(), load(), checkpoint
    if layout == "zero3":
        dtype = _torch_dtype(dtype_name, AutoConfig.from_pretrained(checkpoint))
        load = lambda: _load_zero3(checkpoint, dtype).to(device)
        return load(), load(), checkpoint
    raise ExportError(f"unknown checkpoint layout {layout!r}; known: lora, full, zero3")


def resolve_device(name: str = "auto") -> str:
    """``auto``: CUDA where torch sees a GPU, else CPU. ``cuda`` without a GPU is an error."""
    import torch

    if name not in DEVICES:
        raise ExportError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ExportError("--device cuda, but torch sees no CUDA device")
    return name


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in TOKENIZER_FILES)


# --------------------------------------------------------------------------- metadata


def build_metadata(
    training: LocatorMetadata | None,
    *,
    granularity: str | None,
    data_hash: str | None,
    layout: str,
    dtype: str,
    checkpoint: Path,
) -> LocatorMetadata:
    """Training's ``tider_locator.json`` (prompt and timeline settings travel with the export:
    the serving side must rebuild exactly the training prompt) plus what export adds."""
    where = f"{checkpoint}/{METADATA_FILE}"
    try:
        meta = (training or LocatorMetadata()).validate(where)
    except LocatorContractError as exc:
        raise ExportError(f"{exc}; export with the tider version that trained it") from exc
    granularity = granularity or meta.granularity
    if granularity not in GRANULARITIES:
        raise ExportError(
            f"{checkpoint}: granularity unknown (no {METADATA_FILE} from training); pass --granularity day|minute"
        )
    return replace(
        meta,
        granularity=granularity,
        training_data_hash=data_hash or meta.training_data_hash,
        source_checkpoint=str(checkpoint),
        source_layout=layout,
        dtype=dtype,
    )


# --------------------------------------------------------------------------- verify


def _prompt_ids(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    out = []
    for text in prompts:
        messages = [{"role": "user", "content": text}]
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=False, tokenize=True, return_dict=False
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out


def compare_models(
    reference, exported, tokenizer, prompts: Sequence[str] = VERIFY_PROMPTS, max_new_tokens: int = 24
) -> tuple[float, list[dict]]:
    """(max |logit difference| over the prompts, greedy continuations that differ)."""
    import torch

    max_diff, mismatches = 0.0, []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        for ids in _prompt_ids(tokenizer, prompts):
            x = torch.tensor([ids], device=exported.device)
            a = reference(input_ids=x).logits.float()
            b = exported(input_ids=x).logits.float()
            max_diff = max(max_diff, (a - b).abs().max().item())
            kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, "pad_token_id": pad}
            ga = reference.generate(x, **kwargs)[0, len(ids) :].tolist()
            gb = exported.generate(x, **kwargs)[0, len(ids) :].tolist()
            if ga != gb:
                mismatches.append(
                    {"prompt": tokenizer.decode(ids), "source": tokenizer.decode(ga), "export": tokenizer.decode(gb)}
                )
    return max_diff, mismatches


# --------------------------------------------------------------------------- export


def export_locator(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "auto",
    base_model: str | None = None,
    granularity: str | None = None,
    data_hash: str | None = None,
    verify: bool = True,
    overwrite: bool = False,
    device: str = "auto",
) -> ExportReport:
    """Export ``checkpoint`` to ``out_dir`` (see the module docstring) and verify it.

    Raises ``ExportVerificationError`` (nothing installed, a previous ``out_dir`` untouched)
    when the reloaded export's greedy output differs from the source."""
    checkpoint, out = Path(checkpoint), Path(out_dir)
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    device = resolve_device(device)
    layout = detect_layout(checkpoint)
    training = LocatorMetadata.find(checkpoint)
    _check_replaceable(out, overwrite)
    model, reference, tok_dir = load_source(
        checkpoint, layout=layout, dtype_name=dtype, base_model=base_model, device=device
    )
    tokenizer = _load_tokenizer(checkpoint, tok_dir)
    dtype_name = str(next(model.parameters()).dtype).replace("torch.", "")
    meta = build_metadata(
        training, granularity=granularity, data_hash=data_hash, layout=layout, dtype=dtype_name, checkpoint=checkpoint
    )
    report = ExportReport(out_dir=str(out), source_layout=layout, dtype=dtype_name, device=device)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as `out`, so the final rename is one filesystem operation.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_export(model, tokenizer, meta, tmp)
        if verify:
            _verify(reference, tmp, model, report)
        _install(tmp, out, overwrite)
    except BaseException:  # an interrupt too: never leave the temporary folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _check_replaceable(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: output folder is not empty (pass --overwrite to replace it)")


def _load_tokenizer(checkpoint: Path, tok_dir: Path):
    from transformers import AutoTokenizer

    if not _has_tokenizer(tok_dir):
        raise ExportError(f"{checkpoint}: tokenizer missing (none of {', '.join(TOKENIZER_FILES)}) in {tok_dir}")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    if not tokenizer.chat_template:
        raise ExportError(f"{tok_dir}: tokenizer has no chat template; the locator prompt needs one")
    return tokenizer


def _write_export(model, tokenizer, meta: LocatorMetadata, folder: Path) -> None:
    """Weights, tokenizer, greedy generation config and ``tider_locator.json`` into ``folder``."""
    from transformers import GenerationConfig

    # mkdtemp makes the folder private (0700); an export is read by servers run as others.
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    model.config.dtype = meta.dtype  # what vLLM's `--dtype auto` will pick
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    generation = model.generation_config if model.generation_config is not None else GenerationConfig()
    # Greedy by default: the locator's output is a decision, not a sample.
    generation.do_sample = False
    generation.eos_token_id = tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    for unused in ("temperature", "top_p", "top_k"):
        setattr(generation, unused, None)
    generation.save_pretrained(folder)
    meta.write(folder)


def _verify(reference, folder: Path, model, report: ExportReport) -> None:
    """Reload ``folder`` and compare it with ``reference``; fills ``report`` and writes it
    there, or raises ``ExportVerificationError``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_locator_metadata(folder)
    exported = AutoModelForCausalLM.from_pretrained(folder, dtype=next(model.parameters()).dtype)
    exported.to(next(model.parameters()).device).eval()
    reference.eval()
    reloaded_tok = AutoTokenizer.from_pretrained(folder)
    report.max_abs_logit_diff, report.greedy_mismatches = compare_models(reference, exported, reloaded_tok)
    report.greedy_identical = not report.greedy_mismatches
    if not report.greedy_identical:
        raise ExportVerificationError(report)
    (folder / "export_report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")


def _install(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the verified ``tmp`` to ``out``; an old ``out`` is moved aside first and
    deleted only once the new one is in place (restored if the rename fails)."""
    _check_replaceable(out, overwrite)  # again: another export may have finished meanwhile
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

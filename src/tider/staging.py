"""Models staged where compute nodes read them offline: a local folder, or a Hub snapshot in
the cache of ``$HF_HOME`` (``tider stage`` fills it where the Hub is reachable). Training and
serving refuse a model found in neither at start, naming it and the staging command.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Weights and tokenizers only: the formats transformers, sentence-transformers and vLLM load.
STAGE_IGNORE = ["*.bin", "*.pt", "*.pth", "*.onnx", "*.h5", "*.msgpack", "*.ot", "onnx/*", "openvino/*"]


class ModelNotStaged(RuntimeError):
    """A model a job needs is neither a local folder nor in the Hub cache of ``$HF_HOME``."""


@dataclass(frozen=True)
class Need:
    role: str  # policy, reader, embedder
    model: str  # a local folder or a Hub id

    def __str__(self) -> str:
        return f"{self.role} {self.model}"


def hub_snapshot(model: str) -> Path | None:
    """The cached snapshot of Hub id ``model`` in ``$HF_HOME`` (no network), else None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(model, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return path if (path / "config.json").exists() or (path / "modules.json").exists() else None


def is_path(model: str) -> bool:
    """A local path rather than a Hub id (``org/name``)."""
    return model.startswith((".", "/", "~")) or model.count("/") > 1 or Path(model).expanduser().exists()


def where(model: str) -> str | None:
    """Where a node finds ``model`` offline: a local folder or the Hub cache; None if nowhere."""
    if Path(model).expanduser().is_dir():
        return f"local folder {model}"
    snapshot = hub_snapshot(model)
    return f"staged in {snapshot}" if snapshot else None


def not_staged_message(need: Need, recipe: str | None) -> str:
    from huggingface_hub.constants import HF_HUB_CACHE

    if is_path(need.model):
        return (
            f"the {need.role} {need.model} does not exist here "
            "(an earlier stage's output not written yet, or a wrong path)"
        )
    fix = f"tider stage {recipe}" if recipe else f"tider stage --model {need.model}"
    return (
        f"the {need.role} {need.model} is not staged: it is not a local folder and not in the Hub cache "
        f"{HF_HUB_CACHE}. Run `{fix}` where the Hub is reachable, with the same HF_HOME as the job"
    )


def require_staged(needs: Sequence[Need], recipe: str | None = None) -> None:
    """Raise ``ModelNotStaged`` naming the first model a node cannot load offline."""
    for need in needs:
        if where(need.model) is None:
            raise ModelNotStaged(not_staged_message(need, recipe))


def stage_models(models: Sequence[str], log=print) -> list[str]:
    """Download each Hub id into ``$HF_HOME`` (weights and tokenizer files); local folders
    are left as they are. Returns where each one is."""
    from huggingface_hub import snapshot_download

    places = []
    for model in models:
        if Path(model).expanduser().is_dir():
            places.append(f"{model}: local folder")
            continue
        if is_path(model):
            places.append(f"{model}: a path, not a Hub id (an earlier stage writes it)")
            continue
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
            raise ModelNotStaged(f"cannot stage {model}: HF_HUB_OFFLINE is set (stage where the Hub is reachable)")
        log(f"staging {model} ...")
        path = snapshot_download(model, ignore_patterns=STAGE_IGNORE)
        places.append(f"{model}: {path}")
    return places

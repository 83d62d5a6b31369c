"""The locator contract: what a trained locator was shown, and what it answers with.

Training, export, serving and the window sources all speak through this module:

- ``PROMPT_VERSION`` and ``OUTPUT_SCHEMA``: the prompt format and the JSON the locator
  writes (``tider.locator.prompt`` renders the prompt, ``tider.locator.parse`` reads the
  answer back);
- ``LocatorMetadata``: the ``tider_locator.json`` file that travels with a checkpoint
  and its export. It records everything that shapes the locator's input, so a served
  model is prompted exactly as it was trained: the prompt settings (line selection, the
  token budget, chat-template kwargs, granularity) and what builds the timeline the
  prompt lists (timeline clustering settings, the embedding model and the text it
  embeds). ``tider sft``/``tider grpo`` write it, ``tider export`` extends it with the
  export's dtype and layout, ``tider serve`` and the ``locator`` source validate it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Bump when the prompt text or output contract changes: caches, exports and manifests key on it.
# Checkpoints of earlier versions are refused: their prompt no longer exists, and such a
# model would be shown a format it never saw. v3 added what retrieval sees per line (hit
# marks H<k>, h<hits>/<size>, T) and answers "no window" where none would help.
PROMPT_VERSION = "locator-v3"
MAX_WINDOWS = 8
# The learning-free answers a prompt with options lists, numbered O1..O5 in this order in
# every prompt (tider.locator.options): {"option": n} answers exactly what that rule answers.
OPTION_NAMES = ("rules", "top-days", "top-day 1", "top-day 2", "top-day 3")
# Off in every recipe until a GRPO schedule is chosen for it on validation (docs/experiments.md,
# "Options in the prompt"); PromptSettings.options defaults to this.
OPTIONS_DEFAULT = False


def _ref(name: str, maximum: int | None) -> dict:
    bound = {"type": "integer", "minimum": 1, **({"maximum": maximum} if maximum else {})}
    return {"type": "object", "properties": {name: bound}, "required": [name], "additionalProperties": False}


_SPAN = {
    "type": "object",
    "properties": {"start": {"type": "string"}, "end": {"type": "string"}},
    "required": ["start", "end"],
    "additionalProperties": False,
}


def _mark_ref(labels) -> dict:
    label = {"type": "string", **({} if labels is True else {"enum": list(labels)})}
    return {"type": "object", "properties": {"mark": label}, "required": ["mark"], "additionalProperties": False}


def output_schema(
    n_lines: int | None = None, n_cues: int | None = None, marks=None, options: bool = True
) -> dict[str, Any]:
    """The answer's JSON schema: windows are ``{"mark": "H1"}`` (the line carrying that
    mark), ``{"entry": k}`` (a timeline line), ``{"cue": j}`` (a resolved time cue),
    ``{"option": n}`` (learning-free option n, when the prompt lists ``options``) or
    ``{"start", "end"}``. With ``n_lines``/``n_cues``/``marks`` (one prompt's table: its
    mark labels) the references are bounded, so a grammar-constrained server cannot point
    past the table; ``marks=True`` allows any label (the parser checks it). Kept to anyOf, integer bounds
    and enums, which vLLM's xgrammar and OpenAI's strict mode accept; the parser checks
    dates and consistency."""
    refs = [_ref("entry", n_lines)] + ([] if n_cues == 0 else [_ref("cue", n_cues)])
    refs += [_mark_ref(marks)] if marks else []
    refs += [_ref("option", len(OPTION_NAMES))] if options else []
    refs += [_SPAN]
    return {
        "type": "object",
        "properties": {
            "temporal": {"type": "boolean"},
            "windows": {"type": "array", "maxItems": MAX_WINDOWS, "items": {"anyOf": refs}},
        },
        "required": ["temporal", "windows"],
        "additionalProperties": False,
    }


# Any answer of any prompt (options included): what the parser and a local model's output
# are checked against. A checkpoint records the schema of its own prompt (``recorded_schema``).
OUTPUT_SCHEMA: dict[str, Any] = output_schema(marks=True)


def recorded_options(prompt_settings: dict | None) -> bool:
    """Whether a checkpoint's prompt lists the options: recorded settings without the key
    predate them (off); no recorded settings means the defaults."""
    return bool(prompt_settings.get("options", False)) if prompt_settings else OPTIONS_DEFAULT


def recorded_schema(prompt_settings: dict | None) -> dict[str, Any]:
    """The output schema of the prompt these settings build."""
    return output_schema(marks=True, options=recorded_options(prompt_settings))


@dataclass(frozen=True)
class Decoding:
    """How the locator's answer is drawn: greedy (``samples`` 1), or a vote of ``samples``
    completions at ``temperature``: a window stays when at least ``min_votes`` of them name
    it, and the answer is "no window" when none does.

    The vote's completions come from ONE request per query (``n`` = ``samples``, seed
    ``VOTE_SEED``): vLLM draws sample ``i`` with seed ``VOTE_SEED + i``, so the vote is
    reproducible, and the same samples as ``samples`` requests seeded 0, 1, ... would draw."""

    samples: int = 1
    temperature: float = 1.0
    min_votes: int = 1

    def __post_init__(self):
        if self.samples < 1 or not 1 <= self.min_votes <= self.samples:
            raise ValueError(f"decoding: need samples >= 1 and 1 <= min_votes <= samples, got {self}")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(f"decoding: {self.samples} samples need a temperature > 0")


VOTE_SEED = 0  # the seed of a vote's one request (not recorded: every vote uses it)

METADATA_FILE = "tider_locator.json"
METADATA_FORMAT = 2  # 2: + timeline settings, embedding model and template
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
GRANULARITIES = ("day", "minute")
# Qwen3's switch: the locator is trained to answer directly, without a think block.
NO_THINKING = {"enable_thinking": False}


class LocatorContractError(ValueError):
    """A locator's metadata is missing, malformed, or disagrees with this code or its data."""


# Settings a checkpoint's metadata may record that this code no longer has, by their path in
# tider_locator.json: (the value every shipped recipe used, the last commit that supported the
# option). A recorded shipped value is today's behaviour and is dropped on reading; any other
# value is refused, naming the commit that can still prompt such a checkpoint.
REMOVED_SETTINGS: dict[str, tuple[Any, str]] = {
    "timeline.summary_words": (16, "fa11d15"),  # the unread extractive timeline summaries
}


def drop_removed_settings(data: dict, where: str) -> dict:
    """``data`` (a ``tider_locator.json`` object) without the ``REMOVED_SETTINGS`` it records
    (``section.key``); ``LocatorContractError`` when one holds another value than the shipped one."""
    for path, (shipped, commit) in REMOVED_SETTINGS.items():
        section, key = path.split(".")
        recorded = data.get(section)
        if not isinstance(recorded, dict) or key not in recorded:
            continue
        if recorded[key] != shipped:
            raise LocatorContractError(
                f"{where}: {path} is {recorded[key]!r}, an option this code no longer has (only its shipped "
                f"value {shipped!r} still loads); the last commit that supports it is {commit} "
                "(run it there, or retrain)"
            )
        data = {**data, section: {k: v for k, v in recorded.items() if k != key}}
    return data


def input_settings(retrieval_config) -> dict:
    """What shapes the timeline a locator prompt lists, from a ``RetrievalConfig``: the
    clustering settings, and the embedding model and message template behind them."""
    from tider.retrieval.embed import embedding_model_id

    timeline = asdict(retrieval_config.timeline)
    return {
        "timeline": timeline,
        "embedding_model": embedding_model_id(retrieval_config.embedding_model),
        "embed_template": retrieval_config.embed_template,
    }


@dataclass
class LocatorMetadata:
    """``tider_locator.json``. ``None`` means unknown (e.g. a checkpoint trained elsewhere)."""

    granularity: str | None = None
    prompt_settings: dict | None = None  # tider.locator.prompt.PromptSettings.to_json()
    chat_template_kwargs: dict | None = None
    timeline: dict | None = None
    embedding_model: str | None = None
    embed_template: str | None = None
    training_data_hash: str | None = None
    dataset_name: str | None = None
    split_seed: int | None = None
    validation_memories: list | None = None  # a fixed split's held-out memories (else split_seed's)
    test_memories: list | None = None
    decoding: dict | None = None  # Decoding's fields; None: greedy
    # Written by ``tider export``.
    source_checkpoint: str | None = None
    source_layout: str | None = None
    dtype: str | None = None
    prompt_version: str = PROMPT_VERSION
    output_schema: dict = field(default_factory=lambda: recorded_schema(None))
    format: int = METADATA_FORMAT

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "tider_locator.json") -> LocatorMetadata:
        if not isinstance(data, dict):
            raise LocatorContractError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        data = drop_removed_settings(data, where)
        # Keys a newer tider added are ignored rather than fatal: the fields read here decide.
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def read(cls, path: str | Path) -> LocatorMetadata:
        path = Path(path)
        if path.is_dir():
            path = path / METADATA_FILE
        if not path.exists():
            raise LocatorContractError(f"{path}: no such file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise LocatorContractError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_json(data, str(path))

    @classmethod
    def find(cls, folder: str | Path) -> LocatorMetadata | None:
        """The metadata in ``folder`` or, for a ``checkpoint-N`` folder, in its run folder."""
        for candidate in (Path(folder), Path(folder).parent):
            if (candidate / METADATA_FILE).exists():
                return cls.read(candidate / METADATA_FILE)
        return None

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / METADATA_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)  # a killed writer never leaves half a file behind
        return path

    # -------------------------------------------------------------- validation
    def validate(self, where: str) -> LocatorMetadata:
        """Raise unless this code can prompt the model exactly as it was trained."""
        if self.prompt_version != PROMPT_VERSION:
            raise LocatorContractError(
                f"{where}: prompt version {self.prompt_version!r} does not match this code's {PROMPT_VERSION!r}; "
                "the model would be prompted with a format it was not trained on (retrain it with this version: "
                "`tider sft` then `tider grpo`)"
            )
        if self.output_schema != recorded_schema(self.prompt_settings):
            raise LocatorContractError(f"{where}: output_schema differs from tider.locator.contract.output_schema")
        if self.granularity is not None and self.granularity not in GRANULARITIES:
            raise LocatorContractError(f"{where}: granularity {self.granularity!r} is not one of {GRANULARITIES}")
        try:
            self.answer_decoding()
        except (TypeError, ValueError) as exc:
            raise LocatorContractError(f"{where}: decoding {self.decoding!r}: {exc}") from exc
        return self

    def answer_decoding(self) -> Decoding:
        """How the answer is drawn from the model: the recorded ``Decoding``, else greedy."""
        return Decoding(**self.decoding) if self.decoding is not None else Decoding()

    def unknown_prompt_settings(self) -> list[str]:
        """The prompt settings this file does not record (the client cannot rebuild them)."""
        return [
            name for name in ("granularity", "prompt_settings", "chat_template_kwargs") if getattr(self, name) is None
        ]

    def input_mismatches(self, retrieval_config) -> list[str]:
        """How the timeline a store would build differs from the one the locator trained on
        (empty when they agree or the metadata does not record it)."""
        now = input_settings(retrieval_config)
        out = []
        for name, value in now.items():
            trained = getattr(self, name)
            if trained is None:
                continue
            if name == "timeline":
                out += [
                    f"timeline.{k}: trained {trained[k]!r}, now {value.get(k)!r}"
                    for k in sorted(trained)
                    if k in value and trained[k] != value[k]
                ]
            elif trained != value:
                out.append(f"{name}: trained {trained!r}, now {value!r}")
        return out


def check_export_folder(folder: str | Path) -> LocatorMetadata:
    """A servable export: valid metadata with a granularity, a tokenizer and safetensors.

    Raises ``LocatorContractError`` naming the folder and the problem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LocatorContractError(f"{folder}: model folder does not exist")
    if not (folder / METADATA_FILE).exists():
        raise LocatorContractError(f"{folder}: no {METADATA_FILE} — not a tider export (run `tider export` first)")
    path = folder / METADATA_FILE
    meta = LocatorMetadata.read(path).validate(str(path))
    if meta.granularity is None:
        raise LocatorContractError(f"{path}: missing field granularity")
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise LocatorContractError(f"{folder}: tokenizer missing (none of {', '.join(TOKENIZER_FILES)})")
    if not list(folder.glob("*.safetensors")):
        raise LocatorContractError(f"{folder}: no *.safetensors weights")
    return meta


class ExportError(LocatorContractError):
    """A checkpoint cannot be exported, or an export folder is not a usable locator."""


def check_weights_not_empty(folder: Path) -> None:
    """Refuse safetensors holding 0-element tensors (ZeRO-3 saved without gathering)."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            if not keys:
                raise ExportError(f"{path}: empty weights (the file holds no tensors)")
            empty = [k for k in keys if _numel(f.get_slice(k).get_shape()) == 0]
        if empty:
            raise ExportError(
                f"{path}: empty weights — {len(empty)} of {len(keys)} tensors have 0 elements "
                f"(e.g. {empty[0]!r}). This is what a DeepSpeed ZeRO-3 run saves without "
                "`stage3_gather_16bit_weights_on_model_save: true`; set it in the DeepSpeed "
                "config, or export the global_step*/ shards (see tider export --help)."
            )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def load_locator_metadata(model_dir: str | Path) -> LocatorMetadata:
    """Check an export folder is a usable locator and return its ``tider_locator.json``.

    Raises ``LocatorContractError`` naming the folder and the problem: missing metadata, a
    prompt version or output schema other than this code's, no tokenizer, no weights, and
    (``ExportError``) weights of 0-element tensors.
    """
    meta = check_export_folder(model_dir)
    check_weights_not_empty(Path(model_dir))
    return meta

"""What a ``tider eval qa`` run does (``QAConfig``): the one place the QA defaults live.

``tider eval qa``'s options read their defaults from here (the context's, from ``tider.memory.context``).
A module of its own, without the pipeline's imports, so the command line reads it cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from tider.memory.context import BUDGET, TOP_N
from tider.retrieval.config import RetrievalConfig

CONTEXT_KINDS = ("flat", "forest")
STAGES = ("retrieve", "select", "structure", "compress", "answer", "judge")
COMPRESSION_MODES = ("idf", "truncate")
MAX_TOKEN_STAGES = ("select", "structure", "answer", "judge")  # QAConfig.<stage>_max_tokens
# tider.forest.prompts texts a resumed run must find unchanged (QAConfig.manifest)
PROMPTS = ("SELECTION_SYSTEM", "STRUCTURING_SYSTEM", "READER_SYSTEM_FLAT", "READER_SYSTEM_FOREST", "JUDGE_SYSTEM")


@dataclass
class QAConfig:
    windows: Sequence[str] = ("none", "dbscan-paper", "oracle")
    contexts: Sequence[str] = CONTEXT_KINDS
    k: int = RetrievalConfig.k  # seeds R_k(q) from the dual-channel retriever
    top_n: int = TOP_N  # candidates per window sent to evidence selection
    budget: int = BUDGET  # context budget B in tokens
    compression: str = "idf"
    classifier: str = "llm"  # llm | lexical (named variant, never a silent substitute)
    selection: bool = True
    limit: int | None = None
    memory_keys: Sequence[str] | None = None
    exclude_categories: Sequence[str] = ()
    select_max_tokens: int = 512
    structure_max_tokens: int = 512
    answer_max_tokens: int = 256
    judge_max_tokens: int = 64
    answer_temperature: float = 0.0  # selection and structuring are always greedy
    judge_temperature: float = 0.0
    seed: int = 0
    until: str = "judge"  # last stage to run: compress = context statistics without a reader
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    # Options of model-backed window sources, e.g. {"locator": {"url": ...}} (tider.commands.eval_options).
    source_options: dict = field(default_factory=dict)

    def __post_init__(self):
        for c in self.contexts:
            if c not in CONTEXT_KINDS:
                raise ValueError(f"unknown context kind {c!r}; known: {', '.join(CONTEXT_KINDS)}")
        if self.until not in STAGES:
            raise ValueError(f"unknown stage {self.until!r}; known: {', '.join(STAGES)}")
        if self.compression not in COMPRESSION_MODES:
            raise ValueError(f"unknown compression {self.compression!r}; known: {', '.join(COMPRESSION_MODES)}")

    def to_json(self) -> dict:
        out = asdict(self)
        out["retrieval"] = self.retrieval.to_json()
        out["windows"], out["contexts"] = list(self.windows), list(self.contexts)
        return out

    def require_clients(self, **clients) -> None:
        """Fail unless every LLM the stages up to ``until`` call is given (``clients``:
        ``reader``, ``judge``, ``selector``)."""
        wanted = set(STAGES[: STAGES.index(self.until) + 1])
        needs = {
            "reader": "answer" in wanted,
            "judge": "judge" in wanted,
            "selector": ("select" in wanted and self.selection)
            or ("structure" in wanted and self.classifier == "llm" and "forest" in self.contexts),
        }
        missing = [name for name, needed in needs.items() if needed and clients[name] is None]
        if missing:
            raise ValueError(f"QA run up to stage {self.until!r} needs an LLM for: {', '.join(missing)}")

    def manifest(self, dataset: str, data_path, n_queries: int, clients: dict, tokenizer: str) -> dict:
        """What a resumed run must match: the data, this config, the models (``clients``:
        name by role), the tokenizer and the prompt texts."""
        from tider.eval.runner import file_hash
        from tider.forest import prompts

        return {
            "command": "eval qa",
            "dataset": dataset,
            "data_path": data_path,
            "data_hash": file_hash(data_path),
            "n_queries": n_queries,
            # ``until`` is left out: extending a context-only run to answers reuses its records.
            "config": {**{k: v for k, v in self.to_json().items() if k != "until"}, **clients, "tokenizer": tokenizer},
            "prompt_hashes": {name: prompts.prompt_hash(getattr(prompts, name)) for name in PROMPTS},
        }

"""Script arguments for ``tider sft`` / ``tider grpo``, parsed with TRL's ``TrlParser``
next to TRL's own ``SFTConfig``/``GRPOConfig`` and ``ModelConfig`` (the open-r1 pattern).

A recipe YAML sets fields of any of the three dataclasses; a key none of them knows is an
error (``TrlParser.parse_args_and_config(fail_with_unknown_args=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tider.hardware import resolve_dtype
from tider.locator.lines import LineConfig
from tider.locator.prompt import PromptSettings
from tider.types import WINDOW_BUCKETS


@dataclass
class LocatorScriptArguments:
    """Data and model-building options shared by both stages."""

    dataset_name: str = field(
        default="synthetic", metadata={"help": "tider.data loader name (synthetic, locomo, ...)."}
    )
    dataset_path: str | None = field(default=None, metadata={"help": "Path for file-backed loaders (LoCoMo JSON)."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the synthetic benchmark generator."})
    synthetic_messages: int | None = field(
        default=None, metadata={"help": "Generate a synthetic benchmark of this many messages instead of the default."}
    )
    synthetic_conversations: int = field(
        default=16, metadata={"help": "Conversations in a generated synthetic benchmark."}
    )
    synthetic_train_conversations: int = field(
        default=0,
        metadata={
            "help": "Extra synthetic conversations for the train split only, generated from "
            "synthetic_train_seed (never the benchmark's seed): fresh data instead of epochs."
        },
    )
    synthetic_train_seed: int = field(
        default=1000, metadata={"help": "Seed of the train-only conversations (>= 1000 by convention)."}
    )
    split_seed: int = field(default=0, metadata={"help": "Seed of the by-conversation train/validation/test split."})
    validation_memories: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Fixed split: these memories (conversations, personas) are validation; with "
            "test_memories, every other memory is train. Empty: a seeded 80/10/10 split (split_seed)."
        },
    )
    test_memories: list[str] = field(
        default_factory=list, metadata={"help": "Fixed split: these memories are test (never trained on)."}
    )
    prompt_lines: int = field(
        default=LineConfig().max_lines, metadata={"help": "Timeline lines in the locator prompt (tider.locator.lines)."}
    )
    prompt_system_message: bool = field(
        default=True, metadata={"help": "Send the locator instructions as a system message."}
    )
    prompt_question_words: int = field(
        default=PromptSettings().question_words, metadata={"help": "The question is clipped to this many words."}
    )
    prompt_options: bool = field(
        default=PromptSettings().options,
        metadata={"help": "List the learning-free answers (rules, top-days, top-day k) as options O1.. in the prompt."},
    )
    max_prompt_tokens: int = field(
        default=PromptSettings().max_prompt_tokens,
        metadata={"help": "Prompt token budget; the least-needed timeline lines are dropped to fit."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Cap on training prompts (after DAR for GRPO)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Cap on validation prompts (a seeded sample across the split)."}
    )
    tiny_model: bool = field(
        default=False,
        metadata={
            "help": "Build a tiny random Qwen3 (tider.train.tiny) at model_name_or_path if it does not exist yet."
        },
    )
    tiny_hidden_size: int = 256
    tiny_num_layers: int = 4
    tiny_num_heads: int = 4
    tiny_vocab_size: int = 2048
    tiny_date_tokens: bool = field(default=True, metadata={"help": "Whole-date tokens for the data's date range."})
    tiny_lexical_init: bool = field(
        default=False,
        metadata={"help": "Input embeddings from all-MiniLM-L6-v2's word embeddings (tider.train.tiny)."},
    )
    tiny_structured_date_init: bool = field(
        default=False,
        metadata={"help": "Date-token embeddings = shared + year + month + day parts (tider.train.tiny)."},
    )
    wandb_project: str = field(
        default="tider", metadata={"help": "wandb project (offline unless WANDB_API_KEY is set)."}
    )
    retrieval_config: str | None = field(
        default=None,
        metadata={
            "help": "YAML/JSON of RetrievalConfig fields (configs/retrieval/default.yaml) for the memories the "
            "prompts and rewards search, e.g. another embedding_model; tider_locator.json records what shapes "
            "the prompt. Default: RetrievalConfig()."
        },
    )

    def retrieval(self):
        from tider.retrieval.config import RetrievalConfig

        return RetrievalConfig.load(self.retrieval_config) if self.retrieval_config else RetrievalConfig()

    def prompt_settings(self) -> PromptSettings:
        return PromptSettings(
            lines=LineConfig(max_lines=self.prompt_lines),
            max_prompt_tokens=self.max_prompt_tokens,
            system_prompt=self.prompt_system_message,
            question_words=self.prompt_question_words,
            options=self.prompt_options,
        )


@dataclass
class GRPOScriptArguments(LocatorScriptArguments):
    """GRPO-only options: rewards, DAR, and what the retrieval-based rewards use."""

    reward_funcs: list[str] = field(
        # The production recipe's list: evidence_advantage (coverage over the default source's on
        # the same question), not evidence_coverage, which a window spanning the whole memory
        # wins (docs/experiments.md, "rewards a shortcut cannot win").
        default_factory=lambda: ["format", "switch", "window_iou", "evidence_advantage", "answer_correct"],
        metadata={"help": "Reward names from tider.train.rewards; weights go in reward_weights (GRPOConfig)."},
    )
    dar: bool = field(
        default=True, metadata={"help": "Difficulty-aware resampling by gold-window count (TIDER Table 8)."}
    )
    dar_factor_0: float = 10.0
    dar_factor_1: float = 1.0
    dar_factor_2: float = 1.0
    dar_factor_3plus: float = 4.0
    retrieval_k: int = field(default=20, metadata={"help": "k for evidence_coverage / answer rewards (TIDER: 20)."})
    reward_default_source: str = field(
        default="top-days",
        metadata={
            "help": "Learning-free window source that evidence_advantage measures against (none, rules, top-day, "
            "top-days, ...): matching it earns nothing."
        },
    )
    proximity_tau: float = field(default=7.0, metadata={"help": "proximity reward scale, in granularity units."})
    reader_model: str | None = field(
        default=None,
        metadata={
            "help": "Reader for answer_correct: the served model name with reader_base_url, else a local checkpoint."
        },
    )
    reader_base_url: str | None = field(default=None, metadata={"help": "Reader endpoint for answer_correct."})
    reader_wait_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds to wait for the reader endpoint at start-up before failing with a clear error."},
    )
    reader_timeout: float = field(default=60.0, metadata={"help": "Seconds per reader request."})
    reader_max_tokens: int = field(
        default=64, metadata={"help": "Token budget of a reader answer (the prompt asks for a short one)."}
    )
    reader_max_retries: int = field(
        default=2, metadata={"help": "Retries per reader request; after them the completion gets no reward (None)."}
    )
    reader_thinking: bool = field(
        default=False,
        metadata={"help": "Let a Qwen3 reader think (chat template enable_thinking); off: the answer fits its budget."},
    )
    answer_samples: int = field(
        default=8,
        metadata={
            "help": "How the trained locator answers (recorded in tider_locator.json): 1 is greedy; more is a vote "
            "of that many completions at the rollout temperature, the policy GRPO trains."
        },
    )
    answer_min_votes: int = field(
        default=1, metadata={"help": "With answer_samples > 1: a window stays when this many completions name it."}
    )

    def decoding(self, temperature: float) -> dict:
        """The answer's decoding for the locator contract (``tider.locator.contract.Decoding``)."""
        from dataclasses import asdict

        from tider.locator.contract import Decoding

        return asdict(Decoding(self.answer_samples, temperature, self.answer_min_votes))

    @property
    def dar_factors(self) -> dict[str, float]:
        factors = (self.dar_factor_0, self.dar_factor_1, self.dar_factor_2, self.dar_factor_3plus)
        return dict(zip(WINDOW_BUCKETS, factors))


def sft_parser():
    from trl import ModelConfig, SFTConfig, TrlParser

    return TrlParser((LocatorScriptArguments, SFTConfig, ModelConfig))


def grpo_parser():
    from trl import GRPOConfig, ModelConfig, TrlParser

    return TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))


def parse_recipe(stage: str, argv: Sequence[str]):
    """``(script_args, training_args, model_args)`` for ``stage`` ("sft" or "grpo");
    ``argv`` is ``["--config", path, *overrides]``. Unknown keys raise ``ValueError``.
    ``dtype: auto`` is resolved here (``tider.hardware.resolve_dtype``), so the trainer
    sees a concrete dtype and a matching ``bf16`` flag."""
    parsers = {"sft": sft_parser, "grpo": grpo_parser}
    if stage not in parsers:
        raise ValueError(f"unknown training stage {stage!r}; known stages: {sorted(parsers)}")
    # A first pass reads dtype/use_cpu with bf16 off (so no bf16 check can fire yet).
    probe = parsers[stage]()
    probe.set_defaults(bf16=False)
    _, training_args, model_args = probe.parse_args_and_config(list(argv), fail_with_unknown_args=True)
    parser = parsers[stage]()
    # logged by the command once its log files exist (tider.commands.train)
    dtype = resolve_dtype(model_args.dtype, use_cpu=training_args.use_cpu, log=False)
    auto = model_args.dtype == "auto"
    if auto:
        # `dtype: auto`: bf16 mixed precision follows the hardware's dtype unless the recipe
        # or the command line sets `bf16` itself (TrlParser: config and argv beat defaults).
        parser.set_defaults(bf16=dtype == "bfloat16")
    script_args, training_args, model_args = parser.parse_args_and_config(list(argv), fail_with_unknown_args=True)
    model_args.dtype = dtype
    model_args.dtype_was_auto = auto
    return script_args, training_args, model_args


def check_generation_batch(training_args, num_processes: int) -> int:
    """The GRPO batch rule for a world of ``num_processes`` (e.g. an accelerate config's):
    the generation batch, ``per_device_train_batch_size * num_processes *
    steps_per_generation``, must hold whole groups of ``num_generations``. Returns it."""
    steps = training_args.steps_per_generation or training_args.gradient_accumulation_steps
    batch = training_args.per_device_train_batch_size * num_processes * steps
    if batch % training_args.num_generations != 0:
        raise ValueError(
            f"generation batch {batch} (= {training_args.per_device_train_batch_size} per device x {num_processes} "
            f"processes x {steps} steps) is not divisible by num_generations={training_args.num_generations}"
        )
    return batch

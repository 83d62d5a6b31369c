"""Build a tiny Qwen3 locally: a BPE tokenizer trained with `tokenizers` plus a randomly
initialised ``Qwen3ForCausalLM``. Tests, the CPU demo and the learning benchmark use it
because no weights can be downloaded here; production recipes name a Hub id instead.

The saved folder is a normal Hugging Face checkpoint (config, safetensors, tokenizer,
chat template, generation config), so TRL, peft, export and vLLM treat it like any Qwen3.

Dates: a tiny model copies dates far better when each ISO date is one token (measured
before this repository existed: exact dates 0% with single-digit tokens, 1-25% with
whole-date tokens), so ``date_tokens`` adds whole-date tokens (``2023-05-07``) to the
vocabulary.

``ensure_tiny_model`` builds it for a recipe that sets ``tiny_model``, from that recipe's
training data (tokenizer corpus and the dates it can mention).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tider.train.examples import PromptBuilder
    from tider.types import Dataset

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# Qwen-style ChatML. `enable_thinking=False` (Qwen3's switch, passed through
# chat_template_kwargs) writes the empty think block Qwen3 expects. Like Qwen3's own
# template, an assistant turn without a think block is rendered with an empty one, so an
# SFT completion ("<think>\n\n</think>\n\n{json}") continues exactly the prompt that
# GRPO and serving build with enable_thinking=False.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and '<think>' not in message['content'] %}<think>\n\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def iso_dates(first: date, last: date) -> list[str]:
    """Every ISO date from ``first`` to ``last`` inclusive."""
    return [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 2048, date_tokens: Iterable[str] = ()):
    """Byte-level BPE over ``corpus``; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one (as Qwen's tokenizer does): the "2" of a line tag "L2" and of an
    # answer {"entry": 2} are then the same token, which the locator copies.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    dates = sorted(set(date_tokens))
    if dates:
        fast.add_tokens(dates)  # whole-date tokens, matched before BPE
    fast.chat_template = CHAT_TEMPLATE
    return fast


def init_date_embeddings(model, tokenizer, date_tokens: Iterable[str], seed: int = 0) -> int:
    """Give each whole-date token the embedding ``(shared + year[Y] + month[M] + day[D]) / 2``
    (random parts at the embedding table's scale), so dates that share a year or month
    start close together; the pre-project notes measured faster date learning with it.
    Returns how many rows were set."""
    import torch

    table = model.get_input_embeddings().weight
    dim, scale = table.shape[1], float(table.detach().float().std())
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, torch.Tensor] = {}

    def part(key: str) -> torch.Tensor:
        if key not in parts:
            parts[key] = torch.randn(dim, generator=gen) * scale
        return parts[key]

    n = 0
    with torch.no_grad():
        for token in sorted(set(date_tokens)):
            y, m, d = token.split("-")
            row = tokenizer.convert_tokens_to_ids(token)
            vec = (part("shared") + part("y" + y) + part("m" + m) + part("d" + d)) / 2
            table[row] = vec.to(table.dtype)
            n += 1
    return n


def init_lexical_embeddings(model, tokenizer, skip: Iterable[str] = ()) -> int:
    """Pretrained lexical knowledge for a model trained from scratch: each token's input
    embedding becomes the mean of the all-MiniLM-L6-v2 word embeddings of its text's
    WordPiece pieces (the only pretrained weights offline here), projected onto the
    model's width by PCA and scaled to the table's spread. Words that MiniLM places close
    ("trip", "travel") start close. Tokens in ``skip`` (special, date tokens) keep theirs.
    Returns how many rows were set."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    from tider.retrieval.embed import default_model_path

    path = Path(default_model_path())
    pieces = AutoTokenizer.from_pretrained(path)
    word_table = load_file(str(path / "model.safetensors"))["embeddings.word_embeddings.weight"]
    skip = set(skip) | set(tokenizer.all_special_tokens)
    rows, vectors = [], []
    for token, row in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([token]).strip()
        ids = pieces(text, add_special_tokens=False)["input_ids"] if text and token not in skip else []
        if ids:
            rows.append(row)
            vectors.append(word_table[ids].mean(axis=0))
    table = model.get_input_embeddings().weight
    vecs = np.stack(vectors) - np.mean(vectors, axis=0)
    basis = np.linalg.svd(vecs, full_matrices=False)[2][: table.shape[1]]  # the top principal directions
    projected = vecs @ basis.T
    projected *= float(table.detach().float().std()) / (projected.std() + 1e-12)
    with torch.no_grad():
        table[torch.tensor(rows)] = torch.tensor(projected, dtype=table.dtype)
    return len(rows)


def build_tiny_qwen3(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    vocab_size: int = 2048,
    date_tokens: Iterable[str] = (),
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    structured_date_init: bool = False,
    lexical_init: bool = False,
) -> Path:
    """Train a tokenizer on ``corpus``, build a random Qwen3 around it, save both."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size, date_tokens=date_tokens)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",  # what the weights are; training and export choose their own dtype
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    if lexical_init:
        init_lexical_embeddings(model, tokenizer, skip=date_tokens)
    if structured_date_init:
        init_date_embeddings(model, tokenizer, date_tokens, seed=seed)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# Qwen3-1.7B's config.json, written here so that nothing is downloaded: the shapes
# scripts/gpu_smoke.sh rehearses the production path at, with random weights.
QWEN3_1_7B_SHAPES = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}


def build_qwen3_from_shapes(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    shapes: dict | None = None,
    *,
    dtype: str = "bfloat16",
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """A random-init Qwen3 of ``shapes`` (default Qwen3-1.7B's) around an existing local
    tokenizer (e.g. the shipped tiny one). The model's vocabulary may be larger than the
    tokenizer's, as Qwen3's own is (151,936 rows for 151,669 tokens)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    shapes = {**QWEN3_1_7B_SHAPES, **(shapes or {})}
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if shapes["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {shapes['vocab_size']} < the tokenizer's {len(tokenizer)} tokens")
    config = Qwen3Config(
        **shapes,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype=dtype,
    )
    torch.manual_seed(seed)
    with torch.device(device):  # a 1.7B initialisation takes seconds on a GPU, a minute on CPU
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_embedder(
    out_dir: str | Path, corpus: Iterable[str], *, vocab_size: int = 2000, hidden_size: int = 64, seed: int = 0
) -> Path:
    """A random-init sentence-transformer (WordPiece tokenizer trained on ``corpus``, a
    2-layer BERT, mean pooling, 256-token window) for runs that exercise the pipeline, not
    retrieval quality, where the all-MiniLM-L6-v2 package cannot travel (a lent GPU box gets
    64 MiB; the package is 83 MB). Name its folder as ``embedding_model``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    out = Path(out_dir)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    names = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), specials))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=256, **names)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=258,
    )
    BertModel(config).save_pretrained(out / "bert")
    tokenizer.save_pretrained(out / "bert")
    word = st_models.Transformer(str(out / "bert"), max_seq_length=256)
    pooling = st_models.Pooling(word.get_word_embedding_dimension(), "mean")
    SentenceTransformer(modules=[word, pooling]).save(str(out))
    return out


def date_range_tokens(dataset: Dataset, margin_days: int = 60) -> list[str]:
    """Every ISO date the data (messages and question times) can mention, with a margin
    for relative questions that point before the first message."""
    stamps = [m.timestamp for mem in dataset.memories.values() for m in mem] + [q.asked_at for q in dataset.queries]
    first, last = min(stamps).date(), max(stamps).date()
    return iso_dates(first - timedelta(days=margin_days), last + timedelta(days=margin_days))


def ensure_tiny_model(script_args, model_path: str, dataset: Dataset, builder: PromptBuilder) -> None:
    """Build the tiny Qwen3 at ``model_path`` unless a checkpoint is already there (so a
    resumed or repeated run keeps the same tokenizer and initial weights)."""
    from tider.data.splits import split_queries
    from tider.train.data import fixed_split
    from tider.train.examples import corpus_texts, sft_records

    if (Path(model_path) / "config.json").exists():
        return
    train_queries = split_queries(dataset, script_args.split_seed, **fixed_split(script_args))["train"]
    corpus = corpus_texts(dataset, train_queries, sft_records(train_queries, builder))
    dates = date_range_tokens(dataset) if script_args.tiny_date_tokens else []
    logger.info("building tiny Qwen3 at %s (%d corpus texts, %d date tokens)", model_path, len(corpus), len(dates))
    build_tiny_qwen3(
        model_path,
        corpus,
        vocab_size=script_args.tiny_vocab_size,
        date_tokens=dates,
        hidden_size=script_args.tiny_hidden_size,
        num_layers=script_args.tiny_num_layers,
        num_heads=script_args.tiny_num_heads,
        num_kv_heads=max(1, script_args.tiny_num_heads // 2),
        intermediate_size=2 * script_args.tiny_hidden_size,
        structured_date_init=script_args.tiny_structured_date_init and bool(dates),
        lexical_init=script_args.tiny_lexical_init,
    )

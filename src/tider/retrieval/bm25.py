"""BM25 over metadata-expanded message text (T-Mem Sec. 4.2).

Each message is indexed as its content plus the metadata it has (speaker/author,
channel, phase, topic, role), so "what did Alice say in #design" can match on author
and channel even when the content does not. Terms come from the store's lexical analysis
(``tider.retrieval.lexical``: words of 2+ characters, stop words removed, Snowball stems by
default), shared by both implementations and by the PostgreSQL backend, which is what
makes them comparable:

* ``bm25s`` (default): sparse, fast; ``method`` picks the BM25 variant.
* ``rank_bm25``: ``BM25Okapi``, the parity reference. ``bm25s`` with
  ``method="robertson"`` scores like ``BM25Okapi`` (tests check identical rankings).

Saved without pickle: the bm25s arrays/JSON via ``BM25.save`` plus our tokenised corpus
and the analysis's id as JSON (rank-bm25 is rebuilt from it on load).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from tider.retrieval.lexical import PLAIN_WORDS, LexicalAnalysis
from tider.types import Message

BACKENDS = ("bm25s", "rank_bm25")
DEFAULT_ANALYSIS = LexicalAnalysis()


def tokenize(text: str) -> list[str]:
    """Unstemmed words of 2+ characters, English stop words out: the keywords the locator's
    timeline lines show (``tider.locator.lines``), which must stay what it trained on."""
    return PLAIN_WORDS.terms(text)


def expand_message(message: Message, fields: Iterable[str] = ("speaker", "channel", "phase", "topic", "role")) -> str:
    """Content plus the metadata fields the message has."""
    meta = [str(v) for f in fields if (v := getattr(message, f, None)) not in (None, "")]
    return " ".join([message.text, *meta])


class BM25Index:
    """Full-score BM25 over a fixed corpus. ``scores(query)`` -> ``(n,)`` float32."""

    def __init__(
        self,
        token_lists: Sequence[Sequence[str]],
        backend: str = "bm25s",
        method: str = "lucene",
        analysis: LexicalAnalysis = DEFAULT_ANALYSIS,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"unknown BM25 backend {backend!r}; known: {BACKENDS}")
        self.backend, self.method, self.analysis = backend, method, analysis
        self.token_lists = [list(t) for t in token_lists]
        self.n = len(self.token_lists)
        if backend == "bm25s":
            import bm25s

            self._model = bm25s.BM25(method=method)
            # bm25s rejects an all-empty corpus; a placeholder token keeps shapes right.
            self._model.index([t or ["\x00"] for t in self.token_lists], show_progress=False)
            self._vocab = self._model.vocab_dict
        else:
            from rank_bm25 import BM25Okapi

            self._model = BM25Okapi([t or ["\x00"] for t in self.token_lists])

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        backend: str = "bm25s",
        method: str = "lucene",
        analysis: LexicalAnalysis = DEFAULT_ANALYSIS,
    ) -> BM25Index:
        return cls([analysis.terms(t) for t in texts], backend=backend, method=method, analysis=analysis)

    @classmethod
    def from_messages(
        cls,
        messages: Sequence[Message],
        fields=("speaker", "channel", "phase", "topic", "role"),
        backend: str = "bm25s",
        method: str = "lucene",
        analysis: LexicalAnalysis = DEFAULT_ANALYSIS,
    ) -> BM25Index:
        texts = [expand_message(m, fields) for m in messages]
        return cls.from_texts(texts, backend=backend, method=method, analysis=analysis)

    def scores(self, query: str | Sequence[str]) -> np.ndarray:
        """Scores of every document; a string query goes through the index's own analysis."""
        tokens = self.analysis.terms(query) if isinstance(query, str) else list(query)
        if self.backend == "bm25s":
            tokens = [t for t in tokens if t in self._vocab]
            if not tokens:
                return np.zeros(self.n, dtype=np.float32)
            return np.asarray(self._model.get_scores(tokens), dtype=np.float32)
        if not tokens:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self._model.get_scores(tokens), dtype=np.float32)

    def search(self, query: str | Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(ids, scores)``, best first; ties broken by lower id."""
        s = self.scores(query)
        k = min(k, self.n)
        top = np.argpartition(-s, k - 1)[:k] if 0 < k < self.n else np.arange(self.n)
        top = top[np.lexsort((top, -s[top]))][:k]
        return top, s[top]

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {"backend": self.backend, "method": self.method, "n": self.n}
        meta["analysis"] = {"language": self.analysis.language, "stemmer": self.analysis.stemmer}
        (directory / "bm25_meta.json").write_text(json.dumps(meta))
        (directory / "bm25_tokens.json").write_text(json.dumps(self.token_lists))
        if self.backend == "bm25s":
            self._model.save(str(directory / "bm25s"), allow_pickle=False, show_progress=False)

    @classmethod
    def load(cls, directory: str | Path) -> BM25Index:
        directory = Path(directory)
        meta = json.loads((directory / "bm25_meta.json").read_text())
        tokens = json.loads((directory / "bm25_tokens.json").read_text())
        # an index saved before analyses were recorded holds plain words
        analysis = LexicalAnalysis(**meta["analysis"]) if "analysis" in meta else PLAIN_WORDS
        if meta["backend"] != "bm25s":
            return cls(tokens, backend=meta["backend"], method=meta["method"], analysis=analysis)
        import bm25s

        index = cls.__new__(cls)
        index.backend, index.method, index.token_lists, index.n = "bm25s", meta["method"], tokens, meta["n"]
        index.analysis = analysis
        index._model = bm25s.BM25.load(str(directory / "bm25s"), allow_pickle=False)
        index._vocab = index._model.vocab_dict
        return index

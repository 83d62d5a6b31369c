"""The lexical analysis: how a text becomes BM25 terms, the same in every backend.

A term is a word of ``tider.text.words`` (2+ characters, lower case), not on the
language's stop list (checked on the surface form, which is what the lists hold), then
reduced to its Snowball stem (PyStemmer, the stemmer bm25s itself supports): "decided",
"decides" and "decision" stop being strangers to "decide". The embedded store indexes
these terms with bm25s; the PostgreSQL backend stores the very same terms as its
postings (``tider.memory.pg.write``), so the two rank the same text the same way.

Why stems: measured on real conversations no developer has (502 LoCoMo-style questions),
stems alone raised recall@20 of the no-window retriever from .496 to .532; PostgreSQL's
English lexemes had done the same on LoCoMo dev (docs/experiments.md). ``stemmer="none"``
is the analysis every store was built with before (plain words): a store records its
analysis (``LexicalAnalysis.id``) and refuses to be searched with another one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

from tider.text import words

STEMMERS = ("snowball", "none")
# bm25s's stop lists, by Snowball language name
_STOPWORD_LISTS = {
    "english": "STOPWORDS_EN",
    "danish": "STOPWORDS_DANISH",
    "dutch": "STOPWORDS_DUTCH",
    "french": "STOPWORDS_FRENCH",
    "german": "STOPWORDS_GERMAN",
    "italian": "STOPWORDS_ITALIAN",
    "norwegian": "STOPWORDS_NORWEGIAN",
    "portuguese": "STOPWORDS_PORTUGUESE",
    "russian": "STOPWORDS_RUSSIAN",
    "spanish": "STOPWORDS_SPANISH",
    "swedish": "STOPWORDS_SWEDISH",
    "turkish": "STOPWORDS_TURKISH",
}
LANGUAGES = tuple(sorted(_STOPWORD_LISTS))


@cache
def stopwords(language: str) -> frozenset[str]:
    import bm25s.stopwords

    return frozenset(getattr(bm25s.stopwords, _STOPWORD_LISTS[language]))


_STEMMERS = threading.local()  # a PyStemmer object is not safe to share between threads


def _stemmer(language: str):
    cache = _STEMMERS.__dict__.setdefault("by_language", {})
    if language not in cache:
        import Stemmer

        cache[language] = Stemmer.Stemmer(language)
    return cache[language]


@dataclass(frozen=True)
class LexicalAnalysis:
    """Stop words out, then stems (``stemmer="snowball"``) or the words as they are."""

    language: str = "english"
    stemmer: str = "snowball"

    def __post_init__(self) -> None:
        if self.language not in _STOPWORD_LISTS:
            raise ValueError(f"lexical language {self.language!r} has no stop list here; known: {LANGUAGES}")
        if self.stemmer not in STEMMERS:
            raise ValueError(f"lexical stemmer {self.stemmer!r} unknown; known: {STEMMERS}")

    @property
    def id(self) -> str:
        """What a store records: a changed analysis is a different index."""
        return f"words2-stop-{self.language}" + (f"-snowball-{self.language}" if self.stemmer == "snowball" else "")

    def terms(self, text: str) -> list[str]:
        """The BM25 terms of ``text``, in order (a repeated word repeats)."""
        found = words(text, stopwords=stopwords(self.language), min_chars=2)
        if self.stemmer == "none" or not found:
            return found
        return _stemmer(self.language).stemWords(found)


PLAIN_WORDS = LexicalAnalysis(stemmer="none")  # the analysis of stores built before stems

"""Lexical units shared by the heuristic relation classifier and span compression:
``tider.text.words`` without stop words, and the smoothed IDF of Eq. 6."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from tider.text import words

STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "they",
        "this",
        "to",
        "too",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yes",
        "just",
        "also",
        "about",
        "up",
        "out",
        "very",
        "can",
        "could",
        "should",
    ]
    # what is left of a contraction ("it's", "don't", "I'm") once the apostrophe splits it
    + ["s", "t", "m", "d", "ll", "re", "ve"]
)


def units(text: str) -> set[str]:
    return set(words(text, stopwords=STOPWORDS))


class IDF:
    """Smoothed IDF ``log((N+1)/(df+1)) + 1`` over a corpus of messages (Eq. 6)."""

    def __init__(self, texts: Iterable[str]):
        df: Counter = Counter()
        n = 0
        for text in texts:
            n += 1
            df.update(units(text))
        self.n = n
        self.df = df

    def __call__(self, unit: str) -> float:
        return math.log((self.n + 1) / (self.df.get(unit, 0) + 1)) + 1.0

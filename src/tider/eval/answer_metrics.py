"""LoCoMo-style answer token F1.

- normalise: lower case, drop punctuation and the articles a/an/the, collapse spaces
  (LoCoMo also Porter-stems tokens; we do not, to avoid an NLTK dependency, so our F1
  is slightly stricter on inflections);
- multi-hop (category "1"/"multi-hop"): the gold answer is split on commas into parts;
  each part takes its best F1 against the comma-split prediction parts; the mean counts;
- adversarial (category "5"/"adversarial"): 1.0 when the prediction abstains (contains
  one of ``ABSTENTION_PHRASES``), else 0.0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Optional

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
ABSTENTION_PHRASES = ("no information available", "not mentioned", "no information", "not available",
                      "cannot be determined", "unknown", "not specified", "does not mention", "no mention")
MULTI_HOP = {"1", "multi-hop"}
ADVERSARIAL = {"5", "adversarial"}


def normalize_answer(text: str) -> str:
    text = str(text).lower().replace(",", " ").translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    preds = [p for p in str(prediction).split(",") if p.strip()] or [""]
    golds = [g for g in str(gold).split(",") if g.strip()] or [""]
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def is_abstention(prediction: str) -> bool:
    text = normalize_answer(prediction)
    return any(phrase in text for phrase in ABSTENTION_PHRASES)


def answer_f1(prediction: str, gold: Optional[str], category: Optional[str]) -> float:
    """F1 of ``prediction`` for a query of ``category`` (see module docstring)."""
    category = str(category) if category is not None else ""
    if category in ADVERSARIAL:
        return float(is_abstention(prediction))
    if gold is None:
        return 0.0
    if category in MULTI_HOP:
        return multi_answer_f1(prediction, gold)
    return token_f1(prediction, gold)

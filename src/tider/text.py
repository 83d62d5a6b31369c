"""Words of a text: the one tokenizer behind BM25, the timeline's keywords, the forest's
lexical units and IDF, and the query entities span compression protects.

A word is a maximal run of word characters (``\\w+``, Unicode letters and digits), so the
same text yields the same words wherever it is matched; each user picks its stop words and
minimum length. Answer scoring is the one exception: it normalises the LoCoMo way (strip
punctuation, drop articles) so F1 stays comparable with published LoCoMo numbers
(``tider.scoring.answer_tokens``).
"""

from __future__ import annotations

import re
from collections.abc import Collection

_WORD = re.compile(r"\w+")


def words(text: str, *, stopwords: Collection[str] = (), min_chars: int = 1, lower: bool = True) -> list[str]:
    """The words of ``text`` in order (lower-cased unless ``lower=False``), without
    ``stopwords`` and words shorter than ``min_chars``."""
    found = _WORD.findall(text.lower() if lower else text)
    return [w for w in found if len(w) >= min_chars and (w.lower() if not lower else w) not in stopwords]

"""``MemoryBase.context``: the evidence-forest back end (T-Mem) behind one call.

search seeds R_k(q) -> evidence utility selection inside the predicted windows (needs an
LLM client; skipped without one, or when the prediction has no windows) -> UPDATE /
EXPAND / ROOT structuring (the LLM classifier with a client, else the lexical one) ->
IDF span compression to ``budget`` tokens and linearization (``forest.linearize.fit_forest``,
the function ``tider eval qa`` uses). Returns the reader-ready text and what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tider.types import Window, WindowPrediction

# The defaults of ``context`` and of ``tider eval qa`` (``QAConfig``), which builds the same context.
TOP_N = 100  # candidates per window sent to evidence selection
BUDGET = 8192  # context budget B in tokens


def past_windows(windows, asked_at, past_only: bool = True) -> list[Window]:
    """``windows`` cut at ``asked_at`` (those that start after it dropped): evidence
    selection looks only where the retriever may (``RetrievalConfig.past_only``)."""
    if not past_only or asked_at is None:
        return list(windows)
    return [w.clip_end(asked_at) for w in windows if w.start <= asked_at]


@dataclass
class MemoryContext:
    text: str  # the linearized forest, within budget
    keys: list[str]  # message keys in the context, in linearized order
    positions: list[int]
    prediction: WindowPrediction
    tokens: int
    over_budget: bool
    selection_errors: int = 0


def build_context(
    mem,
    text: str,
    asked_at,
    user: str | None,
    k: int | None,
    windows,
    llm,
    budget: int,
    top_n: int,
    classifier: str | None,
) -> MemoryContext:
    from tider.forest.compress import IDF, whitespace_tokens
    from tider.forest.linearize import fit_forest
    from tider.forest.select import select_evidence
    from tider.forest.structure import LLMRelationClassifier, build_forest, make_classifier

    memory = mem.messages()
    g = memory.granularity
    query = mem.query(text, asked_at, user)
    prediction = mem.predict(query, windows)
    seeds, _, _ = mem.rank(query, prediction, mem.config.k if k is None else k)
    ids, errors = [int(i) for i in seeds], 0
    windows_used = past_windows(prediction.windows if prediction.temporal else (), query.asked_at, mem.config.past_only)
    if llm is not None and windows_used and len(ids):
        vector = mem.embed_queries([text])[0]
        # the dense channel's score, a long message's best chunk's (either backend)
        similarity = lambda _text, cand: mem.dense_scores_at(vector, list(cand))
        result = select_evidence(query, memory, ids, windows_used, llm, similarity, top_n)
        ids, errors = result.ids, result.errors
    name = classifier or ("llm" if llm is not None else "lexical")
    relations = LLMRelationClassifier(llm) if name == "llm" else make_classifier(name)
    forest, _ = build_forest(text, user, [memory[i] for i in ids], relations, g)
    fitted = fit_forest(forest, text, IDF(m.text for m in memory), budget, whitespace_tokens, g)
    positions = [r.message_id for r in fitted.rows]
    return MemoryContext(
        fitted.text,
        [memory[i].key for i in positions],
        positions,
        prediction,
        whitespace_tokens(fitted.text),
        fitted.compression.over_budget,
        errors,
    )

"""``tider eval qa``: window source -> dual-channel retrieval -> forest back end -> reader
-> judge, stage-wise and resumable (T-Mem App. D) on ``tider.eval.runner.StageRunner``.

Stages, per window source W and context kind C (``flat`` | ``forest``), one JSONL each:

    retrieve-W      window prediction + top-k seeds R_k(q)              (no LLM)
    select-W        evidence utility selection, R'(q) = seeds + KEY/SUPPORT  (LLM "select")
    structure-W     UPDATE/EXPAND/ROOT forest over R'(q)                 (LLM "structure" or lexical)
    compress-W-C    context under budget B: forest = span compression + Eq. 8 linearization,
                    flat = rank-ordered list truncated to B; ``compression="truncate"`` is
                    the "w/o compression" ablation for the forest too
    answer-W-C      reader, App. I prompt for C                          (LLM "answer")
    judge-W-C       judge verdict (App. I) + LoCoMo token F1             (LLM "judge")

A persistent LLM failure (no JSON, schema mismatch, empty output, transport) is a typed
error inside a ``partial`` record: this run goes on with it (selection falls back to the
seeds, structuring leaves the child a root, a failed answer or an unparsable verdict
counts as incorrect) and the report counts all of them; the next run retries exactly
those records, and the input fingerprints redo whatever was built from them downstream.
Every prompt goes through the ``LeakageValidator``; any leak fails the run. Each record
stores the tokens its LLM calls spent, so the report's per-stage token table (T-Mem
Table 6 style) survives resumes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np

from tider import scoring
from tider.eval.leakage import LeakageValidator
from tider.eval.qa_config import STAGES, QAConfig
from tider.eval.runner import Stage, StageRunner, fingerprint_of
from tider.forest.compress import IDF, truncate_to_budget, whitespace_tokens
from tider.forest.linearize import fit_forest, forest_rows, render_flat, render_forest, rows_to_json
from tider.forest.prompts import (
    READER_SYSTEM,
    SELECTION_SYSTEM,
    STRUCTURING_SYSTEM,
    judge_messages,
    parse_verdict,
    reader_messages,
    render_message,
)
from tider.forest.select import select_evidence
from tider.forest.structure import Forest, LLMRelationClassifier, build_forest, make_classifier
from tider.llm.jsonout import strip_think
from tider.memory.context import past_windows
from tider.types import Dataset, Query, Window, window_bucket

ADVERSARIAL_GOLD = "Not mentioned in the conversation"


def qa_queries(dataset: Dataset, config: QAConfig) -> list[Query]:
    keep = set(config.memory_keys) if config.memory_keys is not None else None
    skip = set(map(str, config.exclude_categories))
    out = [q for q in dataset.queries if str(q.category) not in skip and (keep is None or q.memory_key in keep)]
    return out[: config.limit] if config.limit is not None else out


def _spent(client, stage: str, fn: Callable[[], dict]) -> dict:
    """Run ``fn`` and attach the tokens/calls/errors ``client`` spent on ``stage`` meanwhile
    (stages run one item at a time, so the difference belongs to this record)."""
    before = client.usage_by_stage().get(stage, {}) if client is not None else {}
    record = fn()
    after = client.usage_by_stage().get(stage, {}) if client is not None else {}
    record["llm"] = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in ("calls", "cached_calls", "errors", "attempts", "prompt_tokens", "completion_tokens")
    }
    return record


class QARun:
    def __init__(
        self,
        dataset: Dataset,
        config: QAConfig,
        reader,
        judge,
        selector=None,
        count_tokens: Callable[[str], int] | None = None,
        store=None,
    ):
        from tider.memory import MemoryCollection

        self.dataset, self.config = dataset, config
        self.reader, self.judge, self.selector = reader, judge, selector or reader
        self.count_tokens = count_tokens or whitespace_tokens
        self.store = store or MemoryCollection(dataset.memories, config.retrieval)
        self.validator = LeakageValidator(dataset.memories)
        self.idf = {k: IDF(m.text for m in mem) for k, mem in dataset.memories.items()}
        self.classifier = (
            LLMRelationClassifier(self.selector, max_tokens=config.structure_max_tokens)
            if config.classifier == "llm"
            else make_classifier(config.classifier)
        )
        self.records: dict[str, dict[str, dict]] = {}

    # ------------------------------------------------------------------ stages
    def retrieve_stage(self, window_name: str, context: dict) -> Stage:
        from tider.locator.sources import make_source_from_context

        source = make_source_from_context(window_name, context)
        g = self.dataset.granularity

        locator_client = getattr(source, "client", None)  # model-backed sources (locator, prompted)

        def run(query: Query) -> dict:
            public = query.public()  # nothing on the inference path sees gold

            def call() -> dict:
                pred = source.predict(public, self.store)
                self._check_locator_prompt(source, query)
                ids, scores = self.store.retrieve(public, pred, self.config.k)
                # Exact window bounds too: a day-granularity rendering loses the end of day.
                exact = [[w.start.isoformat(), w.end.isoformat()] for w in pred.windows] if pred.temporal else []
                return {
                    "prediction": pred.to_json(g),
                    "windows_exact": exact,
                    "ids": ids.tolist(),
                    "scores": [float(s) for s in scores],
                }

            return _spent(locator_client if hasattr(locator_client, "usage_by_stage") else None, "locator", call)

        return Stage(f"retrieve-{window_name}", run)

    def _check_locator_prompt(self, source, query: Query) -> None:
        """Leak-check the prompt a chat-backed source just sent; its allowed (public) parts are
        the pieces the prompt builder rendered from the public query and the memory."""
        outcomes, inputs = getattr(source, "last_outcomes", None), getattr(source, "last_inputs", None)
        if not outcomes or not outcomes[-1].messages or not inputs:
            return
        from tider.locator.prompt import system_prompt

        self.validator.check_prompt(
            query,
            "locator",
            outcomes[-1].messages,
            allowed_parts=list(inputs[-1].parts),
            template_text=system_prompt(self.dataset.granularity, options=True),  # either form
        )

    def select_stage(self, w: str) -> Stage:
        retrieved = self.records[f"retrieve-{w}"]

        def run(query: Query) -> dict:
            rec = retrieved[query.key]
            seeds = rec["ids"]
            pred = rec["prediction"]
            windows = [Window(_t(a), _t(b)) for a, b in rec["windows_exact"]] if pred["temporal"] else []
            windows = past_windows(windows, query.asked_at, self.config.retrieval.past_only)
            if not (self.config.selection and windows):
                return {"ids": seeds, "windows": [], "errors": 0, "invalid_ids": 0}
            public, memory = query.public(), self.store.messages(query.memory_key)
            ranked = self.store.ranking(public, mode="dense")  # T-Mem: embedding preselection
            sim = np.zeros(len(memory), dtype=np.float32)
            sim[ranked.ids] = ranked.sim
            similarity = lambda text, ids: sim[list(ids)]

            def call() -> dict:
                result = select_evidence(
                    public,
                    memory,
                    seeds,
                    windows,
                    self.selector,
                    similarity,
                    self.config.top_n,
                    self.config.select_max_tokens,
                )
                self._check_selection_prompts(query, memory, windows, result)
                return {
                    "ids": result.ids,
                    "windows": [asdict(x) for x in result.windows],
                    "errors": result.errors,
                    "invalid_ids": sum(x.invalid_ids for x in result.windows),
                }

            return _spent(self.selector, "select", call)

        return Stage(f"select-{w}", run, retry_if=lambda rec: rec["errors"] > 0)

    def _check_selection_prompts(self, query: Query, memory, windows, result) -> None:
        """Leak-check the selection prompts as sent. Allowed: each window's line (window-source
        output) and its candidate messages, which must lie inside the predicted windows."""
        g = self.dataset.granularity
        in_windows = {i for w in windows for i in range(*memory.id_range(w))}
        for sel, sent in zip(result.windows, result.prompts):
            allowed = [render_message(memory[i], g) for i in sel.candidates]
            allowed.append(f"Topic-time window: {sel.window['start']} .. {sel.window['end']}")
            self.validator.check_prompt(
                query,
                "select",
                sent,
                allowed_parts=allowed,
                context_ids=sel.candidates,
                produced_ids=in_windows,
                template_text=SELECTION_SYSTEM,
            )

    def structure_stage(self, w: str) -> Stage:
        selected = self.records[f"select-{w}"]
        g = self.dataset.granularity

        def run(query: Query) -> dict:
            public, memory = query.public(), self.store.messages(query.memory_key)
            msgs = [memory[i] for i in selected[query.key]["ids"]]

            def call() -> dict:
                forest, judgements = build_forest(public.text, public.user, msgs, self.classifier, g)
                # Allowed in the prompts as sent: the selected messages (retrieval/selection output).
                allowed = [render_message(m, g) for m in msgs]
                for sent in (j.prompt for j in judgements if j.prompt):
                    self.validator.check_prompt(
                        query, "structure", sent, allowed_parts=allowed, template_text=STRUCTURING_SYSTEM
                    )
                return {
                    "forest": forest.to_json(),
                    "classifier": self.classifier.name,
                    "errors": sum(j.error is not None for j in judgements),
                    "pairs": len(judgements),
                }

            return _spent(self.selector if self.config.classifier == "llm" else None, "structure", call)

        return Stage(f"structure-{w}", run, retry_if=lambda rec: rec["errors"] > 0)

    def compress_stage(self, w: str, c: str) -> Stage:
        selected = self.records[f"select-{w}"]
        g, budget = self.dataset.granularity, self.config.budget

        def run(query: Query) -> dict:
            memory = self.store.messages(query.memory_key)
            ids = selected[query.key]["ids"]
            if c == "flat":
                text = truncate_to_budget(render_flat([memory[i] for i in ids], g), budget, self.count_tokens)
                kept = ids[: len(text.splitlines())] if text else []
                return {"context": text, "context_ids": kept, "tokens": self.count_tokens(text), "over_budget": False}
            structured = self.records[f"structure-{w}"][query.key]["forest"]
            forest = Forest.from_json(structured, {i: memory[i] for i in ids})
            if self.config.compression == "truncate":
                text = truncate_to_budget(render_forest(forest_rows(forest, g)), budget, self.count_tokens)
                return {"context": text, "context_ids": ids, "tokens": self.count_tokens(text), "over_budget": False}
            fitted = fit_forest(forest, query.public().text, self.idf[query.memory_key], budget, self.count_tokens, g)
            comp, text = fitted.compression, fitted.text
            return {
                "context": text,
                "context_ids": [r.message_id for r in fitted.rows],
                "rows": rows_to_json(fitted.rows),
                "tokens": self.count_tokens(text),
                "span_tokens": comp.retained_tokens(),
                "metadata_tokens": fitted.metadata_tokens,
                "over_budget": comp.over_budget,
                "omitted_spans": comp.omitted,
            }

        return Stage(f"compress-{w}-{c}", run)

    def answer_stage(self, w: str, c: str) -> Stage:
        contexts, selected = self.records[f"compress-{w}-{c}"], self.records[f"select-{w}"]

        def run(query: Query) -> dict:
            public, ctx = query.public(), contexts[query.key]
            messages = reader_messages(c, public.text, public.user, ctx["context"])
            self.validator.check_prompt(
                query,
                "answer",
                messages,
                allowed_parts=[ctx["context"]],
                context_ids=ctx["context_ids"],
                produced_ids=selected[query.key]["ids"],
                template_text=READER_SYSTEM[c],
            )

            def call() -> dict:
                # A reply that is only a <think> block is empty: retried like any empty output.
                result = self.reader.chat(
                    messages,
                    stage="answer",
                    max_tokens=self.config.answer_max_tokens,
                    temperature=self.config.answer_temperature,
                    seed=self.config.seed,
                    check=lambda text: None if strip_think(text).strip() else "empty_output",
                )
                return {"answer": strip_think(result.text).strip(), "error": result.error}

            return _spent(self.reader, "answer", call)

        return Stage(f"answer-{w}-{c}", run, retry_if=lambda rec: rec["error"] is not None)

    def judge_stage(self, w: str, c: str) -> Stage:
        answers = self.records[f"answer-{w}-{c}"]

        def run(query: Query) -> dict:
            rec = answers[query.key]
            gold = query.gold
            adversarial = str(query.category) in ("5", "adversarial")
            gold_answer = ADVERSARIAL_GOLD if adversarial else (gold.answer or "")
            base = {
                "category": str(query.category),
                "bucket": window_bucket(len(gold.windows)),
                "f1": scoring.answer_f1(rec["answer"], gold.answer, query.category),
            }
            if rec["error"] is not None or not rec["answer"]:
                return {**base, "correct": False, "verdict": None, "error": "no_answer", "llm": {}}

            def call() -> dict:
                result = self.judge.chat(
                    judge_messages(query.text, gold_answer, rec["answer"]),
                    stage="judge",
                    max_tokens=self.config.judge_max_tokens,
                    temperature=self.config.judge_temperature,
                    seed=self.config.seed,
                    check=lambda text: None if parse_verdict(text) is not None else "no_verdict",
                )
                verdict = parse_verdict(result.text) if result.error is None else None
                error = result.error
                return {**base, "correct": bool(verdict), "verdict": verdict, "error": error}

            return _spent(self.judge, "judge", call)

        return Stage(f"judge-{w}-{c}", run, retry_if=lambda rec: rec.get("error") not in (None, "no_answer"))

    # --------------------------------------------------------------------- run
    def run(self, runner: StageRunner, queries: Sequence[Query], progress: bool = True) -> dict:
        from tider.locator.sources import gold_predictions

        self.store.prepare([q.public() for q in queries])
        context = {
            "store": self.store,
            "gold_by_key": gold_predictions(queries),
            "source_options": self.config.source_options,
        }
        key = lambda q: q.key
        wanted = set(STAGES[: STAGES.index(self.config.until) + 1])
        for w in self.config.windows:
            self._run(runner, self.retrieve_stage(w, context), queries, key, progress)
            if "select" in wanted:
                self._run(runner, self.select_stage(w), queries, key, progress, upstream=[f"retrieve-{w}"])
            if "structure" in wanted and "forest" in self.config.contexts:
                self._run(runner, self.structure_stage(w), queries, key, progress, upstream=[f"select-{w}"])
            for c in self.config.contexts:
                # Each stage names the records it is built from (its input fingerprint).
                inputs = {
                    "compress": [f"select-{w}"] + ([f"structure-{w}"] if c == "forest" else []),
                    "answer": [f"compress-{w}-{c}"],
                    "judge": [f"answer-{w}-{c}"],
                }
                for name, make in (
                    ("compress", self.compress_stage),
                    ("answer", self.answer_stage),
                    ("judge", self.judge_stage),
                ):
                    if name in wanted:
                        self._run(runner, make(w, c), queries, key, progress, upstream=inputs[name])
        return self.records

    def _run(self, runner: StageRunner, stage: Stage, queries, key, progress, upstream=()) -> None:
        fingerprint = None
        if upstream:
            sources = [self.records[name] for name in upstream]
            fingerprint = lambda q: fingerprint_of(*(src.get(q.key) for src in sources))
        self.records[stage.name] = runner.run(stage, queries, key=key, progress=progress, fingerprint=fingerprint)
        (runner.out_dir / "leaks.json").write_text(json.dumps([l.to_json() for l in self.validator.leaks], indent=1))
        self.validator.raise_if_leaks()
        runner.raise_if_failed(stage.name)


def _t(text: str):
    from datetime import datetime

    return datetime.fromisoformat(text)


def run_qa_eval(
    dataset: Dataset,
    config: QAConfig,
    out_dir,
    reader,
    judge,
    selector=None,
    *,
    data_path: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    count_tokens: Callable[[str], int] | None = None,
    tokenizer_name: str = "whitespace",
) -> dict:
    """Run (or resume) a QA evaluation into ``out_dir``; returns the report dict."""
    from tider.eval.qa_report import build_qa_report, write_qa_report

    queries = qa_queries(dataset, config)
    if not queries:
        raise ValueError(f"dataset {dataset.name!r}: no queries left to evaluate after filtering")
    selector = selector or reader
    config.require_clients(reader=reader, judge=judge, selector=selector)
    clients = {"reader": _name_of(reader), "judge": _name_of(judge), "selector": _name_of(selector)}
    manifest = config.manifest(dataset.name, data_path, len(queries), clients, tokenizer_name)
    runner = StageRunner(out_dir, manifest, overwrite=overwrite)
    qa = QARun(dataset, config, reader, judge, selector, count_tokens)
    records = qa.run(runner, queries, progress)
    report = build_qa_report(
        records,
        config.windows,
        config.contexts,
        len(queries),
        gold_ids={q.key: list(q.gold.evidence_ids) for q in queries},
    )
    report["variant"] = {
        "classifier": config.classifier,
        "compression": config.compression,
        "budget": config.budget,
        "selection": config.selection,
        "k": config.k,
        "top_n": config.top_n,
    }
    usage_of = lambda client: client.usage_by_stage() if client is not None else {}
    report.update(
        dataset=dataset.name,
        leak_checks=qa.validator.checked,
        leaks=len(qa.validator.leaks),
        reader=_name_of(reader),
        judge=_name_of(judge),
        tokenizer=tokenizer_name,
        llm_usage_this_process={"reader": usage_of(reader), "judge": usage_of(judge), "selector": usage_of(selector)},
    )
    write_qa_report(report, out_dir)
    return report


def _name_of(client) -> str | None:
    return client.model if client is not None else None

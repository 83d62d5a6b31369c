"""Shared test fixtures. Keep additions additive: several test modules depend on these."""

from __future__ import annotations

import os

import pytest

# The recipe tests' session fixtures: one chain of test-size models for tests/test_recipes*.py.
from recipetesting import real_like, recipe_data, recipe_work, tiny_pretrain, tiny_pretrain_answer, tiny_sft  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TINY_CORPUS = [
    "Alice went to the book club on 2023-05-07 and felt inspired.",
    "Bob repainted the office kitchen last year.",
    '{"temporal": true, "windows": [{"start": "2023-05-01", "end": "2023-05-08"}]}',
    '{"temporal": false, "windows": []}',
    '{"key": [1, 2], "support": [3]}',
    '{"relation": "UPDATE", "confidence": 0.8}',
    "Answer the question using the context. Final: Correct Final: Incorrect",
    "When did Alice move to Lisbon? She moved two years ago.",
]


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny random Qwen3 checkpoint built locally (no downloads): tokenizer + weights."""
    from datetime import date

    from tider.train.tiny import build_tiny_qwen3, iso_dates

    out = tmp_path_factory.mktemp("tiny-qwen3")
    return build_tiny_qwen3(
        out,
        _TINY_CORPUS * 20,
        vocab_size=600,
        date_tokens=iso_dates(date(2023, 1, 1), date(2023, 12, 31)),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
    )


DECIDED_ON = "2023-03-15"  # the day every question of the fixed-window data points at


def write_fixed_window_data(out):
    """A crowded JSONL benchmark whose every question has its evidence on one day: five
    topics, each reported in the same words every second day of 150, in three memories;
    only the report of 2023-03-15 is the evidence, and every question names that date (a
    cue that resolves to the day, so every training target is the same answer: cue 1).
    Semantically the reports tie, so the semantic channel's top 20 holds earlier ones; a
    window on that day finds the evidence."""
    import json
    from datetime import datetime, timedelta
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    topics = ["the venue", "the budget", "the launch date", "the hiring plan", "the offsite menu"]
    messages, queries = [], []
    for memory, start in (
        ("alpha", datetime(2023, 1, 2)),
        ("beta", datetime(2023, 1, 4)),
        ("gamma", datetime(2023, 1, 6)),
    ):
        for d in range(0, 150, 2):
            day = start + timedelta(days=d, hours=10)
            for j, topic in enumerate(topics):
                messages.append(
                    {
                        "memory": memory,
                        "key": f"{memory}-{day:%m%d}-{j}",
                        "text": f"we decided {topic} today",
                        "timestamp": day.isoformat(),
                        "speaker": ["ann", "bo"][j % 2],
                    }
                )
        for j, topic in enumerate(topics):
            evidence = f"{memory}-ev-{j}"
            messages.append(
                {
                    "memory": memory,
                    "key": evidence,
                    "text": f"we decided {topic} today",
                    "timestamp": f"{DECIDED_ON}T15:00:00",
                    "speaker": "ann",
                }
            )
            phrases = ("What did we decide about {t} on March 15, 2023?", "What was settled on {t} on 15 March 2023?")
            for r, phrase in enumerate(phrases):
                queries.append(
                    {
                        "key": f"{memory}-q{j}-{r}",
                        "memory": memory,
                        "text": phrase.format(t=topic),
                        "asked_at": "2023-11-01T09:00:00",
                        "user": "bo",
                        "category": "absolute",
                        "answer": "decided",
                        "evidence": [evidence],
                    }
                )
    (out / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in messages))
    (out / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return out


@pytest.fixture(scope="session")
def fixed_window_locator(tmp_path_factory):
    """(data folder, checkpoint): a tiny locator trained with `tider sft` on the fixed-window
    data until it writes the one answer all its training targets share, so its predictions
    parse and point at the evidence day. Costs about a minute of CPU: for slow tests."""
    from pathlib import Path

    from tider.cli import main

    work = tmp_path_factory.mktemp("fixed-window-locator")
    data = write_fixed_window_data(work / "data")
    recipe = Path(__file__).resolve().parents[1] / "configs" / "sft" / "tiny-cpu.yaml"
    args = [
        "sft",
        "--config",
        str(recipe),
        "--dataset_name",
        "jsonl",
        "--dataset_path",
        str(data),
        "--model_name_or_path",
        str(work / "base"),
        "--output_dir",
        str(work / "sft"),
        "--max_steps",
        "100",
        "--learning_rate",
        "1e-2",
        "--lr_scheduler_type",
        "constant",
        "--warmup_steps",
        "0",
        "--tiny_hidden_size",
        "64",
        "--tiny_num_layers",
        "2",
        "--tiny_num_heads",
        "2",
        "--tiny_vocab_size",
        "512",
        "--tiny_structured_date_init",
        "false",
        "--prompt_lines",
        "2",
        "--max_prompt_tokens",
        "256",
        "--max_length",
        "320",
        "--completion_only_loss",
        "true",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        # float32: CPUs without native bf16 run bf16 matmuls many times slower
        "--bf16",
        "false",
        "--dtype",
        "float32",
    ]
    assert main(args) == 0
    return data, work / "sft"


REAL_SPLIT_LOCOMO = ("conv-26", "conv-30", "conv-41", "conv-43")  # train, validation, test, test
REAL_SPLIT_REALMEM = ("Lin_Wanyu", "Adeleke_Okonjo", "Ethan_Hunt", "Kenta_Tanaka", "Liam_O_Connor")


def write_real_like(out):
    """Small LoCoMo- and RealMem-format data carrying the names the real-data recipes' fixed
    split lists (configs/sft/tiny-real.yaml), so those recipes run as written at test size:
    ``(locomo file, realmem folder)``. Made-up text; the formats are the real ones."""
    import json
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    topics = ["a choir", "a pottery class", "the marathon", "a new puppy", "the book club", "a road trip"]
    conversations = []
    for c, sample in enumerate(REAL_SPLIT_LOCOMO):
        conv, qa = {"speaker_a": "Ann", "speaker_b": "Bo"}, []
        for s in range(1, 7):
            topic = topics[(s + c) % len(topics)]
            conv[f"session_{s}_date_time"] = f"1:00 pm on {s * 3} May, 2023"
            conv[f"session_{s}"] = [
                {"speaker": "Ann", "dia_id": f"D{s}:1", "text": f"I started {topic} this week."},
                {"speaker": "Bo", "dia_id": f"D{s}:2", "text": f"Nice, how is {topic} going?"},
                {"speaker": "Ann", "dia_id": f"D{s}:3", "text": "Busy, but fun. Work is fine too."},
            ]
            qa.append(
                {
                    "question": f"When did Ann start {topic}?",
                    "answer": f"{s * 3} May 2023",
                    "evidence": [f"D{s}:1"],
                    "category": 2,
                }
            )
        conversations.append({"sample_id": sample, "conversation": conv, "qa": qa})
    locomo = out / "locomo.json"
    locomo.write_text(json.dumps(conversations))
    folder = out / "realmem"
    folder.mkdir(exist_ok=True)
    for p, name in enumerate(REAL_SPLIT_REALMEM):
        sessions = []
        for s in range(6):
            uuid, topic = f"{name[:3]}{s}", topics[(s + p) % len(topics)]
            turns = [
                {"speaker": "User", "is_query": False, "content": f"Plan {topic} with me.", "query_id": None},
                {
                    "speaker": "Assistant",
                    "is_query": False,
                    "content": f"Here is a plan for {topic}.",
                    "query_id": None,
                },
            ]
            if s:
                prev = f"{name[:3]}{s - 1}"
                turns += [
                    {
                        "speaker": "User",
                        "is_query": True,
                        "content": f"What was the plan from before? ({s})",
                        "query_id": f"Q-{s}",
                        "category_name": "Dynamic Incremental",
                    },
                    {
                        "speaker": "Assistant",
                        "is_query": False,
                        "content": "The plan was ...",
                        "query_id": None,
                        "memory_used": [{"session_uuid": prev, "content": f"plan {s - 1}"}],
                        "memory_session_uuids": [prev],
                    },
                ]
            memory = [
                {
                    "index": f"{uuid}-1",
                    "type": "Dynamic",
                    "content": f"plan {s}",
                    "source_turn": 2,
                    "source_content_snapshot": f"Here is a plan for {topic}.",
                    "session_uuid": uuid,
                }
            ]
            sessions.append(
                {
                    "session_identifier": f"Plan:S{s}",
                    "session_uuid": uuid,
                    "current_time": f"2026-01-{s * 4 + 1:02d} (Monday)",
                    "dialogue_turns": turns,
                    "extracted_memory": memory,
                }
            )
        (folder / f"{name}_dialogues_256k.json").write_text(
            json.dumps({"_metadata": {"person_name": name}, "dialogues": sessions})
        )
    return locomo, folder


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A real PostgreSQL with pgvector for one test module (``pgtesting.LocalServer``)."""
    from pgtesting import LocalServer

    server = LocalServer(tmp_path_factory.mktemp("pg") / "data")
    yield server
    server.close()

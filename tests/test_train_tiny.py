"""The tiny Qwen3 factory's optional embedding initialisations, and the script that trains the tests' reader."""

from __future__ import annotations


def test_structured_date_init_puts_related_dates_close(tmp_path):
    from datetime import date

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tider.train.tiny import build_tiny_qwen3, iso_dates

    out = build_tiny_qwen3(
        tmp_path / "m",
        ["a b c", "2023-05-07 x"] * 10,
        vocab_size=300,
        date_tokens=iso_dates(date(2023, 1, 1), date(2024, 12, 31)),
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        structured_date_init=True,
    )
    tok = AutoTokenizer.from_pretrained(out)
    emb = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).get_input_embeddings().weight

    def cos(a, b):
        return float(
            torch.nn.functional.cosine_similarity(
                emb[tok.convert_tokens_to_ids(a)], emb[tok.convert_tokens_to_ids(b)], dim=0
            )
        )

    assert cos("2023-05-07", "2023-05-08") > cos("2023-05-07", "2024-11-20") + 0.2
    assert tok.tokenize("2023-05-07") == ["2023-05-07"]


def test_lexical_init_puts_related_words_close(tmp_path):
    """MiniLM's word embeddings as the tiny model's input embeddings: words MiniLM relates
    start closer than unrelated ones; dates keep their own initialisation."""
    from datetime import date

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tider.train.tiny import build_tiny_qwen3, iso_dates

    words = [
        "travel",
        "trip",
        "journey",
        "vacation",
        "banana",
        "guitar",
        "violin",
        "piano",
        "spreadsheet",
        "budget",
        "invoice",
    ]
    out = build_tiny_qwen3(
        tmp_path / "m",
        [" ".join(words)] * 50,
        vocab_size=400,
        date_tokens=iso_dates(date(2023, 1, 1), date(2023, 1, 31)),
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        lexical_init=True,
    )
    tok = AutoTokenizer.from_pretrained(out)
    emb = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).get_input_embeddings().weight

    def cos(a, b):
        ia, ib = (tok(" " + w, add_special_tokens=False)["input_ids"] for w in (a, b))
        assert len(ia) == len(ib) == 1, (a, b)  # whole-word tokens in this corpus
        return float(torch.nn.functional.cosine_similarity(emb[ia[0]], emb[ib[0]], dim=0))

    assert cos("trip", "journey") > cos("trip", "banana") + 0.2
    assert cos("violin", "piano") > cos("violin", "invoice") + 0.2


def test_the_tiny_reader_script_runs_as_its_model_readme_writes_it(tmp_path):
    """models/tiny-reader/README.md's command, at test size (1 conversation, 2 steps, 3 check
    questions): it writes a loadable reader, its run record with the three-way check, no
    pickled training arguments, and a tokenizer in which an answer word is one token, as the
    committed reader's is."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "tiny-reader"
    args = ["--out", str(out), "--steps", "2", "--conversations", "1", "--check", "3"]
    run = subprocess.run(
        [sys.executable, "scripts/train_tiny_reader.py", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    record = json.loads((out / "tiny_reader.json").read_text())
    assert record["steps"] == 2
    assert set(record["check (seed 0)"]) == {"evidence", "evidence+twins", "no evidence"}
    assert all(row["questions"] == 3 for row in record["check (seed 0)"].values())
    assert (out / "model.safetensors").exists() and not (out / "training_args.bin").exists()
    for reader in (out, root / "models" / "tiny-reader"):
        assert AutoTokenizer.from_pretrained(reader).tokenize(" porto") == ["Ġporto"]

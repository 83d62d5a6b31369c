"""The tiny Qwen3 factory's optional structured date-embedding initialisation."""

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

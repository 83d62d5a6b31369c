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

"""Train models/tiny-reader: a test-size reader for ``answer_correct`` whose answers depend on
the messages it is given, so GRPO's reader reward moves with the windows a completion names.

    python scripts/train_tiny_reader.py --out models/tiny-reader

A fresh 2-layer Qwen3 (``tider.train.tiny.build_tiny_qwen3``) with a tokenizer trained on the
synthetic world, so each answer word ("porto", "sushi") is one token as it is inside a
message, learns with TRL's SFTTrainer (loss on the answer only) to answer the reader prompt
GRPO sends (``tider.train.rewards._reader_messages``: the QA evaluation's flat prompt,
thinking off). Each context holds the question's evidence and other messages of the
conversation in time order, 4 to 20 of them (the recipes' retrieval_k is 20); half of them
also hold same-event messages of other days (the temporally wrong twins a window removes).
Training conversations come from seed 1001 (training-only, as tiny-locator-v3's); the check
answers seed 0's, the seed the recipe tests use.

Why not fine-tune the shipped locator: its weights never formed a copy in 2,000 steps
(docs/experiments.md, "A tiny reader that copies its answer"); a fresh model whose only task
is this one does. A reader this small cannot tell the right day among twins: given the
evidence alone it copies the answer, given twins it picks one of them, and without the
evidence it cannot answer. That is what the recipe tests need of it (a reward that moves
with the window), not a reader for real questions.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from datetime import date
from pathlib import Path

CONTEXT = 20  # messages a context holds at most, as retrieval_k in the recipes


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="models/tiny-reader")
    p.add_argument("--seed", type=int, default=1001, help="synthetic seed of the training conversations")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--twins", type=float, default=0.5, help="share of training contexts with same-event twins")
    p.add_argument("--check", type=int, default=200, help="held-out questions (seed 0) the final check answers")
    return p.parse_args()


def contexts(dataset, rng: random.Random, twins_share: float, evidence: bool = True):
    """``(query, message ids, answer)``: each single-answer question once; its evidence (unless
    ``evidence`` is false) plus, for ``twins_share`` of them, up to five same-event messages of
    other days, filled with other messages of the conversation to 4-20 in all."""
    for q in dataset.queries:
        gold = list(q.gold.evidence_ids)
        if not q.gold.answer or len(gold) != 1:
            continue
        memory = dataset.memories[q.memory_key]
        topics = {memory[i].topic for i in gold}
        chosen = set(gold) if evidence else set()
        if rng.random() < twins_share:
            twins = [m.id for m in memory if m.topic in topics and m.id not in gold and m.phase == "report"]
            chosen.update(rng.sample(twins, min(len(twins), rng.randint(1, 5))))
        others = [m.id for m in memory if m.id not in chosen and m.id not in gold]
        chosen.update(rng.sample(others, max(0, rng.randint(4, CONTEXT) - len(chosen))))
        yield q, sorted(chosen), q.gold.answer


def prompt_text(tokenizer, dataset, query, ids) -> str:
    from tider.locator.contract import NO_THINKING
    from tider.train.rewards import _reader_messages

    messages = _reader_messages(dataset, query, ids)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **NO_THINKING)


def build(out: Path, dataset, args) -> Path:
    """A random Qwen3 around a tokenizer trained on the reader prompts' own text."""
    from tider.forest.prompts import READER_SYSTEM_FLAT, reader_user_prompt
    from tider.train.tiny import build_tiny_qwen3, iso_dates

    corpus = [m.text for memory in dataset.memories.values() for m in memory] + [q.text for q in dataset.queries]
    corpus += [READER_SYSTEM_FLAT, *reader_user_prompt("", "bob")] * 50
    return build_tiny_qwen3(
        out,
        corpus,
        vocab_size=1500,
        date_tokens=iso_dates(date(2023, 1, 1), date(2023, 12, 31)),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=4 * args.hidden,
        seed=args.seed,
    )


def train_rows(tokenizer, dataset, args, rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(4):  # four draws of context per question
        for q, ids, answer in contexts(dataset, rng, args.twins):
            # Tokenized apart, as vLLM sees them: the prompt as the chat template renders it,
            # then the answer's own tokens. The answer opens with a space, so its word is the
            # token it is inside a message ("Ġporto"): copying it is one token.
            prompt = tokenizer(prompt_text(tokenizer, dataset, q, ids), add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(f" {answer}<|im_end|>\n", add_special_tokens=False)["input_ids"]
            rows.append(
                {"input_ids": prompt + answer_ids, "completion_mask": [0] * len(prompt) + [1] * len(answer_ids)}
            )
    rng.shuffle(rows)
    return rows


def check(model, tokenizer, n: int) -> dict:
    """Answer F1 (``tider.scoring.answer_f1``) on held-out questions, greedy: the evidence among
    other messages, with same-event twins added, and the same contexts without the evidence."""
    import torch

    from tider import scoring
    from tider.data.synth import generate

    dataset = generate(600, seed=0, n_conversations=3)
    out = {}
    for name, share, evidence in (("evidence", 0.0, True), ("evidence+twins", 1.0, True), ("no evidence", 0.0, False)):
        f1 = []
        for q, ids, answer in list(contexts(dataset, random.Random(0), share, evidence))[:n]:
            enc = tokenizer(prompt_text(tokenizer, dataset, q, ids), return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=8, do_sample=False)
            text = tokenizer.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
            f1.append(scoring.answer_f1(text, answer, q.category))
        out[name] = {"questions": len(f1), "answer_f1": round(sum(f1) / len(f1), 3)}
    return out


def main() -> None:
    args = parse_args()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tider.data.synth import generate
    from tider.hardware import auto_dtype

    out = Path(args.out)
    dataset = generate(1400 * args.conversations, seed=args.seed, n_conversations=args.conversations)
    build(out, dataset, args)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype="float32")
    rows = train_rows(tokenizer, dataset, args, random.Random(args.seed))
    config = SFTConfig(
        output_dir=str(out / "_run"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        weight_decay=0.0,
        logging_steps=25,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        # bf16 autocast only where the CPU runs it natively (~90x slower emulated); the
        # weights stay float32 and are saved as such
        bf16=auto_dtype(use_cpu=True) == "bfloat16",
        max_length=1024,
        completion_only_loss=True,
        seed=args.seed,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    shutil.rmtree(config.output_dir, ignore_errors=True)
    model.eval()
    figures = {
        "trained_on": f"synthetic seed {args.seed}, {args.conversations} conversations, {len(rows)} contexts",
        "model": f"{args.layers} layers, width {args.hidden}, {len(tokenizer)} tokens",
        "steps": args.steps,
        "check (seed 0)": check(model, tokenizer, args.check),
    }
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "training_args.bin").unlink(missing_ok=True)  # a pickle of this run's config; the json says it
    (out / "tiny_reader.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

"""Train models/tiny-reader: a test-size reader for ``answer_correct`` whose answers depend on
the messages it is given, so GRPO's reader reward varies with the windows a completion names.

    python scripts/train_tiny_reader.py --out models/tiny-reader     # ~10 min on 2 CPU cores

It fine-tunes the shipped tiny locator's weights and tokenizer (they know the synthetic
vocabulary) with TRL's SFTTrainer, loss on the answer only, on the reader prompt GRPO sends
(``tider.train.rewards._reader_messages``: the QA evaluation's flat prompt, thinking off).
Each context is shaped like a top-20 retrieval: the question's evidence, some same-event
messages of other days (the temporally wrong twins a window removes) and other messages,
in time order. Synthetic conversations of the training-only seed 1001 (as tiny-locator-v3);
the held-out check uses seed 0's, the seed the recipe tests and the benchmark use.

A reader this small cannot tell the right day among twins: given the evidence alone it
copies the answer; given twins it picks one of them. That is the behaviour the recipe tests
need (a reward that moves with the window), not a reader for real questions.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 20  # messages a context holds, as retrieval_k in the recipes


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="models/tiny-reader")
    p.add_argument("--base", default="models/tiny-locator-v3", help="weights and tokenizer to start from")
    p.add_argument("--seed", type=int, default=1001, help="synthetic seed of the training conversations")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--context", type=int, default=CONTEXT, help="messages a training context holds")
    p.add_argument("--twins", type=float, default=0.5, help="share of training contexts with same-event twins")
    p.add_argument("--check", type=int, default=200, help="held-out questions (seed 0) the final check answers")
    return p.parse_args()


def contexts(dataset, rng: random.Random, twins_share: float = 0.5, size: int = CONTEXT):
    """``(query, message ids, answer)``: each question with an answer once, its evidence plus
    (for ``twins_share`` of them) up to five same-topic messages of other days, filled with
    other messages of the conversation to ``size``."""
    for q in dataset.queries:
        evidence = list(q.gold.evidence_ids)
        if not q.gold.answer or not evidence:
            continue
        memory = dataset.memories[q.memory_key]
        topics = {memory[i].topic for i in evidence}
        chosen = set(evidence)
        if rng.random() < twins_share:
            twins = [m.id for m in memory if m.topic in topics and m.id not in chosen and m.phase == "report"]
            chosen.update(rng.sample(twins, min(len(twins), rng.randint(1, 5))))
        others = [m.id for m in memory if m.id not in chosen]
        chosen.update(rng.sample(others, max(0, size - len(chosen))))
        yield q, sorted(chosen), q.gold.answer


def prompt_text(tokenizer, dataset, query, ids) -> str:
    from tider.locator.contract import NO_THINKING
    from tider.train.rewards import _reader_messages

    messages = _reader_messages(dataset, query, ids)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **NO_THINKING)


def train_rows(tokenizer, args, rng: random.Random) -> list[dict]:
    from tider.data.synth import generate

    dataset = generate(1400 * args.conversations, seed=args.seed, n_conversations=args.conversations)
    rows = []
    for _ in range(3):  # three draws of context per question
        for q, ids, answer in contexts(dataset, rng, args.twins, args.context):
            # Tokenized apart, as vLLM sees them: the prompt as the chat template renders it,
            # then the answer's own tokens (tokenizing the joined text would merge the
            # prompt's last "\n\n" into the answer's first token). The answer opens with a
            # space, so its words are the tokens they are inside a message ("Ġmadrid", not
            # "m ad rid"): copying one is then one token (the reward strips the space).
            prompt = tokenizer(prompt_text(tokenizer, dataset, q, ids), add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(f" {answer}<|im_end|>\n", add_special_tokens=False)["input_ids"]
            rows.append(
                {"input_ids": prompt + answer_ids, "completion_mask": [0] * len(prompt) + [1] * len(answer_ids)}
            )
    rng.shuffle(rows)
    return rows


def check(model, tokenizer, n: int) -> dict:
    """Answer F1 (``tider.scoring.answer_f1``) on held-out questions, greedy, with the evidence
    alone among other messages and with same-event twins added."""
    import torch

    from tider import scoring
    from tider.data.synth import generate

    dataset = generate(600, seed=0, n_conversations=3)
    out = {}
    for name, share in (("evidence", 0.0), ("evidence+twins", 1.0)):
        f1 = []
        for q, ids, answer in list(contexts(dataset, random.Random(0), twins_share=share))[:n]:
            enc = tokenizer(prompt_text(tokenizer, dataset, q, ids), return_tensors="pt")
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=16, do_sample=False)
            text = tokenizer.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
            f1.append(scoring.answer_f1(text, answer, q.category))
        out[name] = {"questions": len(f1), "answer_f1": round(sum(f1) / len(f1), 3)}
    return out


def main() -> None:
    args = parse_args()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype="float32")
    rows = train_rows(tokenizer, args, random.Random(args.seed))
    config = SFTConfig(
        output_dir=str(Path(args.out) / "_run"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        logging_steps=25,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=True,  # autocast; the weights stay float32 (saved as such)
        max_length=1024,
        completion_only_loss=True,
        seed=args.seed,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    shutil.rmtree(config.output_dir, ignore_errors=True)
    model.eval()
    figures = {"trained_on": f"synthetic seed {args.seed}, {args.conversations} conversations, {len(rows)} contexts",
               "steps": args.steps, "check (seed 0)": check(model, tokenizer, args.check)}  # fmt: skip
    trainer.save_model(args.out)
    tokenizer.save_pretrained(args.out)
    (Path(args.out) / "tiny_reader.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

"""Serving latency of the locator's vote: per question and for a batch, against a running
OpenAI-compatible server of a locator export (``tider serve``).

    tider serve --model models/tiny-locator-v3 --port 8011 --dtype float32 \
        --max-model-len 1024 --enforce-eager --log /tmp/vote-vllm.log &
    python scripts/vote_latency.py --url http://127.0.0.1:8011/v1 --questions 20 --samples 8

It runs whichever tider is importable, so an earlier commit's client is measured against
the same server with ``PYTHONPATH=/tmp/before/src`` after
``git archive COMMIT src | tar -x -C /tmp/before``. The prompts (and the served tokenizer's
token counts, memoised) are built before the clock starts; each timed question is one
``predict_batch`` of that question, then the whole set as one batch. ``--out`` writes the
timings, the requests counted and every sample's text (to compare two clients' votes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--meta", default="models/tiny-locator-v3", help="the export folder (its tider_locator.json)")
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--messages", type=int, default=600, help="synthetic messages (seed 0)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from tider.data.synth import generate
    from tider.locator.trained import make_served_locator
    from tider.memory import MemoryCollection

    dataset = generate(args.messages, seed=0, n_conversations=3)
    queries = [q.public() for q in dataset.queries[: args.questions]]
    store = MemoryCollection(dataset.memories)
    report = {"questions": len(queries), "samples": args.samples}
    texts = {}
    for name, decoding in (
        ("greedy", {"samples": 1}),
        ("vote", {"samples": args.samples, "temperature": args.temperature, "min_votes": 1}),
    ):
        source = make_served_locator(args.url, metadata=args.meta, decoding=decoding)
        source.inputs(queries, store)  # warm: embeddings and the served tokenizer's counts
        per_question = []
        for q in queries:
            start = time.perf_counter()
            source.predict_batch([q], store, progress=False)
            per_question.append(time.perf_counter() - start)
            texts.setdefault(name, []).append(source.last_outcomes[0].text)
        start = time.perf_counter()
        source.predict_batch(queries, store, progress=False)
        batch_s = time.perf_counter() - start
        usage = source.client.usage_by_stage()["locator"]
        report[name] = {
            "per_question_mean_s": round(statistics.mean(per_question), 4),
            "per_question_median_s": round(statistics.median(per_question), 4),
            "batch_s": round(batch_s, 3),
            "requests": usage["calls"],
            "failures": dict(source.failures),
        }
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**report, "texts": texts}, f, indent=2)


if __name__ == "__main__":
    main()

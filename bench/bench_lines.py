"""Candidate recall of the locator's line selection (``tider.locator.lines``): for each gold
window of a temporal question, is one of the prompt's lines (or cues) on it? The locator can
only point at what the prompt shows, so this bounds what pointer outputs can reach.

    python bench/bench_lines.py [--messages 11200 --conversations 8 --seed 0 --select structured]

``--select similarity`` is locator-v1's rule (the most similar entries) for comparison.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=11200)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--select", default="structured", choices=["structured", "similarity"])
    ap.add_argument("--max-lines", type=int, default=14)
    args = ap.parse_args(argv)

    from tider.data.synth import generate
    from tider.hardware import describe
    from tider.locator.lines import LineConfig, entry_scores, select_lines
    from tider.locator.rules import query_cues, shared_resolver
    from tider.memory import MemoryCollection

    ds = generate(args.messages, seed=args.seed, n_conversations=args.conversations)
    store, resolver, config = MemoryCollection(ds.memories), shared_resolver(), LineConfig(max_lines=args.max_lines)
    hits, shown = collections.Counter(), collections.Counter()
    for q in (q for q in ds.queries if q.gold.temporal):
        memory = ds.memories[q.memory_key]
        timeline = store.timeline(q.memory_key).visible(q.asked_at)
        cues = query_cues(resolver, q, memory)
        sims, _ = entry_scores(timeline, timeline.embeddings @ timeline.embedder.encode([q.text])[0])
        if args.select == "structured":
            picked = select_lines(q.text, timeline, sims, cues, config).picked
        else:
            picked = [int(i) for i in np.argsort(-sims, kind="stable")[: args.max_lines]]
        spans = [timeline.span(i) for i in picked]
        for gold in q.gold.windows:
            shown[q.category] += 1
            hits[q.category] += any(s.start <= gold.end and s.end >= gold.start for s in spans)
    table = {c: round(hits[c] / shown[c], 3) for c in sorted(shown)}
    print(
        json.dumps(
            {
                "hardware": describe(),
                "select": args.select,
                "max_lines": args.max_lines,
                "gold_windows": dict(shown),
                "line_on_gold_window": table,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How big the timeline's event clusters are for each ``theta_sem`` (the README "Timeline"
figures and the ``TimelineConfig`` default come from this run).

For every setting, the timelines of all memories are built exactly as ``tider.memory``
builds them (the store's embedded text, the offline MiniLM model, embeddings cached on
disk) and the script reports entries per conversation, members per entry and the share of
memories whose K=30 prompt lines cover every entry. The paper's 0.85 makes about one entry
per turn with MiniLM (a K=30 prompt then shows 30 turns, not the conversation); the
default 0.35 with centroid similarity makes session-sized entries.

    .venv/bin/python bench/sweep_timeline.py --path ../shared/data/locomo/locomo_dev.json
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETTINGS = [
    (0.85, "max"),
    (0.85, "centroid"),
    (0.6, "centroid"),
    (0.5, "centroid"),
    (0.35, "centroid"),
    (0.25, "centroid"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="locomo")
    parser.add_argument("--path", default="../shared/data/locomo/locomo_dev.json")
    parser.add_argument("--top-k", type=int, default=30, help="K timeline lines in the locator prompt")
    parser.add_argument("--out", default="runs/sweep_timeline.json")
    args = parser.parse_args()

    from tider.data import load_dataset
    from tider.retrieval.config import RetrievalConfig
    from tider.retrieval.embed import Embedder, embedding_text
    from tider.retrieval.timeline import build_timeline

    dataset = load_dataset(args.dataset, args.path)
    config = RetrievalConfig()
    embedder = Embedder(config.embedding_model, config.embedding_cache_dir)
    embeddings = {
        k: embedder.encode([embedding_text(m, config.embed_template) for m in memory])
        for k, memory in dataset.memories.items()
    }
    rows = []
    for theta, similarity in SETTINGS:
        timeline_config = replace(config.timeline, theta_sem=theta, similarity=similarity)
        sizes = [
            len(build_timeline(memory, embedder, timeline_config, embeddings=embeddings[k]))
            for k, memory in dataset.memories.items()
        ]
        messages = sum(len(m) for m in dataset.memories.values())
        rows.append(
            {
                "theta_sem": theta,
                "similarity": similarity,
                "entries": sum(sizes),
                "entries_per_memory": sum(sizes) / len(sizes),
                "members_per_entry": messages / sum(sizes),
                "memories_within_top_k": sum(n <= args.top_k for n in sizes) / len(sizes),
            }
        )
        print(json.dumps(rows[-1]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"dataset": dataset.name, "memories": len(dataset.memories), "settings": rows}, f, indent=2)


if __name__ == "__main__":
    main()

"""The README's TemporalMemory example runs as written (real MiniLM embeddings, a real store)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_memory_example_runs(tmp_path, monkeypatch):
    text = README.read_text()
    block = re.search(r"<!-- memory-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "README lost its memory example"
    monkeypatch.chdir(tmp_path)  # the example writes stores/team-chat relative to the cwd
    code = compile(block.group(1), "README.md", "exec")
    exec(code, {})  # noqa: S102 -- running the README's own example is what this test checks
    assert (tmp_path / "stores" / "team-chat" / "tider_memory.json").exists()
    exec(code, {})  # noqa: S102 -- again: reopens, every add a no-op


def test_memory_import_builds_one_store_per_conversation(tmp_path):
    from tider.cli import main
    from tider.data.synth import generate, write
    from tider.memory import TemporalMemory

    write(generate(240, seed=5, n_conversations=2), str(tmp_path / "data"))
    args = [
        "memory",
        "import",
        "--dataset",
        "synthetic",
        "--path",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "stores"),
    ]
    assert main(args) == 0
    assert main(args) == 0  # resumable: nothing is added twice
    stores = sorted(p.name for p in (tmp_path / "stores").iterdir())
    assert len(stores) == 2
    with TemporalMemory(tmp_path / "stores" / stores[0]) as mem:
        assert len(mem) == 120 and mem.search("status update", k=3).keys

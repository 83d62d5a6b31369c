"""A service holds a bounded set of memories open (issue 44 item 3): past the limit the least
recently used one is closed (indexes persisted, its store released) unless a request is using
it, and a later request reopens it with nothing lost."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_memory_service import MESSAGES


def test_the_least_recently_used_memory_is_closed_and_reopens_whole(tmp_path):
    from tider.memory import TemporalMemory
    from tider.memory.service import create_app

    with TestClient(create_app(tmp_path / "stores", max_open=2)) as client:
        for name in ("m1", "m2", "m3"):
            assert client.post(f"/memories/{name}/messages", json={"messages": MESSAGES}).status_code == 200
        assert client.app.state.memories.names() == ["m2", "m3"]
        # m1 is closed: its store is released, so another process could open it now
        TemporalMemory(tmp_path / "stores" / "m1").close()
        hits = client.post("/memories/m1/search", json={"text": "offsite budget", "k": 2}).json()["hits"]
        assert hits and hits[0]["key"] == "m2"  # reopened whole: "The offsite budget is 20k"
        assert client.app.state.memories.names() == ["m3", "m1"]


def test_a_memory_in_use_is_never_closed(tmp_path):
    from tider.memory import TemporalMemory
    from tider.memory.service.open_memories import OpenMemories

    opened = []

    def open_memory(name, create):
        opened.append(name)
        memory = TemporalMemory(tmp_path / name)
        memory.add(MESSAGES[:1])
        return memory

    memories = OpenMemories(open_memory, limit=1)
    with memories.lease("a", create=True) as a:
        with memories.lease("b", create=True):
            assert memories.names() == ["a", "b"]  # over the limit: a is in use, b just opened
        assert a.search("Lisbon", k=1).messages  # a still works
    with memories.lease("c", create=True):
        assert memories.names() == ["c"]
    assert opened == ["a", "b", "c"]
    with pytest.raises(ValueError, match="at least 1"):
        OpenMemories(open_memory, limit=0)
    memories.close()

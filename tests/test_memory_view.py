"""``tider.types.Memory`` after removals, appends and puts reads as a memory built afresh from
the same messages: ids are positions, ``id_of`` finds each key, and the time ranges match
(the ids of the later messages follow a removal lazily)."""

from datetime import datetime, timedelta

import numpy as np

from tider.types import Memory, Message, Window

T0 = datetime(2024, 1, 1)


def msg(i: int, minutes: int, text: str = "") -> Message:
    return Message(
        id=i, key=f"k{i}", text=text or f"m{i}", timestamp=T0 + timedelta(minutes=minutes), speaker="a", session="s"
    )


def assert_same(memory: Memory, kept: list[Message]) -> None:
    fresh = Memory("ref", kept)
    assert len(memory) == len(fresh)
    assert [memory[i] for i in range(len(memory))] == fresh.messages  # renumbered on read
    assert memory.slice(2, 7) == fresh.messages[2:7]
    assert all(memory.id_of(m.key) == m.id for m in fresh.messages)
    assert memory.timestamps == fresh.timestamps
    w = Window(T0 + timedelta(minutes=30), T0 + timedelta(minutes=90))
    assert memory.id_range(w) == fresh.id_range(w)


def test_removals_appends_and_puts_read_as_a_fresh_memory():
    rng = np.random.default_rng(0)
    kept = [msg(i, 2 * i) for i in range(60)]
    memory = Memory("m", kept)
    next_id = 60
    for step in range(40):
        if step % 4 == 3:  # an add after the newest message
            new = msg(next_id, 2 * next_id)
            next_id += 1
            memory.append([new])
            kept.append(new)
        elif step % 4 == 2:  # an update whose time keeps its place
            p = int(rng.integers(len(kept)))
            changed = Message(**{**kept[p].__dict__, "text": f"changed {step}"})
            memory.put(p, changed)
            kept[p] = changed
        else:
            picks = sorted({int(p) for p in rng.integers(0, len(kept), size=int(rng.integers(1, 4)))})
            memory.remove(picks)
            kept = [m for p, m in enumerate(kept) if p not in set(picks)]
        assert memory.id_of(f"k{step}") is None or memory[memory.id_of(f"k{step}")].key == f"k{step}"
        if step % 7 == 0:
            assert_same(memory, kept)
    before = memory.copy()
    memory.remove([0])
    assert_same(before, kept)  # a copy keeps its messages
    assert_same(memory, kept[1:])
    assert memory.messages == Memory("ref", kept[1:]).messages  # the one full renumbering
    assert memory.id_of("k-none") is None

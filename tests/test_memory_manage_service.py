"""Record management, scopes and scoped keys through the real HTTP service (``tider memory
serve`` on loopback), on both backends (a directory of embedded stores, a real PostgreSQL):
add -> get -> update -> search finds the new text, not the old -> delete -> neither search
nor get finds it; a memory is a scope and a search never crosses one; a key bound to some
memories gets 403 outside them (issue 36)."""

from __future__ import annotations

import json

import httpx
import pytest
from test_memory_service import MESSAGES
from test_service_errors import Service

ALICE, AUDIT, ADMIN = "alice-key-0123456789", "audit-key-0123456789", "admin-key-0123456789"
KEYS = {
    "keys": [
        {"key": ALICE, "read": ["alice.*"], "write": ["alice.*"]},
        {"key": AUDIT, "read": ["*"], "write": []},
        {"key": ADMIN, "read": ["*"], "write": ["*"]},
    ]
}


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module", params=["directory", "postgres"])
def served(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    store = str(tmp / "stores") if request.param == "directory" else request.getfixturevalue("postgres").database()
    (tmp / "keys.json").write_text(json.dumps(KEYS))
    service = Service(store, tmp, env={"TIDER_API_KEYS": str(tmp / "keys.json")})
    yield service
    service.close()


def call(service, method: str, path: str, key: str = ADMIN, **kw) -> httpx.Response:
    headers = {**auth(key), **kw.pop("headers", {})}
    return httpx.request(method, f"{service.url}{path}", headers=headers, timeout=120, **kw)


def search_ids(service, name: str, text: str, key: str = ADMIN) -> list[str]:
    r = call(service, "POST", f"/memories/{name}/search", key, json={"text": text, "k": 10})
    assert r.status_code == 200, r.text
    return [h["key"] for h in r.json()["hits"]]


def test_add_get_update_search_delete(served):
    assert call(served, "POST", "/memories/alice.chat/messages", json={"messages": MESSAGES}).status_code == 200
    got = call(served, "GET", "/memories/alice.chat/messages/m3").json()
    assert got["text"] == MESSAGES[2]["text"] and got["timestamp"] == "2024-03-05T12:00:00"

    r = call(served, "PATCH", "/memories/alice.chat/messages/m3", json={"text": "Dinner at the zeppelin museum"})
    assert r.status_code == 200 and r.json()["text"] == "Dinner at the zeppelin museum", r.text
    assert search_ids(served, "alice.chat", "zeppelin museum")[0] == "m3"
    hits = call(served, "POST", "/memories/alice.chat/search", json={"text": "ramen lunch", "k": 4}).json()["hits"]
    assert all("ramen" not in h["text"] for h in hits)  # the old text is in no index
    moved = call(served, "PATCH", "/memories/alice.chat/messages/m3", json={"timestamp": "2024-01-01T08:00:00+02:00"})
    assert moved.json()["timestamp"] == "2024-01-01T06:00:00"
    listed = call(served, "GET", "/memories/alice.chat/messages").json()
    assert [m["key"] for m in listed["messages"]] == ["m3", "m1", "m2", "m4"] and listed["next_offset"] is None

    assert call(served, "DELETE", "/memories/alice.chat/messages/m3").json() == {"deleted": ["m3"]}
    assert call(served, "GET", "/memories/alice.chat/messages/m3").status_code == 404
    assert call(served, "DELETE", "/memories/alice.chat/messages/m3").status_code == 404
    assert call(served, "PATCH", "/memories/alice.chat/messages/m3", json={"text": "x"}).status_code == 404
    assert "m3" not in search_ids(served, "alice.chat", "zeppelin museum")


def test_list_pages_and_delete_by_range_or_all(served):
    batch = [{**m, "key": f"p{i}"} for i, m in enumerate(MESSAGES * 3)]
    batch = [{**m, "timestamp": f"2024-05-{i + 1:02d}T10:00:00"} for i, m in enumerate(batch)]
    assert call(served, "POST", "/memories/alice.pages/messages", json={"messages": batch}).status_code == 200
    first = call(served, "GET", "/memories/alice.pages/messages", params={"limit": 5}).json()
    second = call(served, "GET", "/memories/alice.pages/messages", params={"limit": 5, "offset": 5}).json()
    third = call(served, "GET", "/memories/alice.pages/messages", params={"limit": 5, "offset": 10}).json()
    assert (first["next_offset"], second["next_offset"], third["next_offset"]) == (5, 10, None)
    paged = first["messages"] + second["messages"] + third["messages"]
    assert [m["key"] for m in paged] == [f"p{i}" for i in range(12)]
    window = {"start": "2024-05-03T00:00:00", "end": "2024-05-05T23:59:59"}
    in_range = call(served, "GET", "/memories/alice.pages/messages", params=window).json()["messages"]
    assert [m["key"] for m in in_range] == ["p2", "p3", "p4"]
    assert call(served, "POST", "/memories/alice.pages/delete", json=window).json() == {"deleted": ["p2", "p3", "p4"]}
    assert call(served, "POST", "/memories/alice.pages/delete", json={"keys": ["p0", "nope"]}).json() == {
        "deleted": ["p0"]
    }
    for bad in ({}, {"keys": ["p1"], "start": "2024-05-01T00:00:00"}, {"start": "soon"}, {"keys": []}):
        r = call(served, "POST", "/memories/alice.pages/delete", json=bad)
        assert r.status_code == 422 and r.json()["detail"], (bad, r.text)
    assert call(served, "GET", "/memories/alice.pages/messages", params={"limit": 0}).status_code == 422
    assert len(call(served, "DELETE", "/memories/alice.pages").json()["deleted"]) == 8
    assert call(served, "GET", "/memories/alice.pages/messages").json()["messages"] == []


def test_scopes_and_scoped_keys(served):
    other = [{**m, "key": f"b{i}", "text": m["text"] + " (bob's)"} for i, m in enumerate(MESSAGES)]
    assert call(served, "POST", "/memories/bob.chat/messages", json={"messages": other}).status_code == 200
    assert call(served, "POST", "/memories/alice.scoped/messages", json={"messages": MESSAGES}).status_code == 200
    # a search reads its own memory only
    assert all(not i.startswith("b") for i in search_ids(served, "alice.scoped", "offsite budget bob's"))
    # alice's key: alice.* only
    assert call(served, "GET", "/memories/bob.chat/messages/b1", ALICE).status_code == 403
    assert call(served, "POST", "/memories/bob.chat/search", ALICE, json={"text": "offsite"}).status_code == 403
    assert call(served, "DELETE", "/memories/bob.chat/messages/b1", ALICE).status_code == 403
    assert call(served, "POST", "/memories/bob.chat/messages", ALICE, json={"messages": MESSAGES}).status_code == 403
    assert search_ids(served, "alice.scoped", "offsite", ALICE)
    names = call(served, "GET", "/memories", ALICE).json()["memories"]
    assert "alice.scoped" in names and "bob.chat" not in names
    # the audit key reads everything, writes nothing
    assert call(served, "GET", "/memories/bob.chat/messages/b1", AUDIT).status_code == 200
    assert call(served, "PATCH", "/memories/bob.chat/messages/b1", AUDIT, json={"text": "x"}).status_code == 403
    assert call(served, "DELETE", "/memories/alice.scoped", AUDIT).status_code == 403
    # no key, an unknown key
    assert httpx.get(f"{served.url}/memories/bob.chat/messages").status_code == 401
    assert call(served, "GET", "/memories/bob.chat/messages", "wrong-key-0123456789").status_code == 401
    assert call(served, "GET", "/memories/bob.chat/messages/b1").json()["text"].endswith("(bob's)")


def test_a_bad_key_file_stops_the_start_with_its_name(tmp_path):
    from tider.memory.service.keys import KeyFileError, KeyRing

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"key": "short", "read": ["*"]}]}))
    with pytest.raises(KeyFileError, match=r"keys\.json: keys\[0\]: needs a 'key'"):
        KeyRing.from_env(keys_file=path)
    path.write_text(json.dumps({"keys": [{"key": ALICE, "read": "alice.*"}]}))
    with pytest.raises(KeyFileError, match="lists of memory-name patterns"):
        KeyRing.from_env(keys_file=path)


CONTROL_TEXTS = {"nul": "nul \x00 byte", "bell": "bell \x07", "escape": "escape \x1b[31m"}


@pytest.mark.parametrize("key", sorted(CONTROL_TEXTS))
def test_control_characters_are_stored_the_same_way_on_both(served, key):
    """Issue 44 item 5: a NUL byte was a 500 on PostgreSQL and stored on the directory
    backend. Control characters other than tab and newlines are removed on add, update and
    in the question on both backends (real conversations carry a few), the rest kept."""
    text = CONTROL_TEXTS[key]
    clean = text.translate({c: None for c in range(32) if chr(c) not in "\t\n\r"})
    body = {"messages": [{"key": key, "text": text, "timestamp": "2024-04-01T10:00:00"}]}
    assert call(served, "POST", f"/memories/alice.{key}/messages", json=body).status_code == 200
    assert call(served, "GET", f"/memories/alice.{key}/messages/{key}").json()["text"] == clean
    r = call(served, "PATCH", f"/memories/alice.{key}/messages/{key}", json={"text": text + " again"})
    assert r.status_code == 200 and r.json()["text"] == clean + " again", r.text
    r = call(served, "POST", f"/memories/alice.{key}/search", json={"text": text, "k": 3})
    assert r.status_code == 200 and r.json()["hits"][0]["key"] == key, r.text


def test_a_lone_surrogate_is_the_same_422_on_both(served):
    """Text that is not valid Unicode (a JSON \\ud800 escape) cannot be stored anywhere: a
    422 naming the field on add, update and search, on both backends, and nothing stored."""
    text = "lone surrogate \ud800"
    body = json.dumps({"messages": [{"key": "bad", "text": text, "timestamp": "2024-04-01T10:00:00"}]})
    as_json = {"Content-Type": "application/json"}
    r = call(served, "POST", "/memories/alice.bad/messages", content=body, headers=as_json)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "messages", 0, "text"], r.text
    assert call(served, "POST", "/memories/alice.bad/messages", json={"messages": MESSAGES}).status_code == 200
    r = call(served, "PATCH", "/memories/alice.bad/messages/m1", content=json.dumps({"text": text}), headers=as_json)
    assert r.status_code == 422, r.text
    assert call(served, "GET", "/memories/alice.bad/messages/m1").json()["text"] == MESSAGES[0]["text"]
    r = call(served, "POST", "/memories/alice.bad/search", content=json.dumps({"text": text}), headers=as_json)
    assert r.status_code == 422, r.text
    assert call(served, "GET", "/memories/alice.bad/messages/bad").status_code == 404


def test_a_stale_if_match_is_a_409_and_loses_nothing(served):
    assert call(served, "POST", "/memories/alice.etag/messages", json={"messages": MESSAGES}).status_code == 200
    read = call(served, "GET", "/memories/alice.etag/messages/m2")
    version = read.json()["version"]
    assert read.headers["ETag"] == f'"{version}"'
    # two clients read the same version; the first one's change lands ...
    first = call(
        served,
        "PATCH",
        "/memories/alice.etag/messages/m2",
        json={"text": "first"},
        headers={"If-Match": read.headers["ETag"]},
    )
    assert first.status_code == 200 and first.json()["version"] != version
    assert first.headers["ETag"] == f'"{first.json()["version"]}"'
    # ... the second one's, made on what it read, is refused with the current version
    second = call(
        served,
        "PATCH",
        "/memories/alice.etag/messages/m2",
        json={"timestamp": "2024-03-09T10:00:00"},
        headers={"If-Match": f'"{version}"'},
    )
    assert second.status_code == 409 and second.headers["ETag"] == first.headers["ETag"], second.text
    assert call(served, "GET", "/memories/alice.etag/messages/m2").json() == first.json()
    # reading again, then changing, works; "*" and no header are unconditional
    again = call(
        served,
        "PATCH",
        "/memories/alice.etag/messages/m2",
        json={"timestamp": "2024-03-09T10:00:00"},
        headers={"If-Match": first.headers["ETag"]},
    )
    assert again.status_code == 200 and again.json()["text"] == "first"
    assert (
        call(
            served, "PATCH", "/memories/alice.etag/messages/m2", json={"text": "any"}, headers={"If-Match": "*"}
        ).status_code
        == 200
    )
    bad = call(
        served, "PATCH", "/memories/alice.etag/messages/m2", json={"text": "x"}, headers={"If-Match": "unquoted"}
    )
    assert bad.status_code == 422
    gone = call(
        served, "PATCH", "/memories/alice.etag/messages/nope", json={"text": "x"}, headers={"If-Match": '"abc"'}
    )
    assert gone.status_code == 404


def test_one_search_over_several_memories_inside_the_read_grant(served):
    """`POST /search` names memories or patterns; one ranking, each hit naming its memory; a
    pattern reaches only what the key may read, a named memory outside the grant is a 403."""
    for name, text in (
        ("alice.multi-work", "The offsite venue is Lisbon"),
        ("alice.multi-home", "Pick up the bike on Friday"),
    ):
        msgs = [{"key": "k1", "text": text, "timestamp": "2024-03-01T10:00:00"}]
        assert call(served, "POST", f"/memories/{name}/messages", json={"messages": msgs}).status_code == 200
    bob = [{"key": "k1", "text": "Bob's offsite venue is Porto", "timestamp": "2024-03-01T10:00:00"}]
    assert call(served, "POST", "/memories/bob.multi-work/messages", json={"messages": bob}).status_code == 200

    r = call(served, "POST", "/search", ALICE, json={"memories": ["alice.multi-*"], "text": "offsite venue", "k": 5})
    assert r.status_code == 200, r.text
    got = r.json()
    assert sorted(got["memories"]) == ["alice.multi-home", "alice.multi-work"]
    assert got["hits"][0]["memory"] == "alice.multi-work" and got["hits"][0]["key"] == "k1"
    assert all(h["memory"].startswith("alice.multi-") for h in got["hits"])
    scores = [h["score"] for h in got["hits"]]
    assert scores == sorted(scores, reverse=True)

    every = call(served, "POST", "/search", ADMIN, json={"memories": ["*.multi-work"], "text": "offsite venue", "k": 5})
    assert {h["memory"] for h in every.json()["hits"]} >= {"alice.multi-work", "bob.multi-work"}
    named = call(
        served, "POST", "/search", ALICE, json={"memories": ["alice.multi-work", "bob.multi-work"], "text": "venue"}
    )
    assert named.status_code == 403
    assert call(served, "POST", "/search", ALICE, json={"memories": ["alice.nope"], "text": "x"}).status_code == 404
    assert call(served, "POST", "/search", ALICE, json={"memories": ["bad name!"], "text": "x"}).status_code == 422


def test_a_scope_name_of_200_characters_in_parts(served):
    name = "user:alice/agent:support/session:" + "9f1c2e4a-7b3d-4e5f-8a9b-0c1d2e3f4a5b" * 5
    name = name[:200]
    assert len(name) == 200
    msgs = [{"key": "k1", "text": "The refund was approved", "timestamp": "2024-03-01T10:00:00"}]
    assert call(served, "POST", f"/memories/{name}/messages", json={"messages": msgs}).status_code == 200
    assert search_ids(served, name, "refund") == ["k1"]
    assert name in call(served, "GET", "/memories").json()["memories"]
    assert call(served, "POST", f"/memories/{name}x/messages", json={"messages": msgs}).status_code == 422  # 201


def test_filters_on_session_speaker_and_metadata_in_search_list_and_delete(served):
    msgs = [
        {
            "key": "f1",
            "text": "The venue for the offsite is Lisbon",
            "timestamp": "2024-05-01T10:00:00",
            "speaker": "ana",
            "session": "s1",
            "metadata": {"ticket": 7, "team": "ops"},
        },
        {
            "key": "f2",
            "text": "The venue for the party is Porto",
            "timestamp": "2024-05-02T10:00:00",
            "speaker": "bo",
            "session": "s2",
            "metadata": {"ticket": 8, "team": "ops"},
        },
        {
            "key": "f3",
            "text": "The venue for the retro is Faro",
            "timestamp": "2024-05-03T10:00:00",
            "speaker": "ana",
            "session": "s2",
            "metadata": {"ticket": 9, "vip": True},
        },
    ]
    assert call(served, "POST", "/memories/alice.filters/messages", json={"messages": msgs}).status_code == 200
    got = call(served, "GET", "/memories/alice.filters/messages/f1").json()
    assert got["metadata"] == {"ticket": 7, "team": "ops"}

    def search(filters):
        body = {"text": "which venue?", "k": 10, "filters": filters}
        r = call(served, "POST", "/memories/alice.filters/search", json=body)
        assert r.status_code == 200, r.text
        return sorted(h["key"] for h in r.json()["hits"])

    assert search({"speaker": "ana"}) == ["f1", "f3"]
    assert search({"session": ["s1", "s2"], "speaker": "bo"}) == ["f2"]
    assert search({"metadata": {"team": "ops"}}) == ["f1", "f2"]
    assert search({"metadata": {"vip": True}}) == ["f3"] and search({"metadata": {"ticket": "7"}}) == []
    bad = call(served, "POST", "/memories/alice.filters/search", json={"text": "x", "filters": {"user": "a"}})
    assert bad.status_code == 422

    listed = call(
        served, "GET", "/memories/alice.filters/messages", params={"session": "s2", "metadata": '{"vip": true}'}
    )
    assert [m["key"] for m in listed.json()["messages"]] == ["f3"]
    assert call(served, "GET", "/memories/alice.filters/messages", params={"metadata": "{oops"}).status_code == 422

    gone = call(served, "POST", "/memories/alice.filters/delete", json={"filters": {"metadata": {"team": "ops"}}})
    assert gone.json() == {"deleted": ["f1", "f2"]}
    assert [m["key"] for m in call(served, "GET", "/memories/alice.filters/messages").json()["messages"]] == ["f3"]
    patched = call(served, "PATCH", "/memories/alice.filters/messages/f3", json={"metadata": {"vip": False}})
    assert patched.json()["metadata"] == {"vip": False} and patched.json()["text"].endswith("Faro")

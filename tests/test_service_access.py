"""Authorization is decided by the route (issue 44 item 1): every route of the service's
OpenAPI schema x {no key, a read-only key, another scope's key, a writer}, over messages
whose keys look like route words (``search``, ``delete``, ``messages``). A read-only key
once rewrote and deleted the message keyed ``search`` because the service guessed "read"
from a path ending in /search."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

WRITER, READER, OTHER = "writer-key-0123456789", "reader-key-0123456789", "other-key-01234567890"
KEYS = {
    "keys": [
        {"key": WRITER, "read": ["alice.*"], "write": ["alice.*"]},
        {"key": READER, "read": ["*"], "write": []},
        {"key": OTHER, "read": ["bob.*"], "write": ["bob.*"]},
    ]
}
# a scope of parts, as mem0 users name them (user / agent / session), 200 characters at most
NAME = "alice.chat/agent:support/session:9f1c2e4a-7b3d-4c1e-9a2f-0d5e6b7c8a9f"
ROUTE_WORDS = ["search", "delete", "messages", "m1"]
# What each route does to the memory it names; a route missing here fails the test.
ACCESS = {
    ("get", "/health"): "public",
    ("get", "/memories"): "listing",
    ("post", "/memories/{name}/messages"): "write",
    ("post", "/memories/{name}/search"): "read",
    ("get", "/memories/{name}/messages"): "read",
    ("get", "/memories/{name}/messages/{key}"): "read",
    ("patch", "/memories/{name}/messages/{key}"): "write",
    ("delete", "/memories/{name}/messages/{key}"): "write",
    ("post", "/memories/{name}/delete"): "write",
    ("delete", "/memories/{name}"): "write",
    ("post", "/search"): "read",  # the memories are named in the body: checked per memory
}


def body(method: str, path: str, key: str) -> dict | None:
    """A valid body, so a call that is allowed succeeds and one that is refused was refused."""
    if path.endswith("/messages") and method == "post":
        return {"messages": [{"key": "new", "text": "A new note", "timestamp": "2024-03-09T10:00:00"}]}
    if path == "/search":
        return {"memories": [NAME], "text": "the offsite", "k": 3}
    if path.endswith("/search"):
        return {"text": "the offsite", "k": 3}
    if method == "patch":
        return {"text": "rewritten"}
    if path.endswith("/delete"):
        return {"keys": [key]}
    return None


@pytest.fixture(scope="module", params=["directory", "postgres"])
def client(request, tmp_path_factory):
    from tider.memory.service import create_app

    tmp = tmp_path_factory.mktemp("access")
    (tmp / "keys.json").write_text(json.dumps(KEYS))
    store = tmp / "stores" if request.param == "directory" else request.getfixturevalue("postgres").database()
    with TestClient(create_app(store, keys_file=tmp / "keys.json")) as c:
        yield c


def reset(client) -> list[dict]:
    """The memory as the writer sees it, after putting every route-word message back."""
    client.delete(f"/memories/{NAME}", headers=auth(WRITER))
    messages = [
        {"key": k, "text": f"Note {k} about the offsite", "timestamp": f"2024-03-0{i + 1}T10:00:00"}
        for i, k in enumerate(ROUTE_WORDS)
    ]
    assert client.post(f"/memories/{NAME}/messages", json={"messages": messages}, headers=auth(WRITER)).is_success
    return snapshot(client)


def snapshot(client) -> list[dict]:
    return client.get(f"/memories/{NAME}/messages", headers=auth(WRITER)).json()["messages"]


def auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def test_every_route_is_in_the_table(client):
    routes = {(m, p) for p, ops in client.get("/openapi.json").json()["paths"].items() for m in ops}
    assert routes == set(ACCESS), routes ^ set(ACCESS)


@pytest.mark.parametrize("route", sorted(ACCESS), ids=lambda r: f"{r[0].upper()} {r[1]}")
def test_each_key_gets_what_the_route_declares(client, route):
    method, template = route
    access = ACCESS[route]
    for word in ROUTE_WORDS if "{key}" in template else ["-"]:
        path = template.replace("{name}", NAME).replace("{key}", word)
        for key, allowed in ((None, False), (OTHER, False), (READER, access != "write"), (WRITER, True)):
            before = reset(client)
            r = client.request(method, path, json=body(method, template, word), headers=auth(key))
            where = f"{method.upper()} {path} with {key or 'no key'}: {r.status_code} {r.text[:200]}"
            if access == "public":
                assert r.status_code == 200, where
                continue
            if key is None:
                assert r.status_code == 401, where
            elif access == "listing":
                assert r.status_code == 200 and (NAME in r.json()["memories"]) == (key != OTHER), where
            elif not allowed:
                assert r.status_code == 403, where
            else:
                assert r.status_code in (200, 404), where
            if not allowed or access == "read":
                assert snapshot(client) == before, f"{where}: the memory changed"


def test_names_in_parts_are_scopes_that_a_pattern_reads_together(client):
    """mem0-style scopes (user / agent / session) as "/"-separated names: each its own
    memory (a folder per memory, "/" as "+"), read together by a pattern inside the key's
    grant; a part that is a route word, or a character outside the name's, is a 422."""
    names = [f"alice.user/agent:{a}/session:{s}" for a, s in (("support", "1"), ("support", "2"), ("sales", "1"))]
    for i, name in enumerate(names):
        note = {"key": "m", "text": f"Note {i}: the offsite moved", "timestamp": f"2024-03-0{i + 1}T10:00:00"}
        r = client.post(f"/memories/{name}/messages", json={"messages": [note]}, headers=auth(WRITER))
        assert r.status_code == 200, r.text
    assert set(names) <= set(client.get("/memories", headers=auth(READER)).json()["memories"])
    ask = {"memories": ["alice.user/agent:support/*"], "text": "the offsite", "k": 5}
    r = client.post("/search", json=ask, headers=auth(READER))
    assert r.status_code == 200 and sorted(h["memory"] for h in r.json()["hits"]) == names[:2], r.text
    assert client.get(f"/memories/{names[0]}/messages/m", headers=auth(READER)).json()["text"].startswith("Note 0")
    assert client.post(f"/memories/{names[2]}/search", json=ask, headers=auth(OTHER)).status_code == 403
    assert client.delete(f"/memories/{names[0]}", headers=auth(WRITER)).json()["deleted"] == ["m"]
    assert client.get(f"/memories/{names[0]}/messages", headers=auth(READER)).json()["messages"] == []
    assert client.get(f"/memories/{names[1]}/messages/m", headers=auth(READER)).status_code == 200
    bad = {"memories": ["alice.user/messages"], "text": "the offsite"}
    assert client.post("/search", json=bad, headers=auth(READER)).status_code == 422
    note = {"messages": [{"key": "m", "text": "x", "timestamp": "2024-03-01T10:00:00"}]}
    assert client.post("/memories/alice.user/bad part!/messages", json=note, headers=auth(WRITER)).status_code == 422

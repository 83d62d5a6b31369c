"""The HTTP memory service when things go wrong, through the real service (``tider memory
serve`` on loopback, or the app under ``TestClient`` where a test stops a real PostgreSQL):
bad input is a 4xx with a message; a store that cannot serve is a 503 with a message; a
window source that fails is said in the response (``window_source``) and in a logged
warning, never a silent fallback; and a search leaves no question text on disk."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from test_memory_service import MESSAGES

ROOT = Path(__file__).resolve().parents[1]
LOCATOR = ROOT / "models" / "tiny-locator-v3"
SECRET = "Zanzibarquux"  # in the question only: a file holding it has logged the question
QUESTION = f"What did {SECRET} decide about the offsite last week?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """``tider memory serve`` in a subprocess: its URL, its stderr (the warnings) in a file."""

    def __init__(self, store: str, tmp: Path, *args: str, env: dict | None = None, cwd: Path | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"service-{self.port}.log"
        environment = {k: v for k, v in os.environ.items() if k not in ("TIDER_API_KEY", "TIDER_CUE_CACHE")}
        environment.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), **(env or {})})
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tider.cli",
                    "memory",
                    "serve",
                    "--store",
                    store,
                    "--port",
                    str(self.port),
                    *args,
                ],
                env=environment,
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                httpx.get(f"{self.url}/health", timeout=2)  # any answer: up (a 503 is an answer)
                return
            except httpx.HTTPError:
                time.sleep(0.3)
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited: {self.log.read_text()}")
        self.close()
        raise RuntimeError("service did not come up")

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=120, **kw)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def service(tmp_path):
    started = []

    def start(store=None, *args, **kw) -> Service:
        started.append(Service(str(store or tmp_path / "stores"), tmp_path, *args, **kw))
        return started[-1]

    yield start
    for s in started:
        s.close()


def test_bad_input_is_a_4xx_with_a_message_and_an_unknown_memory_a_404(service):
    svc = service()
    assert svc.post("/memories/team/messages", {"messages": MESSAGES}).status_code == 200
    r = svc.post("/memories/team/search", content=b'{"text": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "JSON" in json.dumps(r.json()["detail"])  # says what is wrong
    r = svc.post("/memories/team/search", {"text": "x", "k": 0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "k" and r.json()["detail"][0]["msg"]
    r = svc.post("/memories/team/search", {"text": "x", "surprise": 1})
    assert r.status_code == 422 and "surprise" in json.dumps(r.json())
    r = svc.post("/memories/team/search", {"text": "x", "windows": "locator"})  # none configured here
    assert r.status_code == 422 and "locator" in json.dumps(r.json())
    r = svc.post("/memories/nobody/search", {"text": "x"})
    assert r.status_code == 404 and r.json() == {"detail": "no memory 'nobody'"}
    r = svc.post("/memories/team/search", {"text": "where is the offsite?"})
    assert r.status_code == 200 and r.json()["window_source"] == "none"


def test_a_directory_store_open_elsewhere_is_a_503(service, tmp_path):
    from tider.memory.files import StoreFiles

    held = StoreFiles(tmp_path / "stores" / "held")  # this process holds the store's lock
    try:
        svc = service()
        r = svc.post("/memories/held/messages", {"messages": MESSAGES})
        assert r.status_code == 503 and "open in another process" in r.json()["detail"], r.text
        assert r.headers["Retry-After"]
    finally:
        held.close()
    assert svc.post("/memories/held/messages", {"messages": MESSAGES}).status_code == 200  # released: it works


def test_a_database_nobody_listens_on_is_a_503_never_a_500(service):
    """The service starts (a load balancer sees it unhealthy) and says why on every request."""
    url = f"postgresql://tider@127.0.0.1:{_free_port()}/tider"
    svc = service(url)
    assert httpx.get(f"{svc.url}/health").status_code == 503
    for method, path, body in (
        ("GET", "/memories", None),
        ("POST", "/memories/team/messages", {"messages": MESSAGES}),
        ("POST", "/memories/team/search", {"text": "where is the offsite?"}),
    ):
        r = httpx.request(method, f"{svc.url}{path}", json=body, timeout=60)
        assert r.status_code == 503, (path, r.status_code, r.text)
        assert "not reachable" in r.json()["detail"] and "127.0.0.1" in r.json()["detail"]
    assert "not reachable" in svc.log.read_text()  # said at start, and per request


def test_a_stopped_database_is_a_503_and_the_service_comes_back_with_it(tmp_path):
    """A real PostgreSQL, down when the service starts, then up, then crashed: 503s saying
    so, and the service serves once the database does, without a restart."""
    pytest.importorskip("pgserver")
    from fastapi.testclient import TestClient
    from pgtesting import LocalServer

    from tider.memory.pg.config import PostgresConfig
    from tider.memory.service import create_app

    own = LocalServer(tmp_path / "data")
    try:
        url = own.database()
        own.crash()
        app = create_app(url, api_key="k", postgres=PostgresConfig(connect_timeout_s=2))
        auth = {"Authorization": "Bearer k"}
        with TestClient(app) as client:
            assert client.get("/health").status_code == 503
            r = client.post("/memories/team/messages", json={"messages": MESSAGES}, headers=auth)
            assert r.status_code == 503 and "not reachable" in r.json()["detail"]
            own.restart()
            deadline = time.monotonic() + 60
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the service did not open the database once it was up"
                time.sleep(0.5)
            assert client.post("/memories/team/messages", json={"messages": MESSAGES}, headers=auth).status_code == 200
            own.crash()
            for r in (
                client.get("/memories", headers=auth),
                client.post("/memories/team/messages", json={"messages": MESSAGES[:1]}, headers=auth),
                client.post("/memories/team/search", json={"text": "offsite"}, headers=auth),
            ):
                assert r.status_code == 503 and "not reachable" in r.json()["detail"], r.text
    finally:
        own.close()


class FakeLocatorServer:
    """An OpenAI-compatible server for the locator source: ``/v1/models`` lists the tiny
    locator export (its folder is visible here, so its prompt settings and tokenizer are
    read from it); chat completions answer ``{"temporal": false, ...}`` (``mode="ok"``) or
    fail with a 500 (``mode="error"``)."""

    def __init__(self, port: int):
        self.port, self.mode, self.server = port, "ok", None

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    entry = {"id": "tiny-locator", "object": "model", "owned_by": "test", "root": str(LOCATOR)}
                    return self._send(200, {"object": "list", "data": [entry]})
                self._send(404, {"error": "not found"})

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if owner.mode == "error":
                    return self._send(500, {"error": {"message": "the model fell over", "type": "server_error"}})
                answer = '{"temporal": false, "windows": []}'
                choices = [
                    {"index": i, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                    for i in range(int(request.get("n") or 1))
                ]
                usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
                self._send(
                    200,
                    {"id": "c", "object": "chat.completion", "created": 0, "model": "tiny-locator", "choices": choices}
                    | {"usage": usage},
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def test_a_failing_locator_is_said_in_the_response_and_logged(service):
    """windows=locator with the served model unreachable, then answering, then erroring,
    then gone: 200s whose ``window_source`` says what happened, a warning per failure in
    the service's log (which never holds the question)."""
    port = _free_port()
    fake = FakeLocatorServer(port)
    svc = service(None, "--locator-url", f"http://127.0.0.1:{port}/v1")
    assert svc.post("/memories/team/messages", {"messages": MESSAGES}).status_code == 200
    ask = {"text": QUESTION, "asked_at": "2024-03-10T00:00:00", "k": 3, "windows": "locator"}
    try:
        r = svc.post("/memories/team/search", ask)  # nothing listens: the source cannot be built
        body = r.json()
        assert r.status_code == 200, r.text
        assert body["window_source"].startswith("none (locator failed: APIConnectionError"), body["window_source"]
        assert body["prediction"] == {"temporal": False, "windows": []} and len(body["hits"]) == 3
        fake.start()
        r = svc.post("/memories/team/search", ask)
        assert r.status_code == 200 and r.json()["window_source"] == "locator", r.text  # built, and it answered
        fake.mode = "error"
        r = svc.post("/memories/team/search", ask)
        assert r.status_code == 200 and r.json()["window_source"].startswith("none (locator failed: request_failed")
        assert len(r.json()["hits"]) == 3
        fake.stop()
        r = svc.post("/memories/team/search", ask)
        assert r.status_code == 200 and r.json()["window_source"].startswith("none (locator failed: request_failed")
    finally:
        fake.stop()
    log = svc.log.read_text()
    assert log.count("window source 'locator' failed, searched without windows") == 3, log
    assert SECRET not in log


def _files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_search_leaves_no_question_on_disk_unless_the_cue_cache_is_opted_in(service, tmp_path):
    """Default: the time expressions of a search are resolved in memory (no cues.jsonl in
    the working directory or under $TIDER_CACHE). ``TIDER_CUE_CACHE=FILE`` opts in: the
    file gets one row per question, a hash and the cues, never the question."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    ask = {"text": QUESTION, "asked_at": "2024-03-10T00:00:00", "k": 3, "windows": "rules"}
    svc = service(tmp_path / "stores", env={"TIDER_CACHE": str(cache)}, cwd=work)
    assert svc.post("/memories/team/messages", {"messages": MESSAGES}).status_code == 200
    r = svc.post("/memories/team/search", ask)
    assert r.status_code == 200 and r.json()["window_source"] == "rules" and r.json()["prediction"]["temporal"]
    svc.close()
    assert not list(tmp_path.rglob("cues.jsonl"))
    assert _files_holding(tmp_path, SECRET) == []

    opted = tmp_path / "opted" / "cues.jsonl"
    svc = service(tmp_path / "stores", env={"TIDER_CACHE": str(cache), "TIDER_CUE_CACHE": str(opted)}, cwd=work)
    for _ in range(2):  # the second is the memo's: one row
        assert svc.post("/memories/team/search", ask).json()["window_source"] == "rules"
    svc.close()
    (row,) = [json.loads(line) for line in opted.read_text().splitlines()]
    assert set(row) == {"v", "key", "cues"} and len(row["key"]) == 64 and row["cues"][0][0] == "last week"
    assert _files_holding(tmp_path, SECRET) == []


def test_the_cue_cache_hashes_its_keys_and_rewrites_an_old_plaintext_file(tmp_path):
    from datetime import datetime, timedelta

    from tider.locator.rules import RESOLVER_VERSION, CueResolver, cue_digest

    asked = datetime(2023, 5, 10, 12)
    path = tmp_path / "cues.jsonl"
    cues = CueResolver(cache_path=path).resolve(QUESTION, asked)
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    key = (QUESTION, asked, asked - timedelta(days=4 * 365))
    assert (
        row["key"]
        == cue_digest(key)
        == hashlib.sha256(json.dumps([QUESTION, *(t.isoformat() for t in key[1:])]).encode()).hexdigest()
    )
    assert SECRET not in path.read_text()
    old = {"v": RESOLVER_VERSION, "text": QUESTION, "asked_at": key[1].isoformat(), "floor": key[2].isoformat()}
    path.write_text(json.dumps({**old, "cues": row["cues"]}) + "\n")  # what tider wrote before
    again = CueResolver(cache_path=path)
    again._parse = lambda *a: pytest.fail("a cached question must not be parsed again")
    assert again.resolve(QUESTION, asked) == cues
    assert SECRET not in path.read_text() and json.loads(path.read_text())["key"] == row["key"]

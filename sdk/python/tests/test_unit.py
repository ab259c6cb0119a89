"""Encoding and decoding, without a server: frames, errors, the audit cursor, and the routes
not in today's server (terminals and preview links) against their contract, with fakes."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any, Callable, Iterator

import httpx
import pytest

from sandlane import (
    AsyncSandlane,
    AuditEvent,
    AuditPage,
    ConflictError,
    ExitFrame,
    InternalError,
    InvalidArgumentError,
    LaneDisabledError,
    NotFoundError,
    OutputFrame,
    PermissionDeniedError,
    ProvisioningFailedError,
    ResourceExhaustedError,
    Sandlane,
    SandlaneError,
    StreamInterruptedError,
    TerminalExit,
    TooLargeError,
    UnauthenticatedError,
    UnavailableError,
)
from sandlane._core import AuditCursor, FrameDecoder, NdjsonDecoder

SBX = "sbx_01KA2B3C4D5E6F7G8H9JKMNPQR"
BASE = f"/v1/orgs/acme/sandboxes/{SBX}"


def frames_of(payload: bytes, chunk: int, require_exit: bool = True) -> list[Any]:
    decoder = FrameDecoder(require_exit)
    out: list[Any] = []
    for i in range(0, len(payload), chunk):
        out += decoder.feed(payload[i : i + chunk])
    return out + decoder.finish()


STREAM = (
    b'{"type":"stdout","text":"h\xc3\xa9llo\\n"}\n'
    + b'{"type":"stderr","data":"' + base64.b64encode(b"\xff\x00") + b'"}\n'
    + b'{"type":"future-kind","x":1}\n'
    + b'{"type":"exit","exit_code":3,"timed_out":false,"truncated":true}\n'
)


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 10_000])
def test_frames_decode_whatever_the_chunks(chunk: int) -> None:
    frames = frames_of(STREAM, chunk)
    assert frames == [
        OutputFrame("stdout", "héllo\n".encode()),
        OutputFrame("stderr", b"\xff\x00"),
        ExitFrame(exit_code=3, timed_out=False, truncated=True),
    ]
    assert frames[0].text == "héllo\n"


def test_an_error_line_raises_its_typed_error() -> None:
    payload = b'{"type":"stdout","text":"a"}\n{"type":"error","error":"unavailable","message":"the sandbox went away"}\n'
    decoder = FrameDecoder(require_exit=True)
    with pytest.raises(UnavailableError) as err:
        decoder.feed(payload)
    assert err.value.code == "unavailable" and err.value.status == 200
    assert err.value.message == "the sandbox went away"


def test_a_stream_cut_before_its_exit_raises() -> None:
    with pytest.raises(StreamInterruptedError):
        frames_of(b'{"type":"stdout","text":"a"}\n', 5)
    assert frames_of(b'{"type":"stdout","text":"a"}\n', 5, require_exit=False) == [OutputFrame("stdout", b"a")]


def test_an_output_frame_holds_exactly_one_of_text_and_data() -> None:
    with pytest.raises(ValueError):
        OutputFrame.from_json({"type": "stdout", "text": "a", "data": "YQ=="})
    with pytest.raises(ValueError):
        OutputFrame.from_json({"type": "stdout"})


def test_ndjson_last_line_without_newline() -> None:
    d = NdjsonDecoder()
    assert d.feed(b'{"a":1}\n{"b"') == [{"a": 1}]
    assert d.feed(b":2}") == []
    assert d.finish() == [{"b": 2}]


def _event(seq: int) -> AuditEvent:
    return AuditEvent.from_json(
        {
            "seq": seq, "action": "ensure", "org": "acme", "kind": "session", "key": "k",
            "caller_id": "u", "caller_class": "user", "driver": "bwrap", "outcome": "reused",
            "message": "", "at": "t", "sealed": False,
        }
    )


def test_the_audit_cursor_never_repeats() -> None:
    cursor = AuditCursor(after=0)
    assert [e.seq for e in cursor.accept(AuditPage([_event(1), _event(2)], next=2))] == [1, 2]
    assert [e.seq for e in cursor.accept(AuditPage([_event(2), _event(3)], next=3))] == [3]
    assert cursor.accept(AuditPage([], next=3)) == [] and cursor.after == 3


CODES = [
    ("invalid_argument", 400, InvalidArgumentError),
    ("unauthenticated", 401, UnauthenticatedError),
    ("permission_denied", 403, PermissionDeniedError),
    ("not_found", 404, NotFoundError),
    ("conflict", 409, ConflictError),
    ("too_large", 413, TooLargeError),
    ("resource_exhausted", 429, ResourceExhaustedError),
    ("unavailable", 503, UnavailableError),
    ("internal", 500, InternalError),
]


def fake(handler: Callable[[httpx.Request], httpx.Response]) -> Sandlane:
    return Sandlane("http://fake", "key-1", org="acme", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(("code", "status", "cls"), CODES)
def test_each_api_code_is_its_own_class(code: str, status: int, cls: type[SandlaneError]) -> None:
    client = fake(lambda _: httpx.Response(status, json={"error": code, "message": f"it was {code}"}))
    with pytest.raises(cls) as err:
        client.sandbox(SBX).exec(["true"])
    assert isinstance(err.value, SandlaneError)
    assert (err.value.code, err.value.status, err.value.message) == (code, status, f"it was {code}")


def test_a_non_json_error_is_typed_by_its_status() -> None:
    client = fake(lambda _: httpx.Response(502, text="bad gateway"))
    with pytest.raises(SandlaneError) as err:
        client.sandbox(SBX).exec(["true"])
    assert err.value.status == 502 and err.value.code is None


def test_ensure_outcomes() -> None:
    answers = iter([{"outcome": "failed", "message": "Sandbox provisioning failed: driver"}, {"outcome": "disabled"}])
    client = fake(lambda _: httpx.Response(200, json=next(answers)))
    failed = client.ensure_session("s1", execution_id="e1")
    assert failed.outcome == "failed" and failed.sandbox is None and not failed.ready
    with pytest.raises(ProvisioningFailedError, match="Sandbox provisioning failed: "):
        failed.require_sandbox()
    with pytest.raises(LaneDisabledError):
        client.ensure_session("s1", execution_id="e1").require_sandbox()


class Recorder:
    """A fake server: records requests, answers from a table keyed by (method, path)."""

    def __init__(self, answers: dict[tuple[str, str], httpx.Response]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answers.get((request.method, request.url.path), httpx.Response(404, json={"error": "not_found", "message": "no route"}))

    def body(self, i: int) -> Any:
        return json.loads(self.requests[i].content)


def test_terminal_and_preview_link_routes_encode_the_contract() -> None:
    rec = Recorder(
        {
            ("POST", f"{BASE}/terminals"): httpx.Response(201, json={"id": "term_1"}),
            ("GET", f"{BASE}/terminals"): httpx.Response(200, json={"terminals": [{"id": "term_1", "cols": 80}]}),
            ("POST", f"{BASE}/terminals/term_1/tickets"): httpx.Response(201, json={"ticket": "tk", "expires_at": "soon"}),
            ("DELETE", f"{BASE}/terminals/term_1"): httpx.Response(204),
            ("POST", f"{BASE}/ports/8000/links"): httpx.Response(
                201, json={"id": "lnk_1", "url": "https://p.example/x", "expires_at": "later"}
            ),
            ("DELETE", f"{BASE}/ports/8000/links/lnk_1"): httpx.Response(204),
        }
    )
    sbx = Sandlane("http://fake", "key-1", org="acme", transport=httpx.MockTransport(rec)).sandbox(SBX)
    assert sbx.terminals.create(cols=120, rows=40, argv=["bash", "-l"]).id == "term_1"
    assert rec.body(0) == {"cols": 120, "rows": 40, "argv": ["bash", "-l"]}
    assert rec.requests[0].headers["authorization"] == "Bearer key-1"
    sbx.terminals.create()
    assert rec.body(1) == {"cols": 80, "rows": 24}
    assert [t.id for t in sbx.terminals.list()] == ["term_1"]
    ticket = sbx.terminals.ticket("term_1")
    assert (ticket.ticket, ticket.expires_at) == ("tk", "soon")
    sbx.terminals.delete("term_1")
    link = sbx.preview_links.create(8000, ttl_s=600)
    assert (link.id, link.url, link.expires_at) == ("lnk_1", "https://p.example/x", "later")
    assert rec.body(5) == {"ttl_s": 600}
    sbx.preview_links.delete(8000, "lnk_1")
    assert [(r.method, r.url.path) for r in rec.requests][-1] == ("DELETE", f"{BASE}/ports/8000/links/lnk_1")


def test_async_terminal_and_link_routes() -> None:
    rec = Recorder(
        {
            ("POST", f"{BASE}/terminals"): httpx.Response(201, json={"id": "term_2"}),
            ("POST", f"{BASE}/ports/3000/links"): httpx.Response(201, json={"id": "l", "url": "u", "expires_at": "e"}),
        }
    )

    async def scenario() -> None:
        async with AsyncSandlane("http://fake", "k", org="acme", transport=httpx.MockTransport(rec)) as c:
            assert (await c.sandbox(SBX).terminals.create(cols=10, rows=5)).id == "term_2"
            assert (await c.sandbox(SBX).preview_links.create(3000, ttl_s=60)).url == "u"

    asyncio.run(scenario())
    assert rec.body(0) == {"cols": 10, "rows": 5} and rec.body(1) == {"ttl_s": 60}


def test_request_encoding_of_the_other_routes() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        if request.url.path.endswith("/stdin") or request.url.path.endswith("/signal"):
            return httpx.Response(204)
        if request.url.path.endswith("/files") and request.method == "PUT":
            return httpx.Response(200, json={"path": "/workspace/a b", "size": len(request.content)})
        return httpx.Response(200, json={"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "truncated": False})

    sbx = fake(handler).sandbox(SBX)
    sbx.exec("echo hi", stdin="x", timeout_ms=5000)
    assert json.loads(seen[0].content) == {"argv": ["/bin/sh", "-c", "echo hi"], "stdin": "x", "timeout_ms": 5000}
    assert sbx.files.write("a b", iter([b"ab", b"", b"c"])).size == 3
    assert seen[1].url.params["path"] == "a b" and seen[1].content == b"abc"
    sbx.processes.write_stdin(4, b"in", close=True)
    assert seen[2].url.params["close"] == "true" and seen[2].content == b"in"
    sbx.processes.kill(4)
    assert json.loads(seen[3].content) == {"signal": "KILL"}
    with pytest.raises(ValueError):
        sbx.processes.signal(4, "HUP")


# ---- the terminal WebSocket, against a local fake server ----------------------------


@pytest.fixture()
def fake_terminal_server() -> Iterator[tuple[str, list[Any]]]:
    """A WebSocket server speaking the terminal contract: replays, echoes, resizes, exits."""
    from websockets.sync.server import ServerConnection, serve

    log: list[Any] = []

    def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        log.append(("path", ws.request.path, ws.request.headers.get("Authorization")))
        ws.send(b"replayed$ ")
        for message in ws:
            if isinstance(message, str):
                control = json.loads(message)
                log.append(control)
                ws.send(f"resized {control['cols']}x{control['rows']}\r\n".encode())
            elif message == b"exit\r":
                ws.send(json.dumps({"type": "exit", "exit_code": 3}))
                ws.close()
                return
            else:
                ws.send(b"echo:" + message)

    def process_request(connection: ServerConnection, request: Any) -> Any:
        if request.headers.get("Authorization") != "Bearer key-t" and request.headers.get("Authorization") != "Bearer key-a":
            body = json.dumps({"error": "permission_denied", "message": "not your terminal"})
            return connection.respond(403, body)
        return None

    server = serve(handler, "127.0.0.1", 0, process_request=process_request)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.socket.getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        server.shutdown()
        thread.join(5)


def test_terminal_attach_sync(fake_terminal_server: tuple[str, list[Any]]) -> None:
    url, log = fake_terminal_server
    with Sandlane(url, "key-t", org="acme") as client:
        with client.sandbox(SBX).terminals.attach("term_9") as term:
            assert term.read_until(b"$ ") == b"replayed$ "
            term.send("ls\r")
            assert term.read_until(b"ls\r") == b"echo:ls\r"
            term.resize(100, 30)
            assert b"resized 100x30" in term.read_until(b"\r\n")
            term.send(b"exit\r")
            assert term.recv(timeout=5) == TerminalExit(3)
            assert term.exit_code == 3
            assert term.recv(timeout=5) is None
    assert log[0] == ("path", f"{BASE}/terminals/term_9", "Bearer key-t")
    assert log[1] == {"type": "resize", "cols": 100, "rows": 30}


def test_terminal_attach_async(fake_terminal_server: tuple[str, list[Any]]) -> None:
    url, log = fake_terminal_server

    async def scenario() -> None:
        async with AsyncSandlane(url, "key-a", org="acme") as client:
            term = await client.sandbox(SBX).terminals.attach("term_8")
            async with term:
                assert await term.read_until(b"$ ") == b"replayed$ "
                await term.resize(10, 5)
                assert b"resized 10x5" in await term.read_until(b"\r\n")
                await term.send("exit\r")
                rest = [chunk async for chunk in term]
                assert rest == [] and term.exit_code == 3

    asyncio.run(scenario())
    assert log[0] == ("path", f"{BASE}/terminals/term_8", "Bearer key-a")


def test_tar_directory_is_a_tar_tarfile_reads(tmp_path: Any) -> None:
    import io
    import tarfile

    from sandlane._tar import ChunkReader, tar_directory

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_bytes(b"x" * 1000)
    (tmp_path / "top.bin").write_bytes(b"\0\1" * 3000)
    (tmp_path / "ln").symlink_to("top.bin")
    chunks = list(tar_directory(tmp_path))
    assert max(len(c) for c in chunks) <= 1 << 20
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"a", "a/b", "a/b/f.txt", "top.bin", "ln"}
        assert tar.extractfile("a/b/f.txt").read() == b"x" * 1000  # type: ignore[union-attr]
        assert members["ln"].issym() and members["ln"].linkname == "top.bin"
    reader = ChunkReader(iter([b"ab", b"cde", b"f"]))
    assert (reader.read(3), reader.read(1), reader.read(-1), reader.read(5)) == (b"abc", b"d", b"ef", b"")


def test_with_org_and_timeouts() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/exec"):
            return httpx.Response(200, json={"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "truncated": False})
        return httpx.Response(200, json={"snapshots": []})

    with Sandlane("http://fake/", "k", org="acme", timeout=5, transport=httpx.MockTransport(handler)) as client:
        other = client.with_org("globex")
        assert other.snapshots.list() == [] and client.snapshots.list(sandbox_id=SBX) == []
        assert [r.url.path for r in seen] == ["/v1/orgs/globex/snapshots", "/v1/orgs/acme/snapshots"]
        assert seen[1].url.params["sandbox_id"] == SBX
        assert seen[0].extensions["timeout"]["read"] == 5
        client.sandbox(SBX).exec(["true"], timeout_ms=120_000)
        assert seen[2].extensions["timeout"]["read"] == 150.0  # its own timeout, and slack
        client.sandbox(SBX).exec_stream(["true"])
    with pytest.raises(ValueError, match="org"):
        Sandlane("http://fake", "k", transport=httpx.MockTransport(handler)).snapshots.list()


def test_terminal_attach_refused_is_a_typed_error(fake_terminal_server: tuple[str, list[Any]]) -> None:
    url, _ = fake_terminal_server
    with Sandlane(url, "someone-else", org="acme") as client:
        with pytest.raises(PermissionDeniedError) as denied:
            client.sandbox(SBX).terminals.attach("term_9")
    assert denied.value.status == 403 and denied.value.message == "not your terminal"

    async def scenario() -> None:
        async with AsyncSandlane(url, "someone-else", org="acme") as client:
            with pytest.raises(PermissionDeniedError):
                await client.sandbox(SBX).terminals.attach("term_9")

    asyncio.run(scenario())


def test_the_version_is_the_packages() -> None:
    import re
    from pathlib import Path

    import sandlane

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    found = re.search(r'^version = "([^"]+)"$', pyproject, re.M)
    assert found is not None and sandlane.__version__ == found.group(1)

"""What the sync and async clients share: each route's request, body adapters, decoders.

Nothing here does I/O on the network: the clients send the :class:`Call` built here and
hand the answer back to the decoders here, so both clients speak the API the same way.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import IO, Any, AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence, Union
from urllib.parse import quote

from ._errors import SandlaneError, StreamInterruptedError, error_class_for
from ._models import AuditEvent, AuditPage, ExitFrame, Frame, OutputFrame

CHUNK_SIZE = 1 << 20
"""Bytes read from a file object at a time when streaming it up."""

NDJSON = "application/x-ndjson"
DEFAULT_EXEC_TIMEOUT_MS = 30_000
EXEC_TIMEOUT_SLACK_S = 30.0

Command = Union[str, Sequence[str]]
"""A command: an argv list, or a string run by ``/bin/sh -c``."""

Body = Union[bytes, bytearray, memoryview, str, IO[bytes], Iterable[bytes]]
"""A request body streamed up: bytes or text, a binary file object (read a chunk at a time)
or an iterable of byte chunks (a generator makes the bytes as they are sent)."""

AsyncBody = Union[Body, AsyncIterable[bytes]]
"""A body for the async client: any :data:`Body`, or an async iterable of byte chunks."""


@dataclass(frozen=True)
class Call:
    """One request: what to send and which statuses mean success."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (200,)
    read_timeout: float | None = None
    """Seconds to wait for the answer's bytes; ``None``: the client's timeout."""
    unbounded_read: bool = False
    """No read timeout: a stream that may stay silent as long as its command does."""


def seg(value: str | int) -> str:
    """One path segment, percent-encoded."""
    return quote(str(value), safe="")


def org_path(org: str, *parts: str | int) -> str:
    """``/v1/orgs/{org}/…`` with each part encoded."""
    return "/v1/orgs/" + "/".join([seg(org), *(seg(p) for p in parts)])


def sandbox_path(org: str, sandbox_id: str, *parts: str | int) -> str:
    """``/v1/orgs/{org}/sandboxes/{id}/…``."""
    return org_path(org, "sandboxes", sandbox_id, *parts)


def argv_of(command: Command) -> list[str]:
    """An argv: a string becomes ``["/bin/sh", "-c", command]``."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("argv must hold at least the program")
    return argv


def exec_body(command: Command, stdin: str | None, timeout_ms: int | None) -> dict[str, Any]:
    """The body of an exec or a process start."""
    body: dict[str, Any] = {"argv": argv_of(command)}
    if stdin is not None:
        body["stdin"] = stdin
    if timeout_ms is not None:
        body["timeout_ms"] = int(timeout_ms)
    return body


def exec_read_timeout(timeout_ms: int | None) -> float:
    """How long to wait for a buffered exec's answer: its own timeout and some slack."""
    ms = DEFAULT_EXEC_TIMEOUT_MS if timeout_ms is None else timeout_ms
    return ms / 1000.0 + EXEC_TIMEOUT_SLACK_S


# ---- routes ---------------------------------------------------------------------------


def ensure_session(org: str, session_id: str, execution_id: str, from_snapshot: str | None) -> Call:
    """``PUT /v1/orgs/{org}/sessions/{session_id}/sandbox``."""
    body: dict[str, Any] = {"execution_id": execution_id}
    if from_snapshot is not None:
        body["from_snapshot"] = from_snapshot
    return Call("PUT", org_path(org, "sessions", session_id, "sandbox"), json=body)


def ensure_workflow(org: str, execution_id: str, from_snapshot: str | None) -> Call:
    """``PUT /v1/orgs/{org}/workflow-executions/{execution_id}/sandbox``."""
    body = {"from_snapshot": from_snapshot} if from_snapshot is not None else None
    return Call("PUT", org_path(org, "workflow-executions", execution_id, "sandbox"), json=body)


def recover_workflow(org: str, execution_id: str) -> Call:
    """``POST …/workflow-executions/{execution_id}/sandbox/recover``."""
    return Call("POST", org_path(org, "workflow-executions", execution_id, "sandbox", "recover"))


def deprovision_session(org: str, session_id: str) -> Call:
    """``DELETE …/sessions/{session_id}/sandbox``."""
    return Call("DELETE", org_path(org, "sessions", session_id, "sandbox"), ok=(204,))


def deprovision_workflow(org: str, execution_id: str) -> Call:
    """``DELETE …/workflow-executions/{execution_id}/sandbox``."""
    return Call("DELETE", org_path(org, "workflow-executions", execution_id, "sandbox"), ok=(204,))


def read_sandbox(org: str, sandbox_id: str) -> Call:
    """``GET /v1/orgs/{org}/sandboxes/{sandbox_id}``."""
    return Call("GET", sandbox_path(org, sandbox_id))


def exec_buffered(org: str, sandbox_id: str, command: Command, stdin: str | None, timeout_ms: int | None) -> Call:
    """``POST …/exec``, the answer whole."""
    return Call(
        "POST",
        sandbox_path(org, sandbox_id, "exec"),
        json=exec_body(command, stdin, timeout_ms),
        read_timeout=exec_read_timeout(timeout_ms),
    )


def exec_streamed(org: str, sandbox_id: str, command: Command, stdin: str | None, timeout_ms: int | None) -> Call:
    """``POST …/exec`` with ``Accept: application/x-ndjson``."""
    return Call(
        "POST",
        sandbox_path(org, sandbox_id, "exec"),
        json=exec_body(command, stdin, timeout_ms),
        headers={"accept": NDJSON},
        unbounded_read=True,
    )


def start_process(org: str, sandbox_id: str, command: Command, stdin: str | None, timeout_ms: int | None) -> Call:
    """``POST …/processes``."""
    return Call("POST", sandbox_path(org, sandbox_id, "processes"), json=exec_body(command, stdin, timeout_ms), ok=(201,))


def list_processes(org: str, sandbox_id: str) -> Call:
    """``GET …/processes``."""
    return Call("GET", sandbox_path(org, sandbox_id, "processes"))


def get_process(org: str, sandbox_id: str, pid: int) -> Call:
    """``GET …/processes/{pid}``."""
    return Call("GET", sandbox_path(org, sandbox_id, "processes", pid))


def process_output(org: str, sandbox_id: str, pid: int, follow: bool) -> Call:
    """``GET …/processes/{pid}/output[?follow=true]``."""
    params = {"follow": "true"} if follow else {}
    return Call(
        "GET",
        sandbox_path(org, sandbox_id, "processes", pid, "output"),
        params=params,
        headers={"accept": NDJSON},
        unbounded_read=True,
    )


def process_stdin(org: str, sandbox_id: str, pid: int, close: bool) -> Call:
    """``POST …/processes/{pid}/stdin[?close=true]`` (the raw body is sent beside)."""
    params = {"close": "true"} if close else {}
    return Call(
        "POST",
        sandbox_path(org, sandbox_id, "processes", pid, "stdin"),
        params=params,
        headers={"content-type": "application/octet-stream"},
        ok=(204,),
    )


def signal_process(org: str, sandbox_id: str, pid: int, signal: str) -> Call:
    """``POST …/processes/{pid}/signal``."""
    if signal not in ("TERM", "INT", "KILL"):
        raise ValueError(f"signal must be TERM, INT or KILL, not {signal!r}")
    return Call("POST", sandbox_path(org, sandbox_id, "processes", pid, "signal"), json={"signal": signal}, ok=(204,))


def write_file(org: str, sandbox_id: str, path: str) -> Call:
    """``PUT …/files?path=P`` (the raw body is sent beside)."""
    return Call(
        "PUT",
        sandbox_path(org, sandbox_id, "files"),
        params={"path": path},
        headers={"content-type": "application/octet-stream"},
        unbounded_read=True,
    )


def read_file(org: str, sandbox_id: str, path: str) -> Call:
    """``GET …/files?path=P``: a file's bytes or a directory's listing."""
    return Call("GET", sandbox_path(org, sandbox_id, "files"), params={"path": path}, unbounded_read=True)


def delete_file(org: str, sandbox_id: str, path: str, recursive: bool) -> Call:
    """``DELETE …/files?path=P[&recursive=true]``."""
    params = {"path": path}
    if recursive:
        params["recursive"] = "true"
    return Call("DELETE", sandbox_path(org, sandbox_id, "files"), params=params, ok=(204,))


def put_archive(org: str, sandbox_id: str, path: str) -> Call:
    """``PUT …/archive?path=DIR`` (a tar streamed beside)."""
    return Call(
        "PUT",
        sandbox_path(org, sandbox_id, "archive"),
        params={"path": path},
        headers={"content-type": "application/x-tar"},
        unbounded_read=True,
    )


def get_archive(org: str, sandbox_id: str, path: str) -> Call:
    """``GET …/archive?path=DIR``."""
    return Call("GET", sandbox_path(org, sandbox_id, "archive"), params={"path": path}, unbounded_read=True)


def take_snapshot(org: str, sandbox_id: str, name: str | None) -> Call:
    """``POST …/snapshots``."""
    body = {"name": name} if name is not None else {}
    return Call("POST", sandbox_path(org, sandbox_id, "snapshots"), json=body, ok=(201,))


def restore(org: str, sandbox_id: str, snapshot_id: str) -> Call:
    """``POST …/restore``."""
    return Call("POST", sandbox_path(org, sandbox_id, "restore"), json={"snapshot": snapshot_id})


def list_snapshots(org: str, sandbox_id: str | None) -> Call:
    """``GET /v1/orgs/{org}/snapshots[?sandbox_id=…]``."""
    params = {"sandbox_id": sandbox_id} if sandbox_id is not None else {}
    return Call("GET", org_path(org, "snapshots"), params=params)


def get_snapshot(org: str, snapshot_id: str) -> Call:
    """``GET /v1/orgs/{org}/snapshots/{snapshot_id}``."""
    return Call("GET", org_path(org, "snapshots", snapshot_id))


def delete_snapshot(org: str, snapshot_id: str) -> Call:
    """``DELETE /v1/orgs/{org}/snapshots/{snapshot_id}``."""
    return Call("DELETE", org_path(org, "snapshots", snapshot_id), ok=(204,))


def audit_page(org: str, after: int, limit: int) -> Call:
    """``GET /v1/orgs/{org}/audit?after=SEQ&limit=N``."""
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be 1 to 1000")
    return Call("GET", org_path(org, "audit"), params={"after": str(after), "limit": str(limit)})


def audit_verify(org: str) -> Call:
    """``GET /v1/orgs/{org}/audit/verify``."""
    return Call("GET", org_path(org, "audit", "verify"))


def list_sandboxes(org: str, after: str | None, limit: int, ended: bool) -> Call:
    """``GET /v1/orgs/{org}/sandboxes?after=ID&limit=N&ended=BOOL`` (oldest first)."""
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be 1 to 1000")
    params = {"limit": str(limit), "ended": "true" if ended else "false"}
    if after is not None:
        params["after"] = after
    return Call("GET", org_path(org, "sandboxes"), params=params)


def webhook_deliveries(org: str, before: str | None, limit: int) -> Call:
    """``GET /v1/orgs/{org}/webhooks/deliveries?before=ID&limit=N`` (newest first)."""
    if not 1 <= limit <= 500:
        raise ValueError("limit must be 1 to 500")
    params = {"limit": str(limit)}
    if before is not None:
        params["before"] = before
    return Call("GET", org_path(org, "webhooks", "deliveries"), params=params)


def get_policy(org: str) -> Call:
    """``GET /v1/orgs/{org}/policy``."""
    return Call("GET", org_path(org, "policy"))


def put_secret(
    org: str,
    name: str,
    value: str,
    hosts: Sequence[str],
    scope: Mapping[str, Any],
    header: str | None,
    format: str | None,
    methods: Sequence[str] | None,
    paths: Sequence[str] | None,
) -> Call:
    """``PUT /v1/orgs/{org}/secrets/{name}``."""
    if isinstance(hosts, str):
        raise TypeError("hosts is a list of hosts, not one string")
    body: dict[str, Any] = {"value": value, "hosts": list(hosts), "scope": dict(scope)}
    if header is not None:
        body["header"] = header
    if format is not None:
        body["format"] = format
    if methods is not None:
        body["methods"] = list(methods)
    if paths is not None:
        body["paths"] = list(paths)
    return Call("PUT", org_path(org, "secrets", name), json=body, ok=(200, 201))


def list_secrets(org: str) -> Call:
    """``GET /v1/orgs/{org}/secrets``."""
    return Call("GET", org_path(org, "secrets"))


def delete_secret(org: str, name: str) -> Call:
    """``DELETE /v1/orgs/{org}/secrets/{name}``."""
    return Call("DELETE", org_path(org, "secrets", name), ok=(204,))


def introspect() -> Call:
    """``POST /v1/introspect`` (the form body is sent beside)."""
    return Call("POST", "/v1/introspect")


def create_terminal(org: str, sandbox_id: str, cols: int, rows: int, argv: Sequence[str] | None) -> Call:
    """``POST …/terminals`` (needs a server with terminals)."""
    body: dict[str, Any] = {"cols": int(cols), "rows": int(rows)}
    if argv is not None:
        body["argv"] = argv_of(argv)
    return Call("POST", sandbox_path(org, sandbox_id, "terminals"), json=body, ok=(201,))


def list_terminals(org: str, sandbox_id: str) -> Call:
    """``GET …/terminals``."""
    return Call("GET", sandbox_path(org, sandbox_id, "terminals"))


def delete_terminal(org: str, sandbox_id: str, terminal_id: str) -> Call:
    """``DELETE …/terminals/{tid}``."""
    return Call("DELETE", sandbox_path(org, sandbox_id, "terminals", terminal_id), ok=(204,))


def terminal_ticket(org: str, sandbox_id: str, terminal_id: str) -> Call:
    """``POST …/terminals/{tid}/tickets``."""
    return Call("POST", sandbox_path(org, sandbox_id, "terminals", terminal_id, "tickets"), ok=(200, 201))


def terminal_ws_url(base_url: str, org: str, sandbox_id: str, terminal_id: str) -> str:
    """The WebSocket URL that attaches to a terminal (``ws``/``wss`` for ``http``/``https``)."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + sandbox_path(org, sandbox_id, "terminals", terminal_id)


def create_preview_link(org: str, sandbox_id: str, port: int, ttl_s: int) -> Call:
    """``POST …/ports/{port}/links`` (needs a server with preview links)."""
    return Call("POST", sandbox_path(org, sandbox_id, "ports", int(port), "links"), json={"ttl_s": int(ttl_s)}, ok=(201,))


def list_preview_links(org: str, sandbox_id: str, port: int) -> Call:
    """``GET …/ports/{port}/links``: the port's links, revoked and expired ones too."""
    return Call("GET", sandbox_path(org, sandbox_id, "ports", int(port), "links"))


def delete_preview_link(org: str, sandbox_id: str, port: int, link_id: str) -> Call:
    """``DELETE …/ports/{port}/links/{link}``."""
    return Call("DELETE", sandbox_path(org, sandbox_id, "ports", int(port), "links", link_id), ok=(204,))


# ---- request bodies -------------------------------------------------------------------


def _size_of(file: IO[bytes]) -> int | None:
    """Bytes left in a seekable file object, when it can tell."""
    try:
        if file.seekable():
            here = file.tell()
            end = file.seek(0, os.SEEK_END)
            file.seek(here)
            return end - here
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _read_chunks(file: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = file.read(CHUNK_SIZE)
        if not chunk:
            return
        if not isinstance(chunk, (bytes, bytearray)):
            raise TypeError("file objects must be opened in binary mode")
        yield bytes(chunk)


def _checked_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"a body's chunks must be bytes, not {type(chunk).__name__}")
        if chunk:
            yield bytes(chunk)


async def _checked_async_chunks(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"a body's chunks must be bytes, not {type(chunk).__name__}")
        if chunk:
            yield bytes(chunk)


def sync_body(data: Body) -> tuple[bytes | Iterator[bytes], dict[str, str]]:
    """A body for httpx's sync client, and a ``Content-Length`` when the size is known.

    Bytes go whole; a file object is read a chunk at a time while it is sent; any other
    iterable is sent chunk by chunk as it yields (``Transfer-Encoding: chunked``).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), {}
    if isinstance(data, str):
        return data.encode("utf-8"), {}
    if hasattr(data, "read"):
        file: IO[bytes] = data  # type: ignore[assignment]
        size = _size_of(file)
        headers = {"content-length": str(size)} if size is not None else {}
        return _read_chunks(file), headers
    if isinstance(data, io.TextIOBase):  # pragma: no cover - caught by hasattr above
        raise TypeError("file objects must be opened in binary mode")
    return _checked_chunks(data), {}


def async_body(data: AsyncBody) -> tuple[bytes | AsyncIterator[bytes], dict[str, str]]:
    """A body for httpx's async client (sync iterables and files are read as sent)."""
    if isinstance(data, AsyncIterable):
        return _checked_async_chunks(data), {}
    content, headers = sync_body(data)
    if isinstance(content, bytes):
        return content, headers

    async def relay(chunks: Iterator[bytes] = content) -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return relay(), headers


# ---- decoders -------------------------------------------------------------------------


class NdjsonDecoder:
    """Splits a byte stream into JSON lines, whatever the chunks' boundaries."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[Any]:
        """The complete lines in ``chunk`` and what came before it, decoded."""
        self._buf += chunk
        out: list[Any] = []
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(self._buf[start:end]).strip()
            start = end + 1
            if line:
                out.append(json.loads(line))
        del self._buf[:start]
        return out

    def finish(self) -> list[Any]:
        """A last line without its newline, if any."""
        line = bytes(self._buf).strip()
        self._buf.clear()
        return [json.loads(line)] if line else []


class FrameDecoder:
    """Decodes a streamed output (exec, a process's output) into frames.

    An ``error`` line raises the typed error of its code (``status`` 200: the stream had
    begun); a stream that ends without its ``exit`` line, when one is due, raises
    :class:`StreamInterruptedError`. Lines of unknown types are skipped.
    """

    def __init__(self, require_exit: bool) -> None:
        self._lines = NdjsonDecoder()
        self._require_exit = require_exit
        self.exit: ExitFrame | None = None

    def feed(self, chunk: bytes) -> list[Frame]:
        """The frames completed by ``chunk``."""
        return [f for f in (self._frame(o) for o in self._lines.feed(chunk)) if f is not None]

    def finish(self) -> list[Frame]:
        """The last frames, once the stream has ended; raises if it ended early."""
        frames = [f for f in (self._frame(o) for o in self._lines.finish()) if f is not None]
        if self._require_exit and self.exit is None:
            raise StreamInterruptedError("the output stream ended before its exit line")
        return frames

    def _frame(self, obj: Any) -> Frame | None:
        if not isinstance(obj, dict):
            raise StreamInterruptedError(f"not a frame: {obj!r}")
        kind = obj.get("type")
        if kind in ("stdout", "stderr"):
            return OutputFrame.from_json(obj)
        if kind == "exit":
            self.exit = ExitFrame.from_json(obj)
            return self.exit
        if kind == "error":
            code = str(obj.get("error", ""))
            raise error_class_for(code)(str(obj.get("message", "")), code=code, status=200, body=obj)
        return None


class AuditCursor:
    """Follows ``next`` from page to page, yielding each event once, in ``seq`` order."""

    def __init__(self, after: int) -> None:
        self.after = after

    def accept(self, page: AuditPage) -> list[AuditEvent]:
        """The page's events not seen yet; moves the cursor to the page's ``next``."""
        fresh = [e for e in page.events if e.seq > self.after]
        if fresh:
            self.after = max(self.after, fresh[-1].seq)
        self.after = max(self.after, page.next)
        return fresh


def json_or_none(content: bytes) -> Any:
    """A body decoded as JSON (``None`` when empty)."""
    return json.loads(content) if content else None


def ensure_outcome(raw: Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None, str | None]:
    """An ensure's answer: its outcome, the sandbox's JSON when ready, the message when failed."""
    outcome = str(raw.get("outcome", ""))
    if outcome == "ready":
        return outcome, raw["sandbox"], None
    if outcome == "failed":
        return outcome, None, str(raw.get("message", ""))
    if outcome == "disabled":
        return outcome, None, None
    raise SandlaneError(f"an ensure answered an unknown outcome: {outcome!r}")


def terminals_of(raw: Any) -> list[Mapping[str, Any]]:
    """A terminal listing: ``{"terminals": [...]}`` (or a bare list)."""
    if isinstance(raw, dict):
        raw = raw.get("terminals", [])
    return [t for t in raw if isinstance(t, dict)]

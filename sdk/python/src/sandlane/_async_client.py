"""The asynchronous client: :class:`AsyncSandlane` and the :class:`AsyncSandbox` handle.

The same routes, requests and decoders as the sync client (:mod:`sandlane._core`), sent
with ``httpx.AsyncClient``; streams are async iterators.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from types import TracebackType
from typing import IO, Any, AsyncIterator, Callable, Mapping, Sequence
from urllib.parse import urlencode

import httpx

from . import _core as core
from ._client import DEFAULT_TIMEOUT, USER_AGENT, PathLike, _expect_file, _timeout_for, _transport_errors
from ._errors import StreamInterruptedError, error_from_body
from ._models import (
    AuditEvent,
    AuditPage,
    AuditVerdict,
    SandboxListPage,
    WebhookDeliveryPage,
    DirEntry,
    EnsureResult,
    ExecResult,
    ExitFrame,
    FileInfo,
    Frame,
    Health,
    Introspection,
    OutputFrame,
    Policy,
    PreviewLink,
    Process,
    SandboxInfo,
    Scope,
    Secret,
    SecretPutResult,
    Snapshot,
    TerminalInfo,
    TerminalTicket,
    Unpacked,
)
from ._tar import extract_stream, tar_directory
from ._terminal import AsyncTerminalSession, auth_headers, refused_error, require_websockets

__all__ = ["AsyncSandlane", "AsyncSandbox", "AsyncFrameStream", "AsyncByteStream"]


class AsyncFrameStream:
    """A streamed output, async: ``async for frame in stream`` (see :class:`sandlane.FrameStream`)."""

    def __init__(self, client: AsyncSandlane, call: core.Call, require_exit: bool) -> None:
        self._client = client
        self._call = call
        self._decoder = core.FrameDecoder(require_exit)
        self._response: httpx.Response | None = None
        self._started = False

    @property
    def exit(self) -> ExitFrame | None:
        """The exit frame, once it has been read."""
        return self._decoder.exit

    async def _open(self) -> httpx.Response:
        if self._response is None:
            if self._started:
                raise RuntimeError("a stream can be read once")
            self._started = True
            self._response = await self._client._open(self._call)
        return self._response

    async def __aenter__(self) -> AsyncFrameStream:
        await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def __aiter__(self) -> AsyncIterator[Frame]:
        """The frames, as they arrive (sends the request if ``async with`` did not)."""
        response = await self._open()
        try:
            with _transport_errors(streaming=True):
                async for chunk in response.aiter_bytes():
                    for frame in self._decoder.feed(chunk):
                        yield frame
            for frame in self._decoder.finish():
                yield frame
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Free the connection (a streamed exec's command ends with it)."""
        if self._response is not None:
            await self._response.aclose()

    async def wait(self) -> ExitFrame:
        """Read to the end, dropping the output; the exit frame."""
        async for _ in self:
            pass
        if self.exit is None:
            raise StreamInterruptedError("the stream ended without an exit line")
        return self.exit

    async def collect(self) -> tuple[bytes, bytes, ExitFrame | None]:
        """Read to the end: ``(stdout bytes, stderr bytes, exit frame)``."""
        out, err = bytearray(), bytearray()
        async for frame in self:
            if isinstance(frame, OutputFrame):
                (out if frame.stream == "stdout" else err).extend(frame.data)
        return bytes(out), bytes(err), self.exit


class AsyncByteStream:
    """A streamed download, async: ``async for chunk in stream`` (see :class:`sandlane.ByteStream`)."""

    def __init__(
        self, client: AsyncSandlane, call: core.Call, check: Callable[[httpx.Response], None] | None = None
    ) -> None:
        self._client = client
        self._call = call
        self._check = check
        self._response: httpx.Response | None = None
        self._started = False

    async def _open(self) -> httpx.Response:
        if self._response is None:
            if self._started:
                raise RuntimeError("a stream can be read once")
            self._started = True
            response = await self._client._open(self._call)
            if self._check is not None:
                try:
                    self._check(response)
                except BaseException:
                    await response.aclose()
                    raise
            self._response = response
        return self._response

    async def content_length(self) -> int | None:
        """The size the server announced, when it did (opens the stream)."""
        value = (await self._open()).headers.get("content-length")
        return int(value) if value is not None else None

    async def __aenter__(self) -> AsyncByteStream:
        await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The bytes, a chunk at a time as they arrive."""
        return self.aiter_bytes()

    async def aiter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The bytes, a chunk at a time."""
        response = await self._open()
        try:
            with _transport_errors(streaming=True):
                async for chunk in response.aiter_bytes(chunk_size):
                    yield chunk
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        """Every byte, held whole: for small files only."""
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def save(self, dest: PathLike | IO[bytes]) -> int:
        """Write the bytes to a path or a binary file object; the number written."""
        total = 0
        if hasattr(dest, "write"):
            out: IO[bytes] = dest  # type: ignore[assignment]
            async for chunk in self.aiter_bytes():
                out.write(chunk)
                total += len(chunk)
            return total
        with open(dest, "wb") as f:
            async for chunk in self.aiter_bytes():
                f.write(chunk)
                total += len(chunk)
        return total

    async def aclose(self) -> None:
        """Free the connection."""
        if self._response is not None:
            await self._response.aclose()


class AsyncSandlane:
    """A client of a sandlane server (asynchronous); the same arguments as :class:`sandlane.Sandlane`.

    >>> async with AsyncSandlane("http://127.0.0.1:7878", key, org="acme") as client:
    ...     sbx = (await client.ensure_session("s1", execution_id="exec-1")).require_sandbox()
    ...     async for frame in sbx.exec_stream("echo hello"):
    ...         print(frame)
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        org: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        base_url = base_url or os.environ.get("SANDLANE_BASE_URL")
        api_key = api_key or os.environ.get("SANDLANE_API_KEY")
        if not base_url:
            raise ValueError("base_url is required (or set SANDLANE_BASE_URL)")
        if not api_key:
            raise ValueError("api_key is required (or set SANDLANE_API_KEY)")
        self.base_url: str = base_url.rstrip("/")
        self._api_key = api_key
        self._org = org or os.environ.get("SANDLANE_ORG")
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        all_headers = {"authorization": f"Bearer {api_key}", "user-agent": USER_AGENT}
        all_headers.update(headers or {})
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            base_url=self.base_url, headers=all_headers, timeout=self._timeout, transport=transport
        )
        if http_client is not None:
            self._http.base_url = httpx.URL(self.base_url)
            self._http.headers.update(all_headers)
        self.snapshots: AsyncSnapshots = AsyncSnapshots(self)
        """Snapshots of the org."""
        self.secrets: AsyncSecrets = AsyncSecrets(self)
        """Brokered secrets of the org."""
        self.audit: AsyncAudit = AsyncAudit(self)
        self.webhooks: AsyncWebhooks = AsyncWebhooks(self)
        """The org's audit log (service callers)."""

    @property
    def org(self) -> str:
        """The org this client acts in."""
        if not self._org:
            raise ValueError("no org: pass org= (or set SANDLANE_ORG), or use with_org()")
        return self._org

    def with_org(self, org: str) -> AsyncSandlane:
        """A client for another org, sharing this one's connections (close this one, not it)."""
        other = AsyncSandlane(self.base_url, self._api_key, org=org, timeout=self._timeout, http_client=self._http)
        other._owns_http = False
        return other

    async def aclose(self) -> None:
        """Close the connections."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSandlane:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _open(
        self, call: core.Call, content: Any = None, extra_headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        headers = dict(call.headers)
        headers.update(extra_headers or {})
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params or None,
            json=call.json if content is None else None,
            content=content,
            headers=headers,
            timeout=_timeout_for(self._timeout, call),
        )
        with _transport_errors():
            response = await self._http.send(request, stream=True)
        if response.status_code not in call.ok:
            try:
                with _transport_errors():
                    body = await response.aread()
            finally:
                await response.aclose()
            raise error_from_body(response.status_code, body)
        return response

    async def _send(
        self, call: core.Call, body: core.AsyncBody | None = None, form: Mapping[str, str] | None = None
    ) -> httpx.Response:
        content: Any = None
        extra: dict[str, str] = {}
        if body is not None:
            content, extra = core.async_body(body)
        elif form is not None:
            content = urlencode(dict(form)).encode()
            extra = {"content-type": "application/x-www-form-urlencoded"}
        response = await self._open(call, content, extra)
        try:
            with _transport_errors(streaming=True):
                await response.aread()
        finally:
            await response.aclose()
        return response

    async def _json(self, call: core.Call, body: core.AsyncBody | None = None) -> Any:
        return core.json_or_none((await self._send(call, body)).content)

    def _ensure_result(self, raw: Mapping[str, Any]) -> EnsureResult[AsyncSandbox]:
        outcome, sandbox, message = core.ensure_outcome(raw)
        handle = None if sandbox is None else AsyncSandbox(self, SandboxInfo.from_json(sandbox))
        return EnsureResult(outcome=outcome, sandbox=handle, message=message)

    async def ensure_session(
        self, session_id: str, execution_id: str, *, from_snapshot: str | None = None
    ) -> EnsureResult[AsyncSandbox]:
        """Ensure the session's sandbox (see :meth:`sandlane.Sandlane.ensure_session`)."""
        raw = await self._json(core.ensure_session(self.org, session_id, execution_id, from_snapshot))
        return self._ensure_result(raw)

    async def ensure_workflow(self, execution_id: str, *, from_snapshot: str | None = None) -> EnsureResult[AsyncSandbox]:
        """Ensure a workflow execution's sandbox (critical: a failure raises :class:`UnavailableError`)."""
        return self._ensure_result(await self._json(core.ensure_workflow(self.org, execution_id, from_snapshot)))

    async def recover_workflow(self, execution_id: str) -> EnsureResult[AsyncSandbox]:
        """A fresh sandbox for a workflow execution recovered from FAILED."""
        return self._ensure_result(await self._json(core.recover_workflow(self.org, execution_id)))

    async def deprovision_session(self, session_id: str) -> None:
        """Deprovision the session's sandbox (idempotent)."""
        await self._send(core.deprovision_session(self.org, session_id))

    async def deprovision_workflow(self, execution_id: str) -> None:
        """Deprovision a workflow execution's sandbox (idempotent)."""
        await self._send(core.deprovision_workflow(self.org, execution_id))

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """Read a sandbox; a handle holding what was read."""
        return AsyncSandbox(self, SandboxInfo.from_json(await self._json(core.read_sandbox(self.org, sandbox_id))))

    def sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on a sandbox by id, without a request."""
        return AsyncSandbox(self, sandbox_id)

    async def policy(self) -> Policy:
        """The org's effective policy (service callers)."""
        return Policy.from_json(await self._json(core.get_policy(self.org)))

    async def list_sandboxes(
        self, *, after: str | None = None, limit: int = 100, ended: bool = False
    ) -> SandboxListPage:
        """One page of the org's sandboxes (service callers), oldest first."""
        return SandboxListPage.from_json(await self._json(core.list_sandboxes(self.org, after, limit, ended)))

    async def introspect(self, token: str) -> Introspection:
        """Introspect a sandbox token (RFC 7662)."""
        response = await self._send(core.introspect(), form={"token": token})
        return Introspection.from_json(response.json())

    async def health(self) -> Health:
        """``GET /healthz``."""
        return Health.from_json(await self._json(core.Call("GET", "/healthz")), ok=True)

    async def ready(self) -> Health:
        """``GET /readyz``: ``ok`` is False (not raised) when the server is not ready."""
        response = await self._send(core.Call("GET", "/readyz", ok=(200, 503)))
        return Health.from_json(response.json(), ok=response.status_code == 200)

    async def jwks(self) -> dict[str, Any]:
        """The public keys that verify sandbox tokens."""
        result: dict[str, Any] = await self._json(core.Call("GET", "/.well-known/jwks.json"))
        return result

    async def metrics(self) -> str:
        """The OpenMetrics text."""
        return (await self._send(core.Call("GET", "/metrics"))).text

    async def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document."""
        result: dict[str, Any] = await self._json(core.Call("GET", "/openapi.json"))
        return result


class AsyncSandbox:
    """A sandbox, async (see :class:`sandlane.Sandbox`)."""

    def __init__(self, client: AsyncSandlane, sandbox: SandboxInfo | str) -> None:
        self._client = client
        self.info: SandboxInfo | None = sandbox if isinstance(sandbox, SandboxInfo) else None
        self.id: str = sandbox.id if isinstance(sandbox, SandboxInfo) else sandbox
        self.org: str = sandbox.org if isinstance(sandbox, SandboxInfo) else client.org
        self.files: AsyncFiles = AsyncFiles(self)
        """Files and archives in the sandbox."""
        self.processes: AsyncProcesses = AsyncProcesses(self)
        """Background processes."""
        self.terminals: AsyncTerminals = AsyncTerminals(self)
        """Terminals (needs a server with terminals)."""
        self.preview_links: AsyncPreviewLinks = AsyncPreviewLinks(self)
        """Preview links (needs a server with preview links)."""

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, org={self.org!r})"

    async def refresh(self) -> SandboxInfo:
        """Read the sandbox again; updates and returns ``info``."""
        self.info = SandboxInfo.from_json(await self._client._json(core.read_sandbox(self.org, self.id)))
        return self.info

    async def exec(self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None) -> ExecResult:
        """Run a command and wait for it (see :meth:`sandlane.Sandbox.exec`)."""
        raw = await self._client._json(core.exec_buffered(self.org, self.id, command, stdin, timeout_ms))
        return ExecResult.from_json(raw)

    def exec_stream(
        self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None
    ) -> AsyncFrameStream:
        """Run a command, its output streamed: ``async for frame in sbx.exec_stream(...)``."""
        call = core.exec_streamed(self.org, self.id, command, stdin, timeout_ms)
        return AsyncFrameStream(self._client, call, require_exit=True)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Snapshot the workspace."""
        return Snapshot.from_json(await self._client._json(core.take_snapshot(self.org, self.id, name)))

    async def restore(self, snapshot: str | Snapshot) -> SandboxInfo:
        """Make the workspace a snapshot's files; the sandbox restarts under the same id."""
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        raw = await self._client._json(core.restore(self.org, self.id, snapshot_id))
        self.info = SandboxInfo.from_json(raw["sandbox"])
        return self.info

    async def deprovision(self) -> None:
        """Deprovision this sandbox's key."""
        info = self.info or await self.refresh()
        if info.kind == "workflow":
            await self._client.deprovision_workflow(info.key)
        else:
            await self._client.deprovision_session(info.key)


class AsyncFiles:
    """Files and archives of one sandbox, async (see :class:`sandlane._client.Files`)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def write(self, path: str, data: core.AsyncBody) -> FileInfo:
        """Write a file from bytes, text, a binary file object, or a (sync or async) iterable of chunks."""
        s = self._s
        return FileInfo.from_json(await s._client._json(core.write_file(s.org, s.id, path), body=data))

    def read(self, path: str) -> AsyncByteStream:
        """A file's bytes, streamed: ``async for chunk in sbx.files.read(path)``."""
        s = self._s
        return AsyncByteStream(s._client, core.read_file(s.org, s.id, path), check=_expect_file(path))

    async def read_bytes(self, path: str) -> bytes:
        """A (small) file's bytes, whole."""
        return await self.read(path).read()

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A (small) file's text."""
        return (await self.read_bytes(path)).decode(encoding)

    async def download(self, path: str, dest: PathLike | IO[bytes]) -> int:
        """Stream a file to a local path or binary file object; the bytes written."""
        return await self.read(path).save(dest)

    async def list(self, path: str = "/workspace") -> list[DirEntry]:
        """A directory's entries, sorted by name."""
        s = self._s
        response = await s._client._send(core.read_file(s.org, s.id, path))
        if not response.headers.get("content-type", "").startswith("application/json"):
            raise NotADirectoryError(path)
        return [DirEntry.from_json(e) for e in response.json()["entries"]]

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file, a symlink or an empty directory (``recursive``: a whole tree)."""
        s = self._s
        await s._client._send(core.delete_file(s.org, s.id, path, recursive))

    async def upload_archive(self, path: str, tar: core.AsyncBody) -> Unpacked:
        """Unpack a tar, streamed up, into directory ``path``."""
        s = self._s
        return Unpacked.from_json(await s._client._json(core.put_archive(s.org, s.id, path), body=tar))

    def download_archive(self, path: str) -> AsyncByteStream:
        """A tar of directory ``path``, streamed."""
        s = self._s
        return AsyncByteStream(s._client, core.get_archive(s.org, s.id, path))

    async def upload_dir(self, local_dir: PathLike, path: str) -> Unpacked:
        """Copy a local directory's contents into directory ``path`` (a tar made as it is sent)."""
        return await self.upload_archive(path, tar_directory(local_dir))

    async def download_dir(self, path: str, local_dir: PathLike) -> int:
        """Copy directory ``path`` into a local directory (created); the entries unpacked.

        The tar is spooled to a temporary file as it arrives, then unpacked with
        :mod:`tarfile`'s ``data`` filter.
        """
        with tempfile.TemporaryFile() as spool:
            await self.download_archive(path).save(spool)
            spool.seek(0)
            return extract_stream(iter(lambda: spool.read(1 << 20), b""), local_dir)


class AsyncProcesses:
    """Background processes of one sandbox, async."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def start(self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None) -> Process:
        """Start a process."""
        s = self._s
        return Process.from_json(await s._client._json(core.start_process(s.org, s.id, command, stdin, timeout_ms)))

    async def list(self) -> list[Process]:
        """Running processes and ended ones still kept."""
        s = self._s
        raw = await s._client._json(core.list_processes(s.org, s.id))
        return [Process.from_json(p) for p in raw["processes"]]

    async def get(self, pid: int) -> Process:
        """One process."""
        s = self._s
        return Process.from_json(await s._client._json(core.get_process(s.org, s.id, pid)))

    def output(self, pid: int, *, follow: bool = True) -> AsyncFrameStream:
        """Its output from the start, then with ``follow`` as it arrives until the exit frame."""
        s = self._s
        return AsyncFrameStream(s._client, core.process_output(s.org, s.id, pid, follow), require_exit=follow)

    async def wait(self, pid: int) -> ExitFrame:
        """Follow its output until it ends; its exit frame."""
        async with self.output(pid, follow=True) as stream:
            return await stream.wait()

    async def write_stdin(self, pid: int, data: core.AsyncBody, *, close: bool = False) -> None:
        """Write to its input (then close it, with ``close``)."""
        s = self._s
        await s._client._send(core.process_stdin(s.org, s.id, pid, close), body=data)

    async def close_stdin(self, pid: int) -> None:
        """Close its input."""
        await self.write_stdin(pid, b"", close=True)

    async def signal(self, pid: int, signal: str = "TERM") -> None:
        """Send ``TERM``, ``INT`` or ``KILL`` to its process group."""
        s = self._s
        await s._client._send(core.signal_process(s.org, s.id, pid, signal))

    async def kill(self, pid: int) -> None:
        """Send ``KILL``."""
        await self.signal(pid, "KILL")


class AsyncTerminals:
    """Terminals of one sandbox, async (needs a server with terminals and ``sandlane[terminal]``)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def create(self, *, cols: int = 80, rows: int = 24, argv: Sequence[str] | None = None) -> TerminalInfo:
        """Start a terminal."""
        s = self._s
        return TerminalInfo.from_json(await s._client._json(core.create_terminal(s.org, s.id, cols, rows, argv)))

    async def list(self) -> list[TerminalInfo]:
        """The sandbox's terminals."""
        s = self._s
        raw = await s._client._json(core.list_terminals(s.org, s.id))
        return [TerminalInfo.from_json(t) for t in core.terminals_of(raw)]

    async def delete(self, terminal_id: str) -> None:
        """End a terminal."""
        s = self._s
        await s._client._send(core.delete_terminal(s.org, s.id, terminal_id))

    async def ticket(self, terminal_id: str) -> TerminalTicket:
        """A short-lived ticket that attaches to the terminal (for a browser)."""
        s = self._s
        return TerminalTicket.from_json(await s._client._json(core.terminal_ticket(s.org, s.id, terminal_id)))

    async def attach(self, terminal_id: str, *, open_timeout: float = 10.0) -> AsyncTerminalSession:
        """Attach to a terminal: its last 64 KiB of output are replayed first."""
        require_websockets()
        from websockets.asyncio.client import connect

        s = self._s
        url = core.terminal_ws_url(s._client.base_url, s.org, s.id, terminal_id)
        try:
            connection = await connect(
                url, additional_headers=auth_headers(s._client._api_key), open_timeout=open_timeout, max_size=None
            )
        except Exception as exc:
            typed = refused_error(exc)
            if typed is exc:
                raise
            raise typed from exc
        return AsyncTerminalSession(connection)


class AsyncPreviewLinks:
    """Preview links to a sandbox's ports, async (needs a server with preview links)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def create(self, port: int, *, ttl_s: int) -> PreviewLink:
        """A link to ``port`` that expires after ``ttl_s`` seconds."""
        s = self._s
        return PreviewLink.from_json(await s._client._json(core.create_preview_link(s.org, s.id, port, ttl_s)))

    async def list(self, port: int) -> list[PreviewLink]:
        """The port's links, oldest first, revoked and expired ones too (their ``url`` without a token)."""
        s = self._s
        raw = await s._client._json(core.list_preview_links(s.org, s.id, port))
        return [PreviewLink.from_json(link) for link in raw["links"]]

    async def delete(self, port: int, link_id: str) -> None:
        """Revoke a link."""
        s = self._s
        await s._client._send(core.delete_preview_link(s.org, s.id, port, link_id))


class AsyncSnapshots:
    """Snapshots of the client's org, async."""

    def __init__(self, client: AsyncSandlane) -> None:
        self._c = client

    async def list(self, *, sandbox_id: str | None = None) -> list[Snapshot]:
        """Snapshots, oldest first."""
        raw = await self._c._json(core.list_snapshots(self._c.org, sandbox_id))
        return [Snapshot.from_json(x) for x in raw["snapshots"]]

    async def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot."""
        return Snapshot.from_json(await self._c._json(core.get_snapshot(self._c.org, snapshot_id)))

    async def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot."""
        await self._c._send(core.delete_snapshot(self._c.org, snapshot_id))


class AsyncSecrets:
    """Brokered secrets of the client's org, async."""

    def __init__(self, client: AsyncSandlane) -> None:
        self._c = client

    async def put(
        self,
        name: str,
        value: str,
        *,
        hosts: Sequence[str],
        scope: Scope,
        header: str | None = None,
        format: str | None = None,
        methods: Sequence[str] | None = None,
        paths: Sequence[str] | None = None,
    ) -> SecretPutResult:
        """Make or replace a secret."""
        call = core.put_secret(self._c.org, name, value, hosts, scope, header, format, methods, paths)
        response = await self._c._send(call)
        return SecretPutResult(secret=Secret.from_json(response.json()), created=response.status_code == 201)

    async def list(self) -> list[Secret]:
        """The secrets the caller may see."""
        return [Secret.from_json(x) for x in (await self._c._json(core.list_secrets(self._c.org)))["secrets"]]

    async def delete(self, name: str) -> None:
        """Delete a secret."""
        await self._c._send(core.delete_secret(self._c.org, name))


class AsyncWebhooks:
    """The org's webhook deliveries, async (service callers)."""

    def __init__(self, client: AsyncSandlane) -> None:
        self._c = client

    async def deliveries(self, *, before: str | None = None, limit: int = 50) -> WebhookDeliveryPage:
        """One page of deliveries, newest first (see :meth:`sandlane._client.Webhooks.deliveries`)."""
        return WebhookDeliveryPage.from_json(
            await self._c._json(core.webhook_deliveries(self._c.org, before, limit))
        )


class AsyncAudit:
    """The org's audit log, async (service callers)."""

    def __init__(self, client: AsyncSandlane) -> None:
        self._c = client

    async def page(self, *, after: int = 0, limit: int = 100) -> AuditPage:
        """One page of events after ``after``."""
        return AuditPage.from_json(await self._c._json(core.audit_page(self._c.org, after, limit)))

    async def verify(self) -> AuditVerdict:
        """What ``sandlane audit verify`` says of the log now."""
        return AuditVerdict.from_json(await self._c._json(core.audit_verify(self._c.org)))

    async def tail(
        self,
        *,
        after: int = 0,
        limit: int = 1000,
        follow: bool = False,
        poll_interval: float = 1.0,
        idle_timeout: float | None = None,
    ) -> AsyncIterator[AuditEvent]:
        """Every event after ``after``, each exactly once, in order (see :meth:`sandlane._client.Audit.tail`)."""
        cursor = core.AuditCursor(after)
        last_event = time.monotonic()
        while True:
            fresh = cursor.accept(await self.page(after=cursor.after, limit=limit))
            for event in fresh:
                yield event
            if fresh:
                last_event = time.monotonic()
                continue
            if not follow:
                return
            if idle_timeout is not None and time.monotonic() - last_event >= idle_timeout:
                return
            await asyncio.sleep(poll_interval)

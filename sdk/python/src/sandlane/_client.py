"""The synchronous client: :class:`Sandlane` and the :class:`Sandbox` handle."""

from __future__ import annotations

import inspect
import os
import time
from types import TracebackType
from typing import IO, Any, Callable, Iterator, Mapping, Sequence, Union
from urllib.parse import urlencode

import httpx

from . import _core as core
from ._errors import (
    SandlaneConnectionError,
    SandlaneError,
    SandlaneTimeoutError,
    StreamInterruptedError,
    error_from_body,
)
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
from ._terminal import TerminalSession, auth_headers, refused_error, require_websockets
from ._version import __version__

__all__ = ["Sandlane", "Sandbox", "FrameStream", "ByteStream"]

DEFAULT_TIMEOUT = 60.0
USER_AGENT = f"sandlane-python/{__version__}"

PathLike = Union[str, "os.PathLike[str]"]


def _timeout_for(base: httpx.Timeout, call: core.Call) -> httpx.Timeout:
    """The client's timeout, with the call's own read timeout (none for a stream)."""
    if call.unbounded_read:
        return httpx.Timeout(connect=base.connect, read=None, write=base.write, pool=base.pool)
    if call.read_timeout is not None:
        return httpx.Timeout(connect=base.connect, read=call.read_timeout, write=base.write, pool=base.pool)
    return base


class FrameStream:
    """A streamed output (a streamed exec, a process's output): iterate it for frames.

    Frames are :class:`OutputFrame` (``stream`` and exact ``data`` bytes) and, last, one
    :class:`ExitFrame`. The request is sent when iteration begins (or on ``with``), so an
    error before the first frame (a sandbox not ready, no permission) raises then, as its
    typed error; an ``error`` line raises its typed error too. Close it (``with``, or
    iterate to the end) to free the connection; closing early ends a streamed exec's
    command (never a background process).
    """

    def __init__(self, client: Sandlane, call: core.Call, require_exit: bool) -> None:
        self._client = client
        self._call = call
        self._decoder = core.FrameDecoder(require_exit)
        self._response: httpx.Response | None = None
        self._started = False

    @property
    def exit(self) -> ExitFrame | None:
        """The exit frame, once it has been read."""
        return self._decoder.exit

    def _open(self) -> httpx.Response:
        if self._response is None:
            if self._started:
                raise RuntimeError("a stream can be read once")
            self._started = True
            self._response = self._client._open(self._call)
        return self._response

    def __enter__(self) -> FrameStream:
        self._open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Frame]:
        """The frames, as they arrive (sends the request if ``with`` did not)."""
        response = self._open()
        try:
            with _transport_errors(streaming=True):
                for chunk in response.iter_bytes():
                    yield from self._decoder.feed(chunk)
            yield from self._decoder.finish()
        finally:
            self.close()

    def close(self) -> None:
        """Free the connection (a streamed exec's command ends with it)."""
        if self._response is not None:
            self._response.close()

    def wait(self) -> ExitFrame:
        """Read to the end, dropping the output; the exit frame."""
        for _ in self:
            pass
        if self.exit is None:
            raise StreamInterruptedError("the stream ended without an exit line")
        return self.exit

    def collect(self) -> tuple[bytes, bytes, ExitFrame | None]:
        """Read to the end: ``(stdout bytes, stderr bytes, exit frame)``."""
        out, err = bytearray(), bytearray()
        for frame in self:
            if isinstance(frame, OutputFrame):
                (out if frame.stream == "stdout" else err).extend(frame.data)
        return bytes(out), bytes(err), self.exit


class ByteStream:
    """A streamed download (a file, an archive): iterate it for chunks of bytes.

    Nothing is held whole unless :meth:`read` is called. The request is sent when
    iteration begins (or on ``with``); a transfer that breaks off raises
    :class:`StreamInterruptedError`, never passes for a whole one.
    """

    def __init__(self, client: Sandlane, call: core.Call, check: Callable[[httpx.Response], None] | None = None) -> None:
        self._client = client
        self._call = call
        self._check = check
        self._response: httpx.Response | None = None
        self._started = False

    def _open(self) -> httpx.Response:
        if self._response is None:
            if self._started:
                raise RuntimeError("a stream can be read once")
            self._started = True
            response = self._client._open(self._call)
            if self._check is not None:
                try:
                    self._check(response)
                except BaseException:
                    response.close()
                    raise
            self._response = response
        return self._response

    @property
    def content_length(self) -> int | None:
        """The size the server announced, when it did (opens the stream)."""
        value = self._open().headers.get("content-length")
        return int(value) if value is not None else None

    def __enter__(self) -> ByteStream:
        self._open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        """The bytes, a chunk at a time as they arrive."""
        return self.iter_bytes()

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """The bytes, a chunk at a time (``chunk_size`` bytes each but the last, when given)."""
        response = self._open()
        try:
            with _transport_errors(streaming=True):
                yield from response.iter_bytes(chunk_size)
        finally:
            self.close()

    def read(self) -> bytes:
        """Every byte, held whole: for small files only."""
        return b"".join(self.iter_bytes())

    def save(self, dest: PathLike | IO[bytes]) -> int:
        """Write the bytes to a path or a binary file object; the number written."""
        total = 0
        if hasattr(dest, "write"):
            out: IO[bytes] = dest  # type: ignore[assignment]
            for chunk in self.iter_bytes():
                out.write(chunk)
                total += len(chunk)
            return total
        with open(dest, "wb") as f:
            for chunk in self.iter_bytes():
                f.write(chunk)
                total += len(chunk)
        return total

    def close(self) -> None:
        """Free the connection."""
        if self._response is not None:
            self._response.close()


class _transport_errors:
    """Turns httpx's transport errors into this package's errors."""

    def __init__(self, streaming: bool = False) -> None:
        self._streaming = streaming

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, SandlaneError):
            return
        if isinstance(exc, httpx.TimeoutException):
            raise SandlaneTimeoutError(f"timed out: {exc}") from exc
        if self._streaming and isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.StreamError)):
            raise StreamInterruptedError(f"the transfer broke off: {exc}") from exc
        if isinstance(exc, httpx.TransportError):
            raise SandlaneConnectionError(f"cannot reach the server: {exc}") from exc


class Sandlane:
    """A client of a sandlane server (synchronous).

    - ``base_url`` (default ``$SANDLANE_BASE_URL``): the server, ``http://127.0.0.1:7878``.
    - ``api_key`` (default ``$SANDLANE_API_KEY``): a caller key or a sandbox token.
    - ``org`` (default ``$SANDLANE_ORG``): the org every org route acts in
      (:meth:`with_org` gives a client for another).
    - ``timeout``: seconds (or an ``httpx.Timeout``) for each request; exec waits for its
      command's own ``timeout_ms`` and streams as long as their output goes on.
    - ``headers``: more headers for every request.
    - ``transport``: an ``httpx`` transport (a proxy, a test's ``httpx.MockTransport``).
    - ``http_client``: an ``httpx.Client`` to send with instead of a new one (its base URL
      and headers are set from the arguments above; closing this client leaves it open).

    Use it as a context manager, or call :meth:`close`.

    >>> with Sandlane("http://127.0.0.1:7878", key, org="acme") as client:
    ...     sbx = client.ensure_session("s1", execution_id="exec-1").require_sandbox()
    ...     print(sbx.exec("echo hello").stdout)
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        org: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
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
        self._http = http_client or httpx.Client(
            base_url=self.base_url, headers=all_headers, timeout=self._timeout, transport=transport
        )
        if http_client is not None:
            self._http.base_url = httpx.URL(self.base_url)
            self._http.headers.update(all_headers)
        self.snapshots: Snapshots = Snapshots(self)
        """Snapshots of the org: list, read, delete (take one with :meth:`Sandbox.snapshot`)."""
        self.secrets: Secrets = Secrets(self)
        """Brokered secrets of the org."""
        self.audit: Audit = Audit(self)
        self.webhooks: Webhooks = Webhooks(self)
        """The org's audit log (service callers)."""

    # ---- plumbing ----

    @property
    def org(self) -> str:
        """The org this client acts in."""
        if not self._org:
            raise ValueError("no org: pass org= (or set SANDLANE_ORG), or use with_org()")
        return self._org

    def with_org(self, org: str) -> Sandlane:
        """A client for another org, sharing this one's connections (close this one, not it)."""
        other = Sandlane(self.base_url, self._api_key, org=org, timeout=self._timeout, http_client=self._http)
        other._owns_http = False
        return other

    def close(self) -> None:
        """Close the connections."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Sandlane:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self, call: core.Call, content: Any = None, extra_headers: Mapping[str, str] | None = None) -> httpx.Request:
        headers = dict(call.headers)
        headers.update(extra_headers or {})
        return self._http.build_request(
            call.method,
            call.path,
            params=call.params or None,
            json=call.json if content is None else None,
            content=content,
            headers=headers,
            timeout=_timeout_for(self._timeout, call),
        )

    def _open(self, call: core.Call, content: Any = None, extra_headers: Mapping[str, str] | None = None) -> httpx.Response:
        """Send a call and return the open response (its status checked; the body unread)."""
        request = self._build(call, content, extra_headers)
        with _transport_errors():
            response = self._http.send(request, stream=True)
        if response.status_code not in call.ok:
            try:
                with _transport_errors():
                    body = response.read()
            finally:
                response.close()
            raise error_from_body(response.status_code, body)
        return response

    def _send(self, call: core.Call, body: core.Body | None = None, form: Mapping[str, str] | None = None) -> httpx.Response:
        """Send a call and read its whole answer."""
        content: Any = None
        extra: dict[str, str] = {}
        if body is not None:
            content, extra = core.sync_body(body)
        elif form is not None:
            content = urlencode(dict(form)).encode()
            extra = {"content-type": "application/x-www-form-urlencoded"}
        response = self._open(call, content, extra)
        try:
            with _transport_errors(streaming=True):
                response.read()
        finally:
            response.close()
        return response

    def _json(self, call: core.Call, body: core.Body | None = None) -> Any:
        return core.json_or_none(self._send(call, body).content)

    def _ensure_result(self, raw: Mapping[str, Any]) -> EnsureResult[Sandbox]:
        outcome, sandbox, message = core.ensure_outcome(raw)
        handle = None if sandbox is None else Sandbox(self, SandboxInfo.from_json(sandbox))
        return EnsureResult(outcome=outcome, sandbox=handle, message=message)

    # ---- sandboxes ----

    def ensure_session(self, session_id: str, execution_id: str, *, from_snapshot: str | None = None) -> EnsureResult[Sandbox]:
        """Ensure the session's sandbox for an agent execution (idempotent).

        Non-critical posture: a provisioning failure answers ``outcome="failed"`` rather
        than raising (call :meth:`EnsureResult.require_sandbox` to raise instead). With
        ``from_snapshot``, a session with no live sandbox forks from that snapshot.
        """
        return self._ensure_result(self._json(core.ensure_session(self.org, session_id, execution_id, from_snapshot)))

    def ensure_workflow(self, execution_id: str, *, from_snapshot: str | None = None) -> EnsureResult[Sandbox]:
        """Ensure a workflow execution's sandbox (critical: a failure raises :class:`UnavailableError`)."""
        return self._ensure_result(self._json(core.ensure_workflow(self.org, execution_id, from_snapshot)))

    def recover_workflow(self, execution_id: str) -> EnsureResult[Sandbox]:
        """A fresh sandbox (a new id) for a workflow execution recovered from FAILED."""
        return self._ensure_result(self._json(core.recover_workflow(self.org, execution_id)))

    def deprovision_session(self, session_id: str) -> None:
        """Deprovision the session's sandbox (idempotent; a durable workspace is kept)."""
        self._send(core.deprovision_session(self.org, session_id))

    def deprovision_workflow(self, execution_id: str) -> None:
        """Deprovision a workflow execution's sandbox (idempotent)."""
        self._send(core.deprovision_workflow(self.org, execution_id))

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """Read a sandbox; a handle holding what was read."""
        return Sandbox(self, SandboxInfo.from_json(self._json(core.read_sandbox(self.org, sandbox_id))))

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox by id, without a request (e.g. with a sandbox token)."""
        return Sandbox(self, sandbox_id)

    # ---- the org ----

    def policy(self) -> Policy:
        """The org's effective policy (service callers)."""
        return Policy.from_json(self._json(core.get_policy(self.org)))

    def list_sandboxes(self, *, after: str | None = None, limit: int = 100, ended: bool = False) -> SandboxListPage:
        """One page of the org's sandboxes (service callers), oldest first; ``ended`` adds failed and deprovisioned ones."""
        return SandboxListPage.from_json(self._json(core.list_sandboxes(self.org, after, limit, ended)))

    def introspect(self, token: str) -> Introspection:
        """Introspect a sandbox token (RFC 7662)."""
        response = self._send(core.introspect(), form={"token": token})
        return Introspection.from_json(response.json())

    # ---- public routes ----

    def health(self) -> Health:
        """``GET /healthz``."""
        return Health.from_json(self._json(core.Call("GET", "/healthz")), ok=True)

    def ready(self) -> Health:
        """``GET /readyz``: ``ok`` is False (not raised) when the server is not ready."""
        response = self._send(core.Call("GET", "/readyz", ok=(200, 503)))
        return Health.from_json(response.json(), ok=response.status_code == 200)

    def jwks(self) -> dict[str, Any]:
        """The public keys that verify sandbox tokens."""
        result: dict[str, Any] = self._json(core.Call("GET", "/.well-known/jwks.json"))
        return result

    def metrics(self) -> str:
        """The OpenMetrics text (with the caller's orgs for a service key)."""
        return self._send(core.Call("GET", "/metrics")).text

    def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document."""
        result: dict[str, Any] = self._json(core.Call("GET", "/openapi.json"))
        return result


class Sandbox:
    """A sandbox of the client's org: exec, processes, files, snapshots, terminals, links.

    Get one from an ensure, :meth:`Sandlane.get_sandbox` or :meth:`Sandlane.sandbox`.
    ``info`` is what the API last said about it (``None`` for a bare handle).
    """

    def __init__(self, client: Sandlane, sandbox: SandboxInfo | str) -> None:
        self._client = client
        self.info: SandboxInfo | None = sandbox if isinstance(sandbox, SandboxInfo) else None
        self.id: str = sandbox.id if isinstance(sandbox, SandboxInfo) else sandbox
        self.org: str = sandbox.org if isinstance(sandbox, SandboxInfo) else client.org
        self.files: Files = Files(self)
        """Files and archives in the sandbox."""
        self.processes: Processes = Processes(self)
        """Background processes."""
        self.terminals: Terminals = Terminals(self)
        """Terminals (needs a server with terminals)."""
        self.preview_links: PreviewLinks = PreviewLinks(self)
        """Preview links to the sandbox's ports (needs a server with preview links)."""

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, org={self.org!r})"

    def refresh(self) -> SandboxInfo:
        """Read the sandbox again; updates and returns ``info``."""
        self.info = SandboxInfo.from_json(self._client._json(core.read_sandbox(self.org, self.id)))
        return self.info

    def exec(self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None) -> ExecResult:
        """Run a command and wait for it (a string runs with ``/bin/sh -c``).

        Whatever its exit status; output is UTF-8 (invalid bytes replaced) and capped.
        ``timeout_ms`` (default 30 s, at most 600 s) kills it when it runs out.
        """
        return ExecResult.from_json(self._client._json(core.exec_buffered(self.org, self.id, command, stdin, timeout_ms)))

    def exec_stream(self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None) -> FrameStream:
        """Run a command, its output streamed as it arrives: iterate the result for frames.

        >>> for frame in sbx.exec_stream("make test"):
        ...     if isinstance(frame, OutputFrame):
        ...         sys.stdout.buffer.write(frame.data)
        """
        return FrameStream(self._client, core.exec_streamed(self.org, self.id, command, stdin, timeout_ms), require_exit=True)

    def snapshot(self, name: str | None = None) -> Snapshot:
        """Snapshot the workspace (its processes frozen for the copy)."""
        return Snapshot.from_json(self._client._json(core.take_snapshot(self.org, self.id, name)))

    def restore(self, snapshot: str | Snapshot) -> SandboxInfo:
        """Make the workspace a snapshot's files; the sandbox restarts under the same id."""
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        raw = self._client._json(core.restore(self.org, self.id, snapshot_id))
        self.info = SandboxInfo.from_json(raw["sandbox"])
        return self.info

    def deprovision(self) -> None:
        """Deprovision this sandbox's key (session or workflow execution)."""
        info = self.info or self.refresh()
        if info.kind == "workflow":
            self._client.deprovision_workflow(info.key)
        else:
            self._client.deprovision_session(info.key)


class Files:
    """Files and archives of one sandbox, streamed both ways.

    Paths are ``/workspace`` or ``/tmp`` or beneath them, or relative to ``/workspace``.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def write(self, path: str, data: core.Body) -> FileInfo:
        """Write a file (parents created); the contents appear whole or not at all.

        ``data``: bytes or text, a binary file object (read a chunk at a time, its size
        sent ahead so an oversized one is refused before the upload), or an iterable of
        byte chunks (e.g. a generator: nothing is held whole).
        """
        s = self._s
        return FileInfo.from_json(s._client._json(core.write_file(s.org, s.id, path), body=data))

    def read(self, path: str) -> ByteStream:
        """A file's bytes, streamed: iterate the result, or ``.save()``/``.read()`` it."""
        s = self._s
        return ByteStream(s._client, core.read_file(s.org, s.id, path), check=_expect_file(path))

    def read_bytes(self, path: str) -> bytes:
        """A (small) file's bytes, whole."""
        return self.read(path).read()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A (small) file's text."""
        return self.read_bytes(path).decode(encoding)

    def download(self, path: str, dest: PathLike | IO[bytes]) -> int:
        """Stream a file to a local path or binary file object; the bytes written."""
        return self.read(path).save(dest)

    def list(self, path: str = "/workspace") -> list[DirEntry]:
        """A directory's entries, sorted by name (symlinks listed, not followed)."""
        s = self._s
        response = s._client._send(core.read_file(s.org, s.id, path))
        if not response.headers.get("content-type", "").startswith("application/json"):
            raise NotADirectoryError(path)
        return [DirEntry.from_json(e) for e in response.json()["entries"]]

    def delete(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file, a symlink or an empty directory (``recursive``: a whole tree)."""
        s = self._s
        s._client._send(core.delete_file(s.org, s.id, path, recursive))

    def upload_archive(self, path: str, tar: core.Body) -> Unpacked:
        """Unpack a tar (not compressed), streamed up, into directory ``path`` (created when missing)."""
        s = self._s
        return Unpacked.from_json(s._client._json(core.put_archive(s.org, s.id, path), body=tar))

    def download_archive(self, path: str) -> ByteStream:
        """A tar of directory ``path``, streamed."""
        s = self._s
        return ByteStream(s._client, core.get_archive(s.org, s.id, path))

    def upload_dir(self, local_dir: PathLike, path: str) -> Unpacked:
        """Copy a local directory's contents into directory ``path`` of the sandbox.

        A tar made as it is sent (files read a chunk at a time; symlinks as links).
        """
        return self.upload_archive(path, tar_directory(local_dir))

    def download_dir(self, path: str, local_dir: PathLike) -> int:
        """Copy directory ``path`` of the sandbox into a local directory (created); the entries unpacked.

        The tar is unpacked as it arrives, with :mod:`tarfile`'s ``data`` filter.
        """
        return extract_stream(iter(self.download_archive(path)), local_dir)


def _expect_file(path: str) -> Callable[[httpx.Response], None]:
    def check(response: httpx.Response) -> None:
        if response.headers.get("content-type", "").startswith("application/json"):
            raise IsADirectoryError(path)

    return check


class Processes:
    """Background processes of one sandbox: they outlive requests and server restarts."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def start(self, command: core.Command, *, stdin: str | None = None, timeout_ms: int | None = None) -> Process:
        """Start a process (a string runs with ``/bin/sh -c``); ``stdin`` is written first, the input stays open."""
        s = self._s
        return Process.from_json(s._client._json(core.start_process(s.org, s.id, command, stdin, timeout_ms)))

    def list(self) -> list[Process]:
        """Running processes and ended ones still kept."""
        s = self._s
        return [Process.from_json(p) for p in s._client._json(core.list_processes(s.org, s.id))["processes"]]

    def get(self, pid: int) -> Process:
        """One process."""
        s = self._s
        return Process.from_json(s._client._json(core.get_process(s.org, s.id, pid)))

    def output(self, pid: int, *, follow: bool = True) -> FrameStream:
        """Its output from the start (the buffer's), then with ``follow`` as it arrives until the exit frame."""
        s = self._s
        return FrameStream(s._client, core.process_output(s.org, s.id, pid, follow), require_exit=follow)

    def wait(self, pid: int) -> ExitFrame:
        """Follow its output until it ends; its exit frame."""
        with self.output(pid, follow=True) as stream:
            return stream.wait()

    def write_stdin(self, pid: int, data: core.Body, *, close: bool = False) -> None:
        """Write to its input (then close it, with ``close``)."""
        s = self._s
        s._client._send(core.process_stdin(s.org, s.id, pid, close), body=data)

    def close_stdin(self, pid: int) -> None:
        """Close its input."""
        self.write_stdin(pid, b"", close=True)

    def signal(self, pid: int, signal: str = "TERM") -> None:
        """Send ``TERM``, ``INT`` or ``KILL`` to its process group."""
        s = self._s
        s._client._send(core.signal_process(s.org, s.id, pid, signal))

    def kill(self, pid: int) -> None:
        """Send ``KILL``."""
        self.signal(pid, "KILL")


class Terminals:
    """Terminals of one sandbox, attached over a WebSocket (needs a server with terminals
    and ``pip install 'sandlane[terminal]'``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def create(self, *, cols: int = 80, rows: int = 24, argv: Sequence[str] | None = None) -> TerminalInfo:
        """Start a terminal (``argv``: its program, the sandbox's shell by default)."""
        s = self._s
        return TerminalInfo.from_json(s._client._json(core.create_terminal(s.org, s.id, cols, rows, argv)))

    def list(self) -> list[TerminalInfo]:
        """The sandbox's terminals."""
        s = self._s
        return [TerminalInfo.from_json(t) for t in core.terminals_of(s._client._json(core.list_terminals(s.org, s.id)))]

    def delete(self, terminal_id: str) -> None:
        """End a terminal."""
        s = self._s
        s._client._send(core.delete_terminal(s.org, s.id, terminal_id))

    def ticket(self, terminal_id: str) -> TerminalTicket:
        """A short-lived ticket that attaches to the terminal (for a browser)."""
        s = self._s
        return TerminalTicket.from_json(s._client._json(core.terminal_ticket(s.org, s.id, terminal_id)))

    def attach(self, terminal_id: str, *, open_timeout: float = 10.0) -> TerminalSession:
        """Attach to a terminal: its last 64 KiB of output are replayed first."""
        require_websockets()
        from websockets.sync.client import connect

        s = self._s
        url = core.terminal_ws_url(s._client.base_url, s.org, s.id, terminal_id)
        options: dict[str, Any] = {}
        if "legacy" in inspect.signature(connect).parameters:
            options["legacy"] = True  # websockets >= 17: a connection held past this call, closed by the session
        try:
            connection = connect(
                url,
                additional_headers=auth_headers(s._client._api_key),
                open_timeout=open_timeout,
                max_size=None,
                **options,
            )
        except Exception as exc:
            typed = refused_error(exc)
            if typed is exc:
                raise
            raise typed from exc
        return TerminalSession(connection)


class PreviewLinks:
    """Preview links to a sandbox's ports (needs a server with preview links)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def create(self, port: int, *, ttl_s: int) -> PreviewLink:
        """A link to ``port`` that expires after ``ttl_s`` seconds."""
        s = self._s
        return PreviewLink.from_json(s._client._json(core.create_preview_link(s.org, s.id, port, ttl_s)))

    def list(self, port: int) -> list[PreviewLink]:
        """The port's links, oldest first, revoked and expired ones too (their ``url`` without a token)."""
        s = self._s
        raw = s._client._json(core.list_preview_links(s.org, s.id, port))
        return [PreviewLink.from_json(link) for link in raw["links"]]

    def delete(self, port: int, link_id: str) -> None:
        """Revoke a link."""
        s = self._s
        s._client._send(core.delete_preview_link(s.org, s.id, port, link_id))


class Snapshots:
    """Snapshots of the client's org (a user sees its own)."""

    def __init__(self, client: Sandlane) -> None:
        self._c = client

    def list(self, *, sandbox_id: str | None = None) -> list[Snapshot]:
        """Snapshots, oldest first; with ``sandbox_id``, those taken of that sandbox."""
        raw = self._c._json(core.list_snapshots(self._c.org, sandbox_id))
        return [Snapshot.from_json(x) for x in raw["snapshots"]]

    def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot."""
        return Snapshot.from_json(self._c._json(core.get_snapshot(self._c.org, snapshot_id)))

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot (forks made from it keep their files)."""
        self._c._send(core.delete_snapshot(self._c.org, snapshot_id))


class Secrets:
    """Brokered secrets of the client's org (write-only: no answer holds a value)."""

    def __init__(self, client: Sandlane) -> None:
        self._c = client

    def put(
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
        """Make or replace a secret; its binding, and whether it was created."""
        response = self._c._send(core.put_secret(self._c.org, name, value, hosts, scope, header, format, methods, paths))
        return SecretPutResult(secret=Secret.from_json(response.json()), created=response.status_code == 201)

    def list(self) -> list[Secret]:
        """The secrets the caller may see, by name."""
        return [Secret.from_json(x) for x in self._c._json(core.list_secrets(self._c.org))["secrets"]]

    def delete(self, name: str) -> None:
        """Delete a secret."""
        self._c._send(core.delete_secret(self._c.org, name))


class Webhooks:
    """The org's webhook deliveries (service callers; the webhook is set with ``sandlane org set``)."""

    def __init__(self, client: Sandlane) -> None:
        self._c = client

    def deliveries(self, *, before: str | None = None, limit: int = 50) -> WebhookDeliveryPage:
        """One page of deliveries, newest first; ``before`` is the previous page's ``next``."""
        return WebhookDeliveryPage.from_json(self._c._json(core.webhook_deliveries(self._c.org, before, limit)))


class Audit:
    """The org's audit log (service callers)."""

    def __init__(self, client: Sandlane) -> None:
        self._c = client

    def page(self, *, after: int = 0, limit: int = 100) -> AuditPage:
        """One page: events after ``after``, oldest first, and ``next`` to pass on."""
        return AuditPage.from_json(self._c._json(core.audit_page(self._c.org, after, limit)))

    def verify(self) -> AuditVerdict:
        """What ``sandlane audit verify`` says of the log now (a verdict is reused for up to 10 s)."""
        return AuditVerdict.from_json(self._c._json(core.audit_verify(self._c.org)))

    def tail(
        self,
        *,
        after: int = 0,
        limit: int = 1000,
        follow: bool = False,
        poll_interval: float = 1.0,
        idle_timeout: float | None = None,
    ) -> Iterator[AuditEvent]:
        """Every event after ``after``, each exactly once, in ``seq`` order, following ``next``.

        Without ``follow`` it ends at the log's end; with it, it waits ``poll_interval``
        seconds between empty pages and goes on (until ``idle_timeout`` seconds pass
        without an event, when given).
        """
        cursor = core.AuditCursor(after)
        last_event = time.monotonic()
        while True:
            fresh = cursor.accept(self.page(after=cursor.after, limit=limit))
            yield from fresh
            if fresh:
                last_event = time.monotonic()
                continue
            if not follow:
                return
            if idle_timeout is not None and time.monotonic() - last_event >= idle_timeout:
                return
            time.sleep(poll_interval)

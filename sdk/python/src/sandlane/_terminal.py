"""Terminals over a WebSocket: the message encoding (shared) and the sync and async sessions.

Binary messages are the terminal's bytes, both ways; text messages are JSON control:
``{"type": "resize", "cols", "rows"}`` from the client, ``{"type": "exit", "exit_code"}``
from the server, which then closes. Attaching replays the terminal's last 64 KiB.
Needs the optional extra: ``pip install 'sandlane[terminal]'``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Union

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection as AsyncConnection
    from websockets.sync.client import ClientConnection as SyncConnection

__all__ = ["TerminalExit", "TerminalSession", "AsyncTerminalSession"]


@dataclass(frozen=True)
class TerminalExit:
    """The terminal's program ended with ``exit_code``."""

    exit_code: int


TerminalEvent = Union[bytes, TerminalExit]


def encode_resize(cols: int, rows: int) -> str:
    """The control message that resizes the terminal."""
    if cols <= 0 or rows <= 0:
        raise ValueError("cols and rows must be positive")
    return json.dumps({"type": "resize", "cols": int(cols), "rows": int(rows)})


def encode_input(data: bytes | str) -> bytes:
    """Input for the terminal, as the binary message it is sent as."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def decode_message(message: str | bytes) -> TerminalEvent | None:
    """A message from the server: bytes, a :class:`TerminalExit`, or ``None`` (an unknown control message)."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        return bytes(message)
    try:
        control: Any = json.loads(message)
    except ValueError:
        return None
    if isinstance(control, dict) and control.get("type") == "exit":
        code = control.get("exit_code")
        return TerminalExit(exit_code=int(code) if code is not None else -1)
    return None


def auth_headers(api_key: str) -> dict[str, str]:
    """The headers that attach with a caller key."""
    return {"Authorization": f"Bearer {api_key}"}


def refused_error(exc: BaseException) -> BaseException:
    """A refused WebSocket upgrade as this package's typed error (other errors as they are)."""
    from websockets.exceptions import InvalidStatus

    from ._errors import error_from_body

    if isinstance(exc, InvalidStatus):
        return error_from_body(exc.response.status_code, bytes(exc.response.body or b""))
    return exc


def require_websockets() -> None:
    """Raise a helpful ImportError when the ``terminal`` extra is not installed."""
    try:
        import websockets  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("terminals need the websockets package: pip install 'sandlane[terminal]'") from exc


class TerminalSession:
    """An attached terminal (sync). Iterate it for output bytes until the program exits.

    ``exit_code`` is set once the server said the program ended. Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, connection: SyncConnection) -> None:
        self._ws = connection
        self.exit_code: int | None = None

    def send(self, data: bytes | str) -> None:
        """Type into the terminal (text is sent as UTF-8)."""
        self._ws.send(encode_input(data))

    def resize(self, cols: int, rows: int) -> None:
        """Resize the terminal."""
        self._ws.send(encode_resize(cols, rows))

    def recv(self, timeout: float | None = None) -> TerminalEvent | None:
        """The next output bytes or the exit; ``None`` once the connection is closed.

        Raises :class:`TimeoutError` when nothing came within ``timeout`` seconds.
        """
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = self._ws.recv(timeout=timeout)
            except ConnectionClosed:
                return None
            event = decode_message(message)
            if isinstance(event, TerminalExit):
                self.exit_code = event.exit_code
            if event is not None:
                return event

    def __iter__(self) -> Iterator[bytes]:
        """Output bytes until the program exits or the connection closes."""
        while True:
            event = self.recv()
            if event is None or isinstance(event, TerminalExit):
                return
            yield event

    def read_until(self, needle: bytes, timeout: float = 10.0) -> bytes:
        """Output until ``needle`` appears (what was read, ``needle`` included).

        Raises :class:`TimeoutError` when it did not within ``timeout`` seconds, and
        :class:`EOFError` when the terminal ended first.
        """
        import time

        deadline = time.monotonic() + timeout
        seen = bytearray()
        while needle not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{needle!r} did not appear within {timeout} s")
            event = self.recv(timeout=left)
            if event is None or isinstance(event, TerminalExit):
                raise EOFError(f"the terminal ended before {needle!r} appeared")
            seen += event
        return bytes(seen)

    def close(self) -> None:
        """Detach (the terminal keeps running until deleted)."""
        self._ws.close()

    def __enter__(self) -> TerminalSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncTerminalSession:
    """An attached terminal (async). ``async for`` it for output bytes until the program exits."""

    def __init__(self, connection: AsyncConnection) -> None:
        self._ws = connection
        self.exit_code: int | None = None

    async def send(self, data: bytes | str) -> None:
        """Type into the terminal (text is sent as UTF-8)."""
        await self._ws.send(encode_input(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Resize the terminal."""
        await self._ws.send(encode_resize(cols, rows))

    async def recv(self) -> TerminalEvent | None:
        """The next output bytes or the exit; ``None`` once the connection is closed."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                return None
            event = decode_message(message)
            if isinstance(event, TerminalExit):
                self.exit_code = event.exit_code
            if event is not None:
                return event

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """Output bytes until the program exits or the connection closes."""
        while True:
            event = await self.recv()
            if event is None or isinstance(event, TerminalExit):
                return
            yield event

    async def read_until(self, needle: bytes, timeout: float = 10.0) -> bytes:
        """Output until ``needle`` appears; :class:`TimeoutError` or :class:`EOFError` otherwise."""
        import asyncio

        async def run() -> bytes:
            seen = bytearray()
            while needle not in seen:
                event = await self.recv()
                if event is None or isinstance(event, TerminalExit):
                    raise EOFError(f"the terminal ended before {needle!r} appeared")
                seen += event
            return bytes(seen)

        return await asyncio.wait_for(run(), timeout)

    async def close(self) -> None:
        """Detach (the terminal keeps running until deleted)."""
        await self._ws.close()

    async def __aenter__(self) -> AsyncTerminalSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

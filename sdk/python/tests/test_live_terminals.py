"""Terminals and preview links against the real server, in both of its possible states.

Today's server has neither route group: the test then checks that the client says so with
the typed 404 (no skip). A server with them runs the whole contract: a terminal echoing a
command, resize, exit, list, ticket, delete; a preview link made and revoked.
"""

from __future__ import annotations

import pytest

from sandlane import NotFoundError, Sandbox, Sandlane, TerminalExit


def _has(client: Sandlane, suffix: str) -> bool:
    return any(path.endswith(suffix) for path in client.openapi()["paths"])


def test_a_terminal_echoes_a_command(client: Sandlane, sbx: Sandbox) -> None:
    if not _has(client, "/terminals"):
        with pytest.raises(NotFoundError) as missing:
            sbx.terminals.create(cols=80, rows=24)
        assert missing.value.status == 404
        return
    term = sbx.terminals.create(cols=80, rows=24)
    assert term.id.startswith("term_")
    assert any(t.id == term.id for t in sbx.terminals.list())
    ticket = sbx.terminals.ticket(term.id)
    assert ticket.ticket and ticket.expires_at
    with sbx.terminals.attach(term.id) as tty:
        tty.resize(100, 30)
        tty.send("echo hel''lo-from-python\r")
        assert b"hello-from-python" in tty.read_until(b"hello-from-python", timeout=15)
        tty.send("exit 3\r")
        while True:
            event = tty.recv(timeout=15)
            if event is None or isinstance(event, TerminalExit):
                break
        assert tty.exit_code == 3
    sbx.terminals.delete(term.id)


def test_a_preview_link_made_and_revoked(client: Sandlane, sbx: Sandbox) -> None:
    if not _has(client, "/links"):
        with pytest.raises(NotFoundError):
            sbx.preview_links.create(8000, ttl_s=60)
        return
    link = sbx.preview_links.create(8000, ttl_s=60)
    assert link.id and link.url.startswith("http") and link.expires_at
    sbx.preview_links.delete(8000, link.id)

"""Terminals and preview links against the real server: a terminal echoing a command,
resize, exit, list, ticket, delete; a preview link made and revoked.
"""

from __future__ import annotations

from sandlane import Sandbox, Sandlane, TerminalExit


def test_a_terminal_echoes_a_command(client: Sandlane, sbx: Sandbox) -> None:
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
    link = sbx.preview_links.create(8000, ttl_s=60)
    assert link.id and link.url.startswith("http") and link.expires_at
    sbx.preview_links.delete(8000, link.id)

"""The sync client against the real server."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
import threading
import time
import tracemalloc
from typing import Callable, Iterator

import pytest

from conftest import ORG, unique
from sandlane import (
    AuditEvent,
    ExitFrame,
    InvalidArgumentError,
    NotFoundError,
    OutputFrame,
    PermissionDeniedError,
    Sandbox,
    Sandlane,
    SandlaneError,
)

MIB = 1 << 20


def lazy_bytes(total: int, seed: int, digest: "hashlib._Hash", chunk: int = MIB) -> Iterator[bytes]:
    """``total`` pseudo-random bytes made a chunk at a time, hashed as they are handed over."""
    rng = random.Random(seed)
    left = total
    while left:
        n = min(chunk, left)
        block = rng.randbytes(n)
        digest.update(block)
        left -= n
        yield block


def test_ensure_read_and_deprovision(client: Sandlane) -> None:
    session = unique("py-ensure")
    first = client.ensure_session(session, execution_id="exec-1")
    assert first.outcome == "ready" and first.ready
    sbx = first.require_sandbox()
    assert sbx.id.startswith("sbx_") and sbx.info is not None
    assert sbx.info.kind == "session" and sbx.info.key == session and sbx.info.org == ORG
    assert sbx.info.state == "ready" and sbx.info.token_id

    again = client.ensure_session(session, execution_id="exec-2").require_sandbox()
    assert again.id == sbx.id, "an ensure of the same session reuses its sandbox"

    read = client.get_sandbox(sbx.id)
    assert read.info is not None and read.info.id == sbx.id and read.info.state == "ready"
    assert sbx.exec(["echo", "hi"]).stdout == "hi\n"

    client.deprovision_session(session)
    client.deprovision_session(session)  # idempotent
    assert client.get_sandbox(sbx.id).info.state == "deprovisioned"  # type: ignore[union-attr]


def test_workflow_ensure_recover_deprovision(client: Sandlane) -> None:
    execution = unique("py-wf")
    sbx = client.ensure_workflow(execution).require_sandbox()
    assert sbx.info is not None and sbx.info.kind == "workflow"
    recovered = client.recover_workflow(execution).require_sandbox()
    assert recovered.id != sbx.id, "a recovery makes a fresh sandbox"
    recovered.deprovision()
    client.deprovision_workflow(execution)


def test_exec_buffered(sbx: Sandbox) -> None:
    result = sbx.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and not result.truncated
    assert sbx.exec(["cat"], stdin="fed").stdout == "fed"
    slow = sbx.exec(["sleep", "5"], timeout_ms=300)
    assert slow.timed_out


def test_exec_stream_first_frame_before_the_end(sbx: Sandbox) -> None:
    start = time.monotonic()
    arrivals: list[tuple[float, OutputFrame | ExitFrame]] = []
    with sbx.exec_stream("echo a; sleep 2; echo b") as stream:
        for frame in stream:
            arrivals.append((time.monotonic() - start, frame))
    first_at, first = arrivals[0]
    end_at = arrivals[-1][0]
    assert isinstance(first, OutputFrame) and first.data == b"a\n"
    assert first_at < 1.0, f"the first frame came after {first_at:.2f} s"
    assert end_at >= 2.0 and end_at - first_at >= 1.5, "the first frame came while the command ran"
    end = arrivals[-1][1]
    assert isinstance(end, ExitFrame) and end.exit_code == 0
    assert stream.exit == end


def test_exec_stream_is_binary_safe(sbx: Sandbox) -> None:
    # Invalid UTF-8, a character split between two writes, NUL, on both streams.
    script = r"printf '\377\000ok'; printf '\342\202'; sleep 0.2; printf '\254\n'; printf '\376' >&2; exit 4"
    out, err, end = sbx.exec_stream(script).collect()
    assert out == b"\xff\x00ok\xe2\x82\xac\n"
    assert err == b"\xfe"
    assert end is not None and end.exit_code == 4


def test_background_process_followed_to_exit(sbx: Sandbox) -> None:
    proc = sbx.processes.start("for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 7")
    assert proc.running and proc.pid > 0
    assert any(p.pid == proc.pid for p in sbx.processes.list())
    out = bytearray()
    with sbx.processes.output(proc.pid, follow=True) as stream:
        for frame in stream:
            if isinstance(frame, OutputFrame):
                out += frame.data
    assert out == b"line 1\nline 2\nline 3\n"
    assert stream.exit is not None and stream.exit.exit_code == 7
    ended = sbx.processes.get(proc.pid)
    assert not ended.running and ended.exit_code == 7
    # Replayed from the start to a later reader, without follow.
    replay, _, replay_exit = sbx.processes.output(proc.pid, follow=False).collect()
    assert replay == bytes(out) and replay_exit is not None


def test_process_stdin_and_signal(sbx: Sandbox) -> None:
    cat = sbx.processes.start(["cat"], stdin="first ")
    sbx.processes.write_stdin(cat.pid, b"second")
    sbx.processes.close_stdin(cat.pid)
    assert sbx.processes.wait(cat.pid).exit_code == 0
    out, _, _ = sbx.processes.output(cat.pid, follow=False).collect()
    assert out == b"first second"

    sleeper = sbx.processes.start(["sleep", "60"])
    sbx.processes.signal(sleeper.pid, "TERM")
    assert sbx.processes.wait(sleeper.pid).exit_code == 128 + 15


def test_64_mib_file_up_and_down_byte_exact_streamed(sbx: Sandbox) -> None:
    size = 64 * MIB
    sent = hashlib.sha256()
    tracemalloc.start()
    try:
        written = sbx.files.write("big/blob.bin", lazy_bytes(size, seed=38, digest=sent))
        assert written.size == size and written.path == "/workspace/big/blob.bin"
        got = hashlib.sha256()
        received = 0
        with sbx.files.read("/workspace/big/blob.bin") as download:
            assert download.content_length == size
            for chunk in download:
                got.update(chunk)
                received += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert received == size
    assert got.hexdigest() == sent.hexdigest()
    assert peak < 16 * MIB, f"peak Python memory {peak / MIB:.1f} MiB: something held the file whole"
    sbx.files.delete("big", recursive=True)


def test_file_object_upload_and_save(sbx: Sandbox, tmp_path: "pytest.TempPathFactory") -> None:
    src = tmp_path / "src.bin"  # type: ignore[operator]
    payload = bytes(range(256)) * 4096
    src.write_bytes(payload)
    with open(src, "rb") as f:
        assert sbx.files.write("/tmp/from-file.bin", f).size == len(payload)
    dest = tmp_path / "dest.bin"  # type: ignore[operator]
    assert sbx.files.download("/tmp/from-file.bin", dest) == len(payload)
    assert dest.read_bytes() == payload


def test_files_listing_delete_and_errors(sbx: Sandbox) -> None:
    sbx.files.write("notes/a.txt", "alpha")
    sbx.files.write("notes/b.txt", b"beta")
    assert sbx.files.read_text("notes/a.txt") == "alpha"
    names = [(e.name, e.type, e.size) for e in sbx.files.list("notes")]
    assert names == [("a.txt", "file", 5), ("b.txt", "file", 4)]
    with pytest.raises(IsADirectoryError):
        sbx.files.read_bytes("notes")
    with pytest.raises(NotADirectoryError):
        sbx.files.list("notes/a.txt")
    with pytest.raises(InvalidArgumentError) as bad:
        sbx.files.read_bytes("../etc/passwd")
    assert bad.value.status == 400 and bad.value.code == "invalid_argument"
    sbx.files.delete("notes", recursive=True)
    with pytest.raises(SandlaneError) as gone:
        sbx.files.read_bytes("notes/a.txt")
    assert isinstance(gone.value, NotFoundError) and gone.value.status == 404


def test_archives_up_and_down(sbx: Sandbox) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("one.txt", b"1"), ("sub/two.txt", b"22")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    unpacked = sbx.files.upload_archive("/workspace/arch", buf)
    assert unpacked.path == "/workspace/arch" and unpacked.bytes == 3
    assert sbx.files.read_text("arch/sub/two.txt") == "22"

    out = io.BytesIO()
    sbx.files.download_archive("/workspace/arch").save(out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        files = {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert files == {"one.txt": b"1", "sub/two.txt": b"22"}
    sbx.files.delete("arch", recursive=True)


def test_snapshot_fork_and_restore(client: Sandlane) -> None:
    source_key = unique("py-snap-src")
    src = client.ensure_session(source_key, execution_id="exec-1").require_sandbox()
    src.files.write("state.txt", "before")
    snap = src.snapshot(name="checkpoint")
    assert snap.id.startswith("snp_") and snap.sandbox_id == src.id and snap.name == "checkpoint"
    assert snap.owner == "user-ada"
    assert any(s.id == snap.id for s in client.snapshots.list(sandbox_id=src.id))
    assert client.snapshots.get(snap.id).id == snap.id

    fork_key = unique("py-snap-fork")
    fork = client.ensure_session(fork_key, execution_id="exec-1", from_snapshot=snap.id).require_sandbox()
    assert fork.id != src.id and fork.info is not None and fork.info.forked_from == snap.id
    assert fork.files.read_text("state.txt") == "before", "the fork sees the snapshot's file"

    src.files.write("state.txt", "after")
    restored = src.restore(snap)
    assert restored.id == src.id
    assert src.files.read_text("state.txt") == "before"

    client.snapshots.delete(snap.id)
    with pytest.raises(NotFoundError):
        client.snapshots.get(snap.id)
    client.deprovision_session(fork_key)
    client.deprovision_session(source_key)


def test_audit_tail_follows_next_across_1000_events_exactly_once(client: Sandlane, service: Sandlane) -> None:
    start = max([e.seq for e in service.audit.tail()], default=0)
    key = unique("py-audit")
    client.ensure_session(key, execution_id="exec-0").require_sandbox()
    count = 1000
    failure: list[BaseException] = []

    def write() -> None:
        # Each ensure of a live session is a cheap audited request ("reused").
        try:
            for i in range(1, count):
                client.ensure_session(key, execution_id=f"exec-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    followed: list[AuditEvent] = []
    try:
        # A small page size, and following while the events are written: many `next`s.
        for event in service.audit.tail(after=start, limit=37, follow=True, poll_interval=0.05, idle_timeout=20):
            followed.append(event)
            if sum(1 for e in followed if e.key == key) == count:
                break
    finally:
        writer.join()
    assert not failure, failure
    ours = [e for e in followed if e.key == key]
    assert len(ours) == count
    assert len({e.token_id for e in ours}) == count, "each ensure minted its own token, each seen once"
    seqs = [e.seq for e in followed]
    assert seqs == sorted(set(seqs)), "in seq order, none repeated"
    # Nothing skipped: the same range read again afterwards, page by page, is what was followed.
    again = [e.seq for e in service.audit.tail(after=start, limit=1000) if e.seq <= seqs[-1]]
    assert again == seqs
    client.deprovision_session(key)


def test_another_users_sandbox_is_a_typed_403(sbx: Sandbox, other_user: Sandlane) -> None:
    theirs = other_user.sandbox(sbx.id)
    with pytest.raises(PermissionDeniedError) as denied:
        theirs.exec(["true"])
    assert denied.value.status == 403 and denied.value.code == "permission_denied"
    assert denied.value.message
    with pytest.raises(PermissionDeniedError):
        theirs.files.read_bytes("anything")
    with pytest.raises(PermissionDeniedError):
        for _ in theirs.exec_stream(["true"]):
            pass
    assert sbx.info is None or True  # the owner's sandbox is untouched
    with pytest.raises(SandlaneError) as read:
        other_user.get_sandbox(sbx.id)
    assert read.value.status in (403, 404)


def test_policy_secrets_and_the_public_routes(client: Sandlane, service: Sandlane) -> None:
    policy = service.policy()
    assert policy.org == ORG and isinstance(policy.lane_session, bool)
    with pytest.raises(PermissionDeniedError):
        client.policy()
    with pytest.raises(PermissionDeniedError):
        client.audit.page()

    # A host the org's egress allowlist does not allow: refused, naming it.
    with pytest.raises(InvalidArgumentError) as refused:
        client.secrets.put("gh", "tok-123", hosts=["api.github.com"], scope={"identity": "user-ada"})
    assert "api.github.com" in refused.value.message
    assert all(s.name != "gh" for s in client.secrets.list())
    with pytest.raises(NotFoundError):
        client.secrets.delete("py-no-such-secret")

    assert client.health().ok and client.ready().ok
    assert "keys" in client.jwks()
    assert "/v1/orgs/{org}/audit" in client.openapi()["paths"]
    assert "sandlane_" in service.metrics()


def test_secrets_once_the_policy_allows_their_host(
    client: Sandlane, service: Sandlane, org_set: Callable[..., None]
) -> None:
    org_set("--egress-allow", "api.example.com")
    deadline = time.monotonic() + 5
    while "api.example.com" not in service.policy().egress_allow:
        assert time.monotonic() < deadline, "the policy change was not obeyed within 5 s"
        time.sleep(0.1)
    name = unique("py-secret")
    made = client.secrets.put(name, "tok-123", hosts=["api.example.com"], scope={"identity": "user-ada"})
    assert made.created and made.secret.name == name and made.secret.header == "authorization"
    assert made.secret.scope == {"identity": "user-ada"}
    again = client.secrets.put(
        name, "tok-456", hosts=["api.example.com"], scope={"identity": "user-ada"}, header="x-api-key", format="{value}"
    )
    assert not again.created and again.secret.header == "x-api-key"
    assert [s.name for s in client.secrets.list() if s.name == name] == [name]
    with pytest.raises(PermissionDeniedError):
        client.secrets.put(unique("py-secret"), "v", hosts=["api.example.com"], scope={"class": "user"})
    org_wide = unique("py-secret")
    assert service.secrets.put(org_wide, "v", hosts=["api.example.com"], scope={"org": True}).created
    service.secrets.delete(org_wide)
    client.secrets.delete(name)
    assert all(s.name != name for s in client.secrets.list())


def test_webhook_deliveries_are_listed_for_a_service_caller(service: Sandlane, client: Sandlane) -> None:
    page = service.webhooks.deliveries(limit=10)
    assert isinstance(page.deliveries, list)
    assert page.next is None or isinstance(page.next, str)
    with pytest.raises(PermissionDeniedError):
        client.webhooks.deliveries()


def test_the_client_covers_every_route_of_the_served_document(client: Sandlane) -> None:
    """Each (method, path) of /openapi.json is a request this package builds."""
    from sandlane import _core as core

    sbx, snp = "sbx_01KA2B3C4D5E6F7G8H9JKMNPQR", "snp_01KA2B3C4D5E6F7G8H9JKMNPQR"
    values = {"org": "o", "sandbox_id": sbx, "session_id": "s", "execution_id": "e", "pid": "7",
              "snapshot_id": snp, "name": "n", "tid": "term_1", "terminal_id": "term_1", "port": "8000",
              "link": "lnk_1", "link_id": "lnk_1"}
    built = [
        core.ensure_session("o", "s", "x", None), core.deprovision_session("o", "s"),
        core.ensure_workflow("o", "e", None), core.deprovision_workflow("o", "e"), core.recover_workflow("o", "e"),
        core.read_sandbox("o", sbx), core.exec_buffered("o", sbx, "true", None, None),
        core.start_process("o", sbx, "true", None, None), core.list_processes("o", sbx), core.get_process("o", sbx, 7),
        core.process_output("o", sbx, 7, True), core.process_stdin("o", sbx, 7, False),
        core.signal_process("o", sbx, 7, "TERM"), core.read_file("o", sbx, "p"), core.write_file("o", sbx, "p"),
        core.delete_file("o", sbx, "p", False), core.get_archive("o", sbx, "p"), core.put_archive("o", sbx, "p"),
        core.take_snapshot("o", sbx, None), core.restore("o", sbx, snp), core.list_snapshots("o", None),
        core.get_snapshot("o", snp), core.delete_snapshot("o", snp), core.audit_page("o", 0, 1), core.get_policy("o"),
        core.webhook_deliveries("o", None, 50), core.audit_verify("o"), core.list_sandboxes("o", None, 10, False),
        core.put_secret("o", "n", "v", ["h"], {"org": True}, None, None, None, None), core.list_secrets("o"),
        core.delete_secret("o", "n"), core.introspect(),
        core.Call("GET", "/.well-known/jwks.json"), core.Call("GET", "/healthz"), core.Call("GET", "/readyz"),
        core.Call("GET", "/metrics"), core.Call("GET", "/openapi.json"),
        # Routes of a server with terminals and preview links (not in every server yet).
        core.create_terminal("o", sbx, 80, 24, None), core.list_terminals("o", sbx),
        core.delete_terminal("o", sbx, "term_1"), core.terminal_ticket("o", sbx, "term_1"),
        core.Call("GET", core.sandbox_path("o", sbx, "terminals", "term_1")),
        core.create_preview_link("o", sbx, 8000, 60), core.list_preview_links("o", sbx, 8000),
        core.delete_preview_link("o", sbx, 8000, "lnk_1"),
    ]
    covered = {(c.method, c.path) for c in built}
    served = client.openapi()["paths"]
    missing = []
    for template, operations in served.items():
        path = template
        for name, value in values.items():
            path = path.replace("{" + name + "}", value)
        for method in operations:
            if method.upper() in ("GET", "PUT", "POST", "DELETE", "PATCH") and (method.upper(), path) not in covered:
                missing.append(f"{method.upper()} {template}")
    assert not missing, f"routes of /openapi.json this package does not build: {missing}"



def test_introspect_a_sandbox_token(sbx: Sandbox, client: Sandlane) -> None:
    token = sbx.exec('cat "$SANDLANE_TOKEN_FILE"').stdout.strip()
    assert client.introspect(token).active
    assert client.introspect(token).claims["sandbox_id"] == sbx.id
    assert not client.introspect("not-a-token").active


def test_unauthenticated(server_url: str) -> None:
    with Sandlane(server_url, "wrong-key", org=ORG) as c:
        with pytest.raises(SandlaneError) as err:
            c.ensure_session(unique("py-x"), execution_id="e")
    assert err.value.status == 401 and err.value.code == "unauthenticated"


def test_directories_up_and_down(sbx: Sandbox, tmp_path: "pytest.TempPathFactory") -> None:
    src = tmp_path / "project"  # type: ignore[operator]
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "big.bin").write_bytes(bytes(range(256)) * 5000)
    (src / "empty").mkdir()
    (src / "link").symlink_to("pkg/mod.py")
    unpacked = sbx.files.upload_dir(src, "/workspace/proj")
    assert unpacked.bytes == len("print('hi')\n") + 256 * 5000
    assert sbx.exec("cat /workspace/proj/pkg/mod.py").stdout == "print('hi')\n"
    assert sbx.files.read_text("proj/link") == "print('hi')\n"
    assert {e.name for e in sbx.files.list("proj")} == {"pkg", "big.bin", "empty", "link"}

    dest = tmp_path / "copy"  # type: ignore[operator]
    assert sbx.files.download_dir("/workspace/proj", dest) >= 5
    assert (dest / "pkg" / "mod.py").read_text() == "print('hi')\n"
    assert (dest / "big.bin").read_bytes() == bytes(range(256)) * 5000
    assert (dest / "empty").is_dir() and (dest / "link").is_symlink()
    sbx.files.delete("proj", recursive=True)


def test_a_sandbox_token_acts_in_its_own_sandbox_only(server_url: str, sbx: Sandbox, client: Sandlane) -> None:
    token = sbx.exec('cat "$SANDLANE_TOKEN_FILE"').stdout.strip()
    other = client.ensure_session(unique("py-token-other"), execution_id="e").require_sandbox()
    with Sandlane(server_url, token, org=ORG) as inside:
        own = inside.sandbox(sbx.id)
        assert own.exec("echo from-the-token").stdout == "from-the-token\n"
        own.files.write("/tmp/token-wrote", b"ok")
        assert own.files.read_bytes("/tmp/token-wrote") == b"ok"
        with pytest.raises(PermissionDeniedError):
            inside.sandbox(other.id).exec(["true"])
        with pytest.raises(PermissionDeniedError):
            inside.ensure_session(unique("py-token"), execution_id="e")
    other.deprovision()


def test_a_service_lists_the_orgs_sandboxes_and_reads_the_audit_verdict(client: Sandlane, service: Sandlane) -> None:
    made = client.ensure_session(unique("py-list"), execution_id="exec-1").require_sandbox()
    seen: list[str] = []
    after: str | None = None
    while True:
        page = service.list_sandboxes(after=after, limit=2)
        assert len(page.sandboxes) <= 2
        seen.extend(s.id for s in page.sandboxes)
        if page.next is None:
            break
        after = page.next
    assert made.id in seen and len(seen) == len(set(seen)), seen
    verdict = service.audit.verify()
    assert verdict.verdict == "intact" and verdict.message is None, verdict
    with pytest.raises(PermissionDeniedError):
        client.list_sandboxes()

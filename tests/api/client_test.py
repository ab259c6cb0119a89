"""Drives the real server through a Python client generated from its /openapi.json.

scripts/api-fuzz.sh generates the `sandlane_client` package with openapi-python-client,
puts it on PYTHONPATH and runs this file with the server's base URL and three credentials
in the environment: SANDLANE_URL, SANDLANE_USER_KEY, SANDLANE_SERVICE_KEY,
SANDLANE_SANDBOX_TOKEN (a token read from inside a sandbox of that user).
It passes when the generated client can ensure, exec, write and read a file, start a
background process and read its streamed output (NDJSON, one frame a line), read the audit
log, and reads every answer, errors included, as the document types them.
"""

import io
import json
import os
import sys
import traceback

from sandlane_client import AuthenticatedClient
from sandlane_client.api.audit import read_audit
from sandlane_client.api.files import read_file, write_file
from sandlane_client.api.processes import process_output, start_process
from sandlane_client.api.sandboxes import ensure_session, ensure_workflow, exec_, get_sandbox
from sandlane_client.api.snapshots import delete_snapshot, list_snapshots, take_snapshot
from sandlane_client.api.tokens import introspect
from sandlane_client.types import File
from sandlane_client.models import (
    AuditPageBody,
    Code,
    EnsureReady,
    EnsureSessionRequest,
    EnsureWorkflowRequest,
    ErrorBody,
    ExecRequestBody,
    ExecResponseBody,
    FileWrittenBody,
    IntrospectRequest,
    IntrospectResponse,
    ProcessBody,
    SandboxBody,
    SnapshotBody,
    SnapshotListBody,
    StartProcessBody,
    TakeSnapshotBody,
)

URL = os.environ["SANDLANE_URL"]
ORG = "acme"


def client(credential):
    return AuthenticatedClient(base_url=URL, token=credential, raise_on_unexpected_status=True)


user = client(os.environ["SANDLANE_USER_KEY"])
service = client(os.environ["SANDLANE_SERVICE_KEY"])
sandbox_token = client(os.environ["SANDLANE_SANDBOX_TOKEN"])
state = {}


def ensure_as_user():
    got = ensure_session.sync(
        org=ORG, session_id="client-s1", client=user, body=EnsureSessionRequest(execution_id="client-e1")
    )
    assert isinstance(got, EnsureReady), got
    assert got.sandbox.id.startswith("sbx_") and got.sandbox.key == "client-s1", got
    assert got.sandbox.durability == "durable", "a user's workspace is durable"
    state["sandbox"] = got.sandbox.id


def read_it_back():
    got = get_sandbox.sync(org=ORG, sandbox_id=state["sandbox"], client=user)
    assert isinstance(got, SandboxBody) and got.state == "ready", got


def exec_as_user():
    body = ExecRequestBody(argv=["/bin/sh", "-c", 'echo "hello from $SANDLANE_ORG"; cat'], stdin="in\n")
    got = exec_.sync(org=ORG, sandbox_id=state["sandbox"], client=user, body=body)
    assert isinstance(got, ExecResponseBody), got
    assert (got.exit_code, got.stdout, got.timed_out) == (0, "hello from acme\nin\n", False), got


def exec_timeout():
    body = ExecRequestBody(argv=["sleep", "5"], timeout_ms=200)
    got = exec_.sync(org=ORG, sandbox_id=state["sandbox"], client=service, body=body)
    assert isinstance(got, ExecResponseBody) and got.timed_out, got


def exec_with_a_sandbox_token_elsewhere_is_denied():
    body = ExecRequestBody(argv=["true"])
    got = exec_.sync(org=ORG, sandbox_id=state["sandbox"], client=sandbox_token, body=body)
    assert isinstance(got, ErrorBody) and got.error == Code.PERMISSION_DENIED, got


def errors_are_typed():
    # The workflow ensure's body is optional; this generator encodes an omitted optional
    # body as an error of its own, so the client sends an empty request.
    got = ensure_workflow.sync(org="globex", execution_id="w1", client=user, body=EnsureWorkflowRequest())
    assert isinstance(got, ErrorBody) and got.error == Code.PERMISSION_DENIED, got
    bad = ExecRequestBody(argv=["true"], timeout_ms=600_001)
    got = exec_.sync(org=ORG, sandbox_id=state["sandbox"], client=user, body=bad)
    assert isinstance(got, ErrorBody) and got.error == Code.INVALID_ARGUMENT, got


def write_and_read_a_file():
    payload = bytes(range(256)) * 3
    got = write_file.sync(
        org=ORG,
        sandbox_id=state["sandbox"],
        client=user,
        path="/workspace/client/bytes.bin",
        body=File(payload=io.BytesIO(payload)),
    )
    assert isinstance(got, FileWrittenBody) and got.size == len(payload), got
    # The generated reader parses a 200 as the directory listing (JSON); a file's answer is
    # its raw bytes: send the generated request and read them.
    request = read_file._get_kwargs(org=ORG, sandbox_id=state["sandbox"], path="client/bytes.bin")
    got = user.get_httpx_client().request(**request)
    assert got.status_code == 200 and got.content == payload, (got.status_code, got.content[:32])
    assert got.headers["content-type"] == "application/octet-stream", got.headers


def a_background_process_streams_its_output():
    body = StartProcessBody(argv=["sh", "-c", "echo streamed; printf '\\377' >&2; exit 3"])
    got = start_process.sync(org=ORG, sandbox_id=state["sandbox"], client=user, body=body)
    assert isinstance(got, ProcessBody) and got.pid > 0, got
    # The streamed output, read as it comes: the generated request, streamed by its httpx
    # client, one StreamFrame a line (the generated parser reads one JSON document), the
    # last the exit.
    request = process_output._get_kwargs(org=ORG, sandbox_id=state["sandbox"], pid=got.pid, follow=True)
    with user.get_httpx_client().stream(**request) as streamed:
        assert streamed.status_code == 200, streamed
        assert streamed.headers["content-type"] == "application/x-ndjson", streamed.headers
        frames = [json.loads(line) for line in streamed.iter_lines() if line]
    assert {"type": "stdout", "text": "streamed\n"} in frames, frames
    assert {"type": "stderr", "data": "/w=="} in frames, frames
    assert frames[-1] == {"type": "exit", "exit_code": 3, "timed_out": False, "truncated": False}, frames


def audit_as_service():
    # Page through the whole log: the fuzzing before this wrote many events.
    mine, after, last = [], 0, None
    while True:
        got = read_audit.sync(org=ORG, client=service, after=after, limit=1000)
        assert isinstance(got, AuditPageBody), got
        if not got.events:
            break
        mine += [e for e in got.events if e.sandbox_id == state["sandbox"]]
        after = last = got.next_
    assert [e.action for e in mine][:1] == ["ensure"], mine
    assert mine[0].caller_id == "user-ada" and mine[0].caller_class == "user", mine[0]
    assert last >= mine[0].seq


def audit_is_for_services():
    got = read_audit.sync(org=ORG, client=user)
    assert isinstance(got, ErrorBody) and got.error == Code.PERMISSION_DENIED, got


def a_snapshot_and_its_fork():
    got = take_snapshot.sync(org=ORG, sandbox_id=state["sandbox"], client=user, body=TakeSnapshotBody(name="c1"))
    assert isinstance(got, SnapshotBody) and got.id.startswith("snp_") and got.owner == "user-ada", got
    fork = ensure_session.sync(
        org=ORG,
        session_id="client-fork",
        client=user,
        body=EnsureSessionRequest(execution_id="client-e2", from_snapshot=got.id),
    )
    assert isinstance(fork, EnsureReady) and fork.sandbox.forked_from == got.id, fork
    listed = list_snapshots.sync(org=ORG, client=service)
    assert isinstance(listed, SnapshotListBody) and got.id in [s.id for s in listed.snapshots], listed
    assert delete_snapshot.sync_detailed(org=ORG, snapshot_id=got.id, client=user).status_code == 204


def introspect_the_token():
    token = os.environ["SANDLANE_SANDBOX_TOKEN"]
    got = introspect.sync(client=service, body=IntrospectRequest(token=token))
    assert isinstance(got, IntrospectResponse) and got.active and got.org_id == ORG, got


CHECKS = [
    ensure_as_user,
    read_it_back,
    exec_as_user,
    exec_timeout,
    exec_with_a_sandbox_token_elsewhere_is_denied,
    errors_are_typed,
    write_and_read_a_file,
    a_background_process_streams_its_output,
    audit_as_service,
    audit_is_for_services,
    a_snapshot_and_its_fork,
    introspect_the_token,
]

passed = failed = 0
for check in CHECKS:
    try:
        check()
        passed += 1
        print(f"ok      {check.__name__}")
    except Exception:  # noqa: BLE001 - report every failing check, then fail the run
        failed += 1
        print(f"FAILED  {check.__name__}")
        traceback.print_exc()
print(f"generated client: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

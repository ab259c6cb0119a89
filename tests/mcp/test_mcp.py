"""The MCP endpoint, driven by a client nobody here wrote: the official MCP Python SDK.

Run by `scripts/mcp-test.sh` against a real server (`scripts/serve-throwaway.sh`), whose
URL and caller keys arrive in SANDLANE_TEST_* variables.
"""

import asyncio
import json
import os
import urllib.error
import urllib.request

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["SANDLANE_TEST_SERVER_URL"]
ADA = os.environ["SANDLANE_TEST_USER_KEY"]
BOB = os.environ["SANDLANE_TEST_USER2_KEY"]


def api(method, path, key, body=None):
    request = urllib.request.Request(
        URL + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def ensure(key, session):
    answer = api("PUT", f"/v1/orgs/acme/sessions/{session}/sandbox", key, {"execution_id": f"{session}-1"})
    assert answer["outcome"] == "ready", answer
    return answer["sandbox"]["id"]


async def with_session(key, body):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with streamable_http_client(URL + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def test_a_user_lists_the_tools_and_works_in_their_sandbox():
    sandbox = ensure(ADA, "mcp-ada")

    async def body(session):
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert {"exec", "read_file", "write_file", "list_files", "start_process", "process_output", "snapshot"} <= tools

        wrote = await session.call_tool(
            "write_file", {"sandbox_id": sandbox, "path": "/workspace/notes/hello.txt", "content": "hi from mcp\n"}
        )
        assert not wrote.is_error, text_of(wrote)
        assert json.loads(text_of(wrote))["bytes"] == 12

        read = await session.call_tool("read_file", {"sandbox_id": sandbox, "path": "/workspace/notes/hello.txt"})
        assert not read.is_error, text_of(read)
        resources = [block.resource for block in read.content if block.type == "resource"]
        assert len(resources) == 1 and resources[0].text == "hi from mcp\n", read.content
        assert resources[0].uri.endswith(f"/{sandbox}/workspace/notes/hello.txt")

        ran = await session.call_tool(
            "exec", {"sandbox_id": sandbox, "argv": ["sh", "-c", "cat /workspace/notes/hello.txt; echo oops >&2; exit 3"]}
        )
        assert not ran.is_error, text_of(ran)
        out = json.loads(text_of(ran))
        assert (out["exit_code"], out["stdout"], out["stderr"]) == (3, "hi from mcp\n", "oops\n"), out

        listed = json.loads(text_of(await session.call_tool("list_files", {"sandbox_id": sandbox, "path": "/workspace/notes"})))
        assert [(e["name"], e["type"], e["size"]) for e in listed["entries"]] == [("hello.txt", "file", 12)], listed

        started = await session.call_tool(
            "start_process", {"sandbox_id": sandbox, "argv": ["sh", "-c", "echo one; sleep 1; echo two"]}
        )
        assert not started.is_error, text_of(started)
        pid = json.loads(text_of(started))["pid"]
        output = json.loads(text_of(await session.call_tool("process_output", {"sandbox_id": sandbox, "pid": pid, "wait_ms": 10000})))
        assert output["output"] == "one\ntwo\n" and output["process"]["running"] is False, output

    asyncio.run(with_session(ADA, body))


def test_long_output_is_capped_and_says_so():
    sandbox = ensure(ADA, "mcp-ada")

    async def body(session):
        ran = await session.call_tool("exec", {"sandbox_id": sandbox, "argv": ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"]})
        out = json.loads(text_of(ran))
        assert len(out["stdout"]) == 64 * 1024 and out["stdout_bytes_left_out"] == 100000 - 64 * 1024, {k: v for k, v in out.items() if k != "stdout"}

    asyncio.run(with_session(ADA, body))


def test_another_users_sandbox_is_refused_as_an_mcp_error():
    bobs = ensure(BOB, "mcp-bob")

    async def body(session):
        for name, args in [
            ("exec", {"argv": ["true"]}),
            ("read_file", {"path": "/workspace"}),
            ("write_file", {"path": "/workspace/x", "content": "x"}),
            ("snapshot", {}),
        ]:
            result = await session.call_tool(name, {"sandbox_id": bobs, **args})
            assert result.is_error, (name, text_of(result))
            assert json.loads(text_of(result))["error"] == "permission_denied", (name, text_of(result))
        # The session is still usable after the refusals.
        assert (await session.list_tools()).tools

    asyncio.run(with_session(ADA, body))


def test_a_malformed_call_is_an_error_not_a_crash():
    sandbox = ensure(ADA, "mcp-ada")

    async def body(session):
        bad_id = await session.call_tool("exec", {"sandbox_id": "not-a-sandbox", "argv": ["true"]})
        assert bad_id.is_error and json.loads(text_of(bad_id))["error"] == "invalid_argument", text_of(bad_id)
        outside = await session.call_tool("read_file", {"sandbox_id": sandbox, "path": "/etc/passwd"})
        assert outside.is_error and json.loads(text_of(outside))["error"] == "invalid_argument", text_of(outside)

    asyncio.run(with_session(ADA, body))


def test_without_a_key_the_endpoint_answers_401():
    request = urllib.request.Request(
        URL + "/mcp",
        method="POST",
        data=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
    )
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("answered without a key")
    except urllib.error.HTTPError as e:
        assert e.code == 401
        assert json.loads(e.read())["error"] == "unauthenticated"


def test_a_sandbox_token_acts_in_its_own_sandbox_only():
    own = ensure(ADA, "mcp-token")
    other = ensure(ADA, "mcp-token-other")
    token = api("POST", f"/v1/orgs/acme/sandboxes/{own}/exec", ADA, {"argv": ["sh", "-c", 'cat "$SANDLANE_TOKEN_FILE"']})[
        "stdout"
    ].strip()

    async def body(session):
        # No org given: the token's own.
        mine = await session.call_tool("exec", {"sandbox_id": own, "argv": ["sh", "-c", "echo inside"]})
        assert not mine.is_error and json.loads(text_of(mine))["stdout"] == "inside\n", text_of(mine)
        theirs = await session.call_tool("exec", {"sandbox_id": other, "argv": ["true"]})
        assert theirs.is_error and json.loads(text_of(theirs))["error"] == "permission_denied", text_of(theirs)

    asyncio.run(with_session(token, body))

"""The async client against the real server: ensure, streamed exec, files, processes, audit."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from pathlib import Path
from typing import AsyncIterator

import pytest

from conftest import ORG, unique
from sandlane import AsyncSandlane, ExitFrame, OutputFrame, PermissionDeniedError

MIB = 1 << 20


async def lazy_bytes(total: int, seed: int, digest: "hashlib._Hash") -> AsyncIterator[bytes]:
    rng = random.Random(seed)
    left = total
    while left:
        block = rng.randbytes(min(MIB, left))
        digest.update(block)
        left -= len(block)
        yield block
        await asyncio.sleep(0)


def test_async_ensure_stream_files_processes(server_url: str, user_key: str, user2_key: str, tmp_path: Path) -> None:
    tmp = tmp_path

    async def scenario() -> None:
        async with AsyncSandlane(server_url, user_key, org=ORG) as client:
            session = unique("py-async")
            result = await client.ensure_session(session, execution_id="exec-1")
            sbx = result.require_sandbox()
            assert sbx.info is not None and sbx.info.state == "ready"
            assert (await client.get_sandbox(sbx.id)).id == sbx.id

            # Streamed exec: the first frame before the command ends.
            start = time.monotonic()
            frames: list[tuple[float, OutputFrame | ExitFrame]] = []
            async with sbx.exec_stream("echo a; sleep 2; printf '\\377b\\n'") as stream:
                async for frame in stream:
                    frames.append((time.monotonic() - start, frame))
            assert frames[0][0] < 1.0 and isinstance(frames[0][1], OutputFrame) and frames[0][1].data == b"a\n"
            out = b"".join(f.data for _, f in frames if isinstance(f, OutputFrame))
            assert out == b"a\n\xffb\n"
            assert isinstance(frames[-1][1], ExitFrame) and frames[-1][0] >= 2.0
            assert (await sbx.exec("echo hi")).stdout == "hi\n"

            # Files both ways, streamed: an async generator up, an async iterator down.
            size = 16 * MIB
            sent = hashlib.sha256()
            written = await sbx.files.write("async/blob.bin", lazy_bytes(size, 7, sent))
            assert written.size == size
            got = hashlib.sha256()
            received = 0
            async with sbx.files.read("async/blob.bin") as download:
                async for chunk in download:
                    got.update(chunk)
                    received += len(chunk)
            assert received == size and got.digest() == sent.digest()
            assert [e.name for e in await sbx.files.list("async")] == ["blob.bin"]
            await sbx.files.write("async/small.txt", b"small")
            assert await sbx.files.read_text("async/small.txt") == "small"
            await sbx.files.delete("async", recursive=True)

            # A directory both ways.
            local = tmp / "up"
            (local / "d").mkdir(parents=True)
            (local / "d" / "f.txt").write_text("in a dir")
            assert (await sbx.files.upload_dir(local, "tree")).entries >= 2
            assert await sbx.files.download_dir("tree", tmp / "down") >= 2
            assert (tmp / "down" / "d" / "f.txt").read_text() == "in a dir"

            # A background process followed to its exit.
            proc = await sbx.processes.start("echo one; sleep 0.5; echo two; exit 5")
            seen = bytearray()
            async for frame in sbx.processes.output(proc.pid):
                if isinstance(frame, OutputFrame):
                    seen += frame.data
            assert seen == b"one\ntwo\n"
            assert (await sbx.processes.get(proc.pid)).exit_code == 5

            # Another user: a typed 403.
            async with AsyncSandlane(server_url, user2_key, org=ORG) as other:
                with pytest.raises(PermissionDeniedError) as denied:
                    await other.sandbox(sbx.id).exec(["true"])
                assert denied.value.status == 403

            # Snapshot and fork.
            await sbx.files.write("keep.txt", "kept")
            snap = await sbx.snapshot()
            fork_key = unique("py-async-fork")
            fork = (await client.ensure_session(fork_key, execution_id="e", from_snapshot=snap.id)).require_sandbox()
            assert await fork.files.read_text("keep.txt") == "kept"
            await fork.deprovision()
            await client.snapshots.delete(snap.id)
            await client.deprovision_session(session)

    asyncio.run(scenario())


def test_async_audit_tail(server_url: str, user_key: str, service_key: str) -> None:
    async def scenario() -> None:
        async with AsyncSandlane(server_url, service_key, org=ORG) as service, AsyncSandlane(
            server_url, user_key, org=ORG
        ) as client:
            start = 0
            async for event in service.audit.tail():
                start = event.seq
            key = unique("py-async-audit")
            for i in range(50):
                await client.ensure_session(key, execution_id=f"e{i}")
            seqs = [e.seq async for e in service.audit.tail(after=start, limit=7) if e.key == key]
            assert len(seqs) == 50 and seqs == sorted(set(seqs))
            await client.deprovision_session(key)

    asyncio.run(scenario())

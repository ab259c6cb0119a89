"""Directories as tar streams, both ways, without holding a file or the archive whole.

:func:`tar_directory` makes a tar of a local directory lazily, a header and a chunk at a
time (what :meth:`Files.upload_dir` sends); :class:`ChunkReader` turns an iterator of
chunks into a file object that :mod:`tarfile`'s streaming mode (``r|``) reads from (what
:meth:`Files.download_dir` unpacks).
"""

from __future__ import annotations

import os
import stat
import tarfile
from typing import Iterator

__all__ = ["tar_directory", "ChunkReader", "extract_stream"]

BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1 << 20


def tar_directory(root: str | os.PathLike[str]) -> Iterator[bytes]:
    """A tar (pax) of ``root``'s contents, paths relative to it, made as it is read.

    Files, directories and symlinks (as links, never followed); other kinds are left out.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        names = sorted(dirnames + filenames)
        if rel_dir != ".":
            yield from _entry(dirpath, rel_dir)
        for name in names:
            full = os.path.join(dirpath, name)
            if name in dirnames and not os.path.islink(full):
                continue  # walked into: its header comes with its own turn
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            yield from _entry(full, rel)
    yield b"\0" * (2 * BLOCK)


def _entry(full: str, rel: str) -> Iterator[bytes]:
    st = os.lstat(full)
    info = tarfile.TarInfo(rel.replace(os.sep, "/"))
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(full)
        yield info.tobuf(tarfile.PAX_FORMAT)
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        yield info.tobuf(tarfile.PAX_FORMAT)
    elif stat.S_ISREG(st.st_mode):
        with open(full, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            info.size = size
            yield info.tobuf(tarfile.PAX_FORMAT)
            left = size
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    raise OSError(f"{full} shrank while it was archived")
                left -= len(chunk)
                yield chunk
        if size % BLOCK:
            yield b"\0" * (BLOCK - size % BLOCK)


class ChunkReader:
    """A read-only binary file object over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when negative)."""
        if size < 0:
            rest = self._buf + b"".join(self._chunks)
            self._buf = b""
            return rest
        while len(self._buf) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf += chunk
        out, self._buf = self._buf[:size], self._buf[size:]
        return out


def extract_stream(chunks: Iterator[bytes], dest: str | os.PathLike[str]) -> int:
    """Unpack a tar read from ``chunks`` into ``dest`` (created); the number of entries.

    Uses :mod:`tarfile`'s ``data`` filter where the Python has it (no absolute names, no
    ``..``, no links leading out, no devices).
    """
    os.makedirs(dest, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, dest, filter="data")
            else:  # pragma: no cover - Pythons before the extraction filters
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise tarfile.TarError(f"refusing {member.name!r}")
                tar.extract(member, dest)
            count += 1
    return count

"""Where the bytes of a wheel being rewritten come from, so that what is checked is what is written.

Two ways to read a source wheel, both handing ``zipraw.RawZipWriter`` the same bytes they vouch for:

- ``Snapshot``: the whole file read into memory once, with its sha256; every later read (the zip directory,
  each member inflated for verification, the ranges copied out) is served from that one copy, so a file that
  changes on disk meanwhile cannot slip other bytes between the check and the copy.
- ``Streamed``: the file read once from front to back while it is copied out (no copy of it in memory), every
  byte hashed on the way in a helper thread; the few reads made before the copy (the zip directory, the
  members to patch, the dist-info files) are kept and compared with the bytes the pass reads at the same
  offsets. ``finish()`` gives the sha256 of the whole file as read, so a caller can hold it against a pin
  before it publishes anything written from it.

Both open the file with ``open_wheel``: a regular file of at most ``max_wheel_bytes()`` (checked on the open file,
opened without waiting, so a FIFO named ``*.whl`` is refused instead of blocking and a link to ``/dev/zero`` is
refused instead of read without end). ``check_wheel_file`` is the same check for readers that open by path.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, cast

CHUNK = 4 << 20
MAX_WHEEL_BYTES = 4 << 30  # the largest CUDA wheels are well under 1 GiB; G4BUILD_MAX_WHEEL_BYTES changes it
_MAX_ENV = "G4BUILD_MAX_WHEEL_BYTES"


class NotAWheelFile(OSError):
    """The path is not a regular file a wheel can be, or is larger than a wheel may be."""


def max_wheel_bytes() -> int:
    text = os.environ.get(_MAX_ENV, "").strip()
    if text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    return MAX_WHEEL_BYTES


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def open_wheel(path: Path) -> BinaryIO:
    """``path`` opened for reading once it is known to be a regular file of at most ``max_wheel_bytes()``
    (after links are followed); else NotAWheelFile saying what was found. Never waits on a FIFO."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        limit = max_wheel_bytes()
        if not stat.S_ISREG(info.st_mode):
            raise NotAWheelFile(f"{path}: expected a wheel (a regular file), found {_kind(info.st_mode)}")
        if info.st_size > limit:
            raise NotAWheelFile(f"{path}: {info.st_size} bytes, more than the {limit} a wheel may be "
                                f"({_MAX_ENV} raises the limit)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_wheel_file(path: Path) -> int:
    """The size of ``path`` when ``open_wheel`` takes it; else NotAWheelFile (or the OSError of the open)."""
    with open_wheel(path) as fh:
        return os.fstat(fh.fileno()).st_size


class SourceChanged(Exception):
    """The file's bytes at an offset read twice were not the same: it changed while it was read."""


class Snapshot:
    """A whole file held in memory, read once; ``sha256`` is computed from the bytes held (when first asked
    for, once: ``hash_in_background`` starts it in a thread of its own, beside other work)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._view = memoryview(data)
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g4build-sha256")
        self._digest: Future[str] | None = None

    def hash_in_background(self) -> Future[str]:
        if self._digest is None:
            self._digest = self._hasher.submit(lambda: hashlib.sha256(self.data).hexdigest())
            self._hasher.shutdown(wait=False)  # the thread ends once the digest is done
        return self._digest

    @property
    def sha256(self) -> str:
        return self.hash_in_background().result()

    @classmethod
    def read(cls, path: Path) -> Snapshot:
        limit = max_wheel_bytes()
        with open_wheel(path) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:  # it grew while read
            raise NotAWheelFile(f"{path}: more than the {limit} bytes a wheel may be ({_MAX_ENV} raises the limit)")
        return cls(data)

    def file(self) -> BinaryIO:
        """A file object over the held bytes (one per reader: each has its own position)."""
        return io.BytesIO(self.data)

    def read_at(self, offset: int, count: int) -> bytes:
        return bytes(self._view[offset:offset + count])

    def copy_to(self, out: BinaryIO, offset: int, count: int) -> None:
        if offset + count > len(self.data):
            raise SourceChanged(f"a copy of {count} bytes at {offset} runs past the end ({len(self.data)} bytes)")
        out.write(self._view[offset:offset + count])


class _Recording(io.RawIOBase):
    """A read-only view of the file that keeps every read (offset, bytes) for the pass to compare."""

    def __init__(self, fh: BinaryIO, reads: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self._fh = fh
        self._reads = reads
        self._pos = 0
        self.sealed = False  # the pass has begun: no more random reads

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            self._pos = self._fh.seek(offset, os.SEEK_END)
        else:
            self._pos = offset if whence == os.SEEK_SET else self._pos + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if self.sealed:
            raise SourceChanged("the file was read at random after its pass began")
        self._fh.seek(self._pos)
        data = self._fh.read() if size is None or size < 0 else self._fh.read(size)
        if data:
            self._reads.append((self._pos, data))
            self._pos += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer)[:len(data)] = data
        return len(data)


class Streamed:
    """A file read front to back once while it is copied; see the module's docstring."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._reads: list[tuple[int, bytes]] = []
        self._recording = _Recording(fh, self._reads)
        self._digest = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g4build-sha256")
        self._buffers = [bytearray(CHUNK), bytearray(CHUNK)]
        self._pending: list[Future[None] | None] = [None, None]
        self._turn = 0
        self._view = memoryview(b"")  # the chunk read last: the file's bytes [_start, _end)
        self._start = 0
        self._end = 0
        self._served = 0  # the pass only goes forward: nothing before this offset is asked for again
        self._kept: list[tuple[int, bytes]] | None = None
        self._done: str | None = None
        self._changed: str | None = None  # set once two reads disagreed: no digest vouches for this pass

    @classmethod
    def open(cls, path: Path) -> Streamed:
        return cls(open_wheel(path))

    def __enter__(self) -> Streamed:
        return self

    def __exit__(self, *exc: object) -> None:
        self._hasher.shutdown(wait=True)
        self._fh.close()

    def file(self) -> BinaryIO:
        """The file for random reads (a ``zipfile.ZipFile``), allowed only before the pass begins."""
        return cast(BinaryIO, self._recording)

    def _pull(self) -> bool:
        """Read the next chunk (the pass's own read), hash it in the helper thread, compare the kept reads
        that overlap it; False at the end of the file."""
        if self._kept is None:
            self._recording.sealed = True
            self._kept = sorted(self._reads)
        turn = self._turn
        if (pending := self._pending[turn]) is not None:
            pending.result()  # the buffer is hashed before it is read into again
        buffer = self._buffers[turn]
        self._fh.seek(self._end)
        n = self._fh.readinto(buffer)  # type: ignore[attr-defined]
        if not n:
            return False
        view = memoryview(buffer)[:n]
        self._pending[turn] = self._hasher.submit(self._digest.update, view)
        self._turn = 1 - turn
        self._start, self._end, self._view = self._end, self._end + n, view
        for offset, data in self._kept:
            lo, hi = max(self._start, offset), min(self._end, offset + len(data))
            if lo < hi and view[lo - self._start:hi - self._start] != data[lo - offset:hi - offset]:
                self._changed = f"the bytes at offset {lo} were other bytes when read before"
                raise SourceChanged(self._changed)
        return True

    def _take(self, offset: int, count: int, sink: BinaryIO | None) -> bytes:
        """The bytes [offset, offset+count), to ``sink`` (or returned when there is none); the bytes before
        them are hashed and dropped."""
        if self._done is not None or offset < self._served:
            raise SourceChanged(f"a read at offset {offset} goes back before {self._served} (members overlap?)")
        kept = []
        end = offset + count
        while offset < end:
            while self._end <= offset:
                if not self._pull():
                    raise SourceChanged(f"the file ends at {self._end} bytes, before the {end} asked for")
            piece = self._view[offset - self._start:min(self._end, end) - self._start]
            if sink is None:
                kept.append(bytes(piece))
            else:
                sink.write(piece)
            offset += len(piece)
        self._served = end
        return b"".join(kept)

    def read_at(self, offset: int, count: int) -> bytes:
        return self._take(offset, count, None)

    def copy_to(self, out: BinaryIO, offset: int, count: int) -> None:
        self._take(offset, count, out)

    def finish(self) -> str:
        """Hash the rest of the file; the sha256 (hex) of every byte the pass read, from the first to the last.
        Raises SourceChanged, now and on every later call, when the pass found bytes that a read before it saw
        otherwise."""
        if self._changed is not None:
            raise SourceChanged(self._changed)
        if self._done is None:
            while self._pull():
                pass
            for pending in self._pending:
                if pending is not None:
                    pending.result()
            self._done = self._digest.hexdigest()
        return self._done

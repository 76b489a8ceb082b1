"""Tar archives of local directories (streamed to the server while they are
written) and defensive extraction of archives that come from sandboxes."""

from __future__ import annotations

import asyncio
import os
import posixpath
import stat
import tarfile
import threading
from typing import IO, AsyncIterator, List, Optional, Tuple

from .errors import ArchiveError

CHUNK = 1 << 20


class _Stop(Exception):
    """The consumer of a tar stream went away."""


class _ChunkWriter:
    """A file object for tarfile's writing thread that hands chunks of
    about CHUNK bytes to the event loop, with backpressure."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: "asyncio.Queue[object]",
                 room: threading.Semaphore, stop: threading.Event) -> None:
        self._loop = loop
        self._queue = queue
        self._room = room
        self._stop = stop
        self._buf = bytearray()

    def write(self, b: bytes) -> int:
        self._buf += b
        if len(self._buf) >= CHUNK:
            self.flush()
        return len(b)

    def flush(self) -> None:
        if self._buf:
            self.put(bytes(self._buf))
            self._buf = bytearray()

    def put(self, item: object) -> None:
        self._room.acquire()
        if self._stop.is_set():
            raise _Stop()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)


def _raise(e: OSError) -> None:
    raise e


def _write_tree(root: str, out: _ChunkWriter) -> None:
    """Write the tree under root as a tar archive, names relative to root:
    directories, regular files and symlinks with their permission bits and
    modification times; hard links as separate copies; other files left
    out."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tw:  # type: ignore[call-overload]
        for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            names = sorted(dirnames + filenames)
            for name in names:
                full = os.path.join(dirpath, name)
                rel = name if rel_dir == "." else posixpath.join(rel_dir.replace(os.sep, "/"), name)
                st = os.lstat(full)
                info = tarfile.TarInfo(rel)
                info.mode = stat.S_IMODE(st.st_mode)
                info.mtime = int(st.st_mtime)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tw.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.type = tarfile.REGTYPE
                    with open(full, "rb") as f:
                        info.size = os.fstat(f.fileno()).st_size
                        tw.addfile(info, f)
                elif stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(full)
                    tw.addfile(info)
                # devices, fifos and sockets are left out
    out.flush()


async def tar_chunks(root: str) -> AsyncIterator[bytes]:
    """Yield a tar archive of the tree under root in chunks, written by a
    thread while they are sent."""
    if not os.path.isdir(root):
        raise NotADirectoryError("upload %s: not a directory" % root)
    loop = asyncio.get_running_loop()
    queue: "asyncio.Queue[object]" = asyncio.Queue()
    room = threading.Semaphore(4)
    stop = threading.Event()
    writer = _ChunkWriter(loop, queue, room, stop)
    done = object()

    def produce() -> None:
        try:
            _write_tree(root, writer)
            writer.put(done)
        except _Stop:
            pass
        except BaseException as e:  # handed to the consumer
            try:
                writer.put(e)
            except _Stop:
                pass

    worker = loop.run_in_executor(None, produce)
    try:
        while True:
            item = await queue.get()
            room.release()
            if item is done:
                break
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        room.release()  # wake the writer if it waits for room
        await asyncio.shield(worker)


def _entry_name(n: str) -> str:
    """Check an archive entry's name and return it cleaned, "." for the
    archive's root."""
    if not n or "\x00" in n:
        raise ArchiveError("entry %r: invalid name" % n)
    if n.startswith("/"):
        raise ArchiveError("entry %r: absolute name" % n)
    if ".." in n.split("/"):
        raise ArchiveError("entry %r: a .. element leaves the directory" % n)
    return posixpath.normpath(n)


def _strip(name: str, strip: str, orig: str) -> str:
    if not strip:
        return name
    if name == strip:
        return "."
    if name.startswith(strip + "/"):
        return name[len(strip) + 1:]
    raise ArchiveError("entry %r is outside the archive's directory %s" % (orig, strip))


def _parents(root: str, name: str) -> str:
    """Create the parent directories of name under root (0755), refusing to
    go through anything that is not a real directory; return the full path
    of name."""
    parts = name.split("/")
    cur = root
    for p in parts[:-1]:
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise ArchiveError("%s: the path goes through a symlink" % name)
        if not stat.S_ISDIR(st.st_mode):
            raise ArchiveError("%s: a file is in the way" % name)
    return os.path.join(cur, parts[-1])


def _make_room(root: str, name: str) -> str:
    """Create name's parents and remove what is at name, unless it is a
    directory (an error: an archive does not replace trees)."""
    full = _parents(root, name)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return full
    if stat.S_ISDIR(st.st_mode):
        raise ArchiveError("%s: a directory is in the way" % name)
    os.unlink(full)
    return full


def extract(fileobj: IO[bytes], local_dir: str, base: str) -> None:
    """Extract the archive in fileobj into local_dir (created if missing).

    Names that are absolute or contain .., paths through symlinks and
    device entries are errors; nothing is written outside local_dir.
    Symlinks are created as they are, never followed while extracting.
    Permission bits are kept without setuid, setgid and sticky bits; owners
    are not; fifos are left out. An archive whose first entry is a
    directory named base (the last element of the path it was made from)
    is taken to be rooted there, and that element is stripped.
    """
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    dirs: List[Tuple[str, int, float]] = []
    strip = ""
    with tarfile.open(fileobj=fileobj, mode="r|") as tr:  # type: ignore[call-overload]
        first = True
        for m in tr:
            name = _entry_name(m.name)
            if first and m.isdir() and name == base and base not in (".", "/", ""):
                strip = base
            first = False
            name = _strip(name, strip, m.name)
            if name == ".":
                continue
            perm = m.mode & 0o777
            if m.isdir():
                full = _parents(root, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    os.mkdir(full, 0o700)
                else:
                    if not stat.S_ISDIR(st.st_mode):
                        raise ArchiveError("%s: a file is in the way of a directory" % name)
                dirs.append((full, perm, m.mtime))
            elif m.isreg():
                full = _make_room(root, name)
                src = tr.extractfile(m)
                fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                with os.fdopen(fd, "wb") as f:
                    if src is not None:
                        # Chunks of zeros (a sparse entry's holes among
                        # them) are skipped: holes here too.
                        while True:
                            b = src.read(CHUNK)
                            if not b:
                                break
                            _write_holey(f, b)
                        f.truncate()
                    os.fchmod(f.fileno(), perm)
                os.utime(full, (m.mtime, m.mtime))
            elif m.issym():
                if not m.linkname or "\x00" in m.linkname:
                    raise ArchiveError("symlink %r has an invalid target" % m.name)
                full = _make_room(root, name)
                os.symlink(m.linkname, full)
            elif m.islnk():
                try:
                    target = _strip(_entry_name(m.linkname), strip, m.linkname)
                except ArchiveError:
                    target = "."
                if target == ".":
                    raise ArchiveError("hard link %r: bad target %r" % (m.name, m.linkname))
                src_path = _parents(root, target)
                full = _make_room(root, name)
                os.link(src_path, full, follow_symlinks=False)
            elif m.ischr() or m.isblk():
                raise ArchiveError("entry %r is a device: devices are not extracted" % m.name)
            # fifos and types this version does not know are left out
    for full, perm, mtime in reversed(dirs):
        os.chmod(full, perm)
        os.utime(full, (mtime, mtime))


HOLE_BLOCK = 4096


def _write_holey(f: IO[bytes], b: bytes) -> None:
    """Write b at f's position, seeking over its whole zero blocks."""
    if b.count(0) == len(b):
        f.seek(len(b), os.SEEK_CUR)
        return
    i = 0
    while i < len(b):
        j = min(i + HOLE_BLOCK, len(b))
        if b[i:j].count(0) == j - i:
            f.seek(j - i, os.SEEK_CUR)
            i = j
            continue
        k = j
        while k < len(b):
            e = min(k + HOLE_BLOCK, len(b))
            if b[k:e].count(0) == e - k:
                break
            k = e
        f.write(b[i:k])
        i = k


class _SpoolWriter:
    """Spool a downloaded archive to a temporary file (memory first)."""

    def __init__(self) -> None:
        import tempfile

        self.file = tempfile.SpooledTemporaryFile(max_size=16 << 20)

    def write(self, b: bytes) -> int:
        return self.file.write(b)


def spool() -> _SpoolWriter:
    return _SpoolWriter()


def extract_spooled(sp: _SpoolWriter, local_dir: str, base: str) -> None:
    sp.file.seek(0)
    try:
        extract(sp.file, local_dir, base)  # type: ignore[arg-type]
    except tarfile.TarError as e:
        raise ArchiveError("bad archive from the sandbox: %s" % e) from None
    finally:
        sp.file.close()


def base_of(remote_path: str) -> str:
    return posixpath.basename(posixpath.normpath("/" + remote_path)) or "/"


def size_of(source: object) -> Optional[int]:
    try:
        return len(source)  # type: ignore[arg-type]
    except TypeError:
        return None

"""Directory archives without a server: the streamed tar of a local tree,
and defensive extraction of hostile archives."""

import asyncio
import io
import os
import stat
import tarfile
import tempfile
import unittest

import support  # noqa: F401

from libdsec import ArchiveError, _tar


def archive(*members):
    """Build a tar archive from (TarInfo, data) pairs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tw:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tw.addfile(info, io.BytesIO(data))
            else:
                tw.addfile(info)
    buf.seek(0)
    return buf


def entry(name, typ=tarfile.REGTYPE, linkname="", mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.type = typ
    ti.linkname = linkname
    ti.mode = mode
    return ti


class TarTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name

    def test_round_trip(self):
        src = os.path.join(self.root, "src")
        os.makedirs(os.path.join(src, "d", "e"))
        with open(os.path.join(src, "d", "f.sh"), "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(os.path.join(src, "d", "f.sh"), 0o750)
        with open(os.path.join(src, "big"), "wb") as f:
            f.write(os.urandom(3 << 20))
        os.symlink("d/f.sh", os.path.join(src, "link"))
        os.link(os.path.join(src, "big"), os.path.join(src, "hard"))
        os.mkfifo(os.path.join(src, "fifo"))

        async def collect():
            return b"".join([c async for c in _tar.tar_chunks(src)])

        data = asyncio.run(collect())
        with tarfile.open(fileobj=io.BytesIO(data)) as tr:
            kinds = {m.name: m.type for m in tr}
        self.assertEqual(kinds, {"big": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "d/e": tarfile.DIRTYPE,
                                 "d/f.sh": tarfile.REGTYPE, "hard": tarfile.REGTYPE, "link": tarfile.SYMTYPE})
        dst = os.path.join(self.root, "dst")
        _tar.extract(io.BytesIO(data), dst, "src")
        with open(os.path.join(dst, "hard"), "rb") as a, open(os.path.join(src, "big"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(os.readlink(os.path.join(dst, "link")), "d/f.sh")
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(dst, "d", "f.sh")).st_mode), 0o750)

    def test_abandoned_stream_stops_the_writer(self):
        src = os.path.join(self.root, "src")
        os.makedirs(src)
        for i in range(8):
            with open(os.path.join(src, "f%d" % i), "wb") as f:
                f.write(os.urandom(1 << 20))

        async def first_only():
            gen = _tar.tar_chunks(src)
            chunk = await gen.__anext__()
            await gen.aclose()  # must not hang on the blocked writer thread
            return chunk

        self.assertTrue(asyncio.run(asyncio.wait_for(first_only(), 10)))

    def test_rooted_archive_is_stripped(self):
        buf = archive((entry("proj", tarfile.DIRTYPE, mode=0o755), None), (entry("proj/a"), b"A"))
        _tar.extract(buf, self.root, "proj")
        self.assertEqual(os.listdir(self.root), ["a"])

    def test_hostile_archives(self):
        outside = os.path.join(self.root, "outside")
        os.makedirs(outside)
        cases = {
            "absolute": [(entry("/etc/x"), b"x")],
            "dotdot": [(entry("a/../../x"), b"x")],
            "through a symlink": [(entry("l", tarfile.SYMTYPE, linkname=outside), None), (entry("l/x"), b"x")],
            "device": [(entry("dev", tarfile.CHRTYPE), None)],
            "hard link out": [(entry("h", tarfile.LNKTYPE, linkname="../outside/y"), None)],
            "outside the root dir": [(entry("proj", tarfile.DIRTYPE), None), (entry("other"), b"x")],
        }
        for name, members in cases.items():
            with self.subTest(name):
                dst = os.path.join(self.root, "dst-" + name.replace(" ", "-"))
                with self.assertRaises(ArchiveError):
                    _tar.extract(archive(*members), dst, "proj")
                self.assertEqual(os.listdir(outside), [], "wrote outside the target")

    def test_symlink_target_replaced_not_followed(self):
        victim = os.path.join(self.root, "victim")
        with open(victim, "w") as f:
            f.write("keep")
        dst = os.path.join(self.root, "dst")
        # A symlink, then a file of the same name: the link is replaced.
        _tar.extract(archive((entry("f", tarfile.SYMTYPE, linkname=victim), None), (entry("f"), b"new")), dst, "x")
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")
        with open(os.path.join(dst, "f")) as f:
            self.assertEqual(f.read(), "new")

    def test_sparse_entry_stays_sparse(self):
        """A PAX GNU sparse 1.0 entry, as the server sends a file with
        holes, is extracted with its holes."""
        real = 1 << 30
        sparse_map = b"2\n0\n4\n%d\n4\n" % (real - 4)
        sparse_map += b"\0" * (-len(sparse_map) % 512)
        data = sparse_map + b"headtail"
        info = entry("GNUSparseFile.0/big")
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "big",
            "GNU.sparse.realsize": str(real),
        }
        dst = os.path.join(self.root, "out")
        _tar.extract(archive((info, data)), dst, "out")
        path = os.path.join(dst, "big")
        st = os.stat(path)
        self.assertEqual(st.st_size, real)
        self.assertLess(st.st_blocks * 512, 1 << 20, "the holes were written")
        with open(path, "rb") as f:
            self.assertEqual(f.read(4), b"head")
            f.seek(real - 4)
            self.assertEqual(f.read(), b"tail")


if __name__ == "__main__":
    unittest.main()

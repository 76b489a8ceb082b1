"""Every public method against a real `dsec up` (see support.py for the
settings)."""

import asyncio
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import unittest

import support
from support import IMAGE, LiveTestCase

import libdsec
from libdsec import DSecClient, DSecContainerRunArgs


class ListingTest(unittest.IsolatedAsyncioTestCase):
    """The issue's listing, verbatim but for the image."""

    async def asyncSetUp(self):
        self.addr, self.key = support.live_settings()
        os.environ["DSEC_ADDR"], os.environ["DSEC_API_KEY"] = self.addr, self.key

    async def test_listing(self):
        client = DSecClient(); await client.open()
        args = DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=4096, cpu_cores_limit=4,
                                    ttl_running_stop=300, network_rules={"pypi": True, "npm": False},
                                    init_user="root")
        sandbox = await client.run_container(args, timeout=120)
        result = await sandbox.run_shell("echo hello world")
        await sandbox.stop()

        self.assertEqual(result.stdout, "hello world\n")
        self.assertEqual(result.exit_code, 0)
        self.assertEqual(sandbox.state, "deleted")
        self.assertEqual(sandbox.resources.memory, 4096 << 20)
        # A CPU cap above the node's cores is clamped to them.
        self.assertEqual(sandbox.resources.cpus, min(4, os.cpu_count() or 4))
        with self.assertRaises(libdsec.NotFoundError):
            await client.get(sandbox.id)
        await client.close()

    async def test_network_rules(self):
        # DSec's listing with its network rules: the sandbox runs with them,
        # and network() shows them in force.
        async with DSecClient() as client:
            args = DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=64, ttl_running_stop=300,
                                        network_rules={"pypi": True, "npm": False}, init_user="root")
            sandbox = await client.run_container(args, timeout=120)
            try:
                info = await sandbox.network()
                self.assertEqual([(r["action"], r.get("service")) for r in info.policy["rules"]],
                                 [("allow", "pypi"), ("deny", "npm")])
                with self.assertRaises(libdsec.InvalidArgumentError) as cm:
                    await sandbox.update_network(network_rules={"pipy": True})
                self.assertIn("pipy", str(cm.exception))
            finally:
                await sandbox.stop()


class ExecTest(support.SharedSandboxTestCase):
    create_args = {"env": {"GREETING": "hi"}}

    async def test_argv_shell_env_cwd_user(self):
        r = await self.sb.exec(["sh", "-c", 'echo "$GREETING $X $(pwd) $(id -u)"; echo oops >&2; exit 7'],
                               env={"X": "there"}, cwd="/tmp", user="1000")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok), ("hi there /tmp 1000\n", "oops\n", 7, False))
        self.assertTrue(r.exec_id)
        self.assertGreater(r.duration, 0)
        r = await self.sb.run_shell("echo $0 $(hostname)")
        self.assertEqual(r.stdout, "/bin/sh %s\n" % self.sb.id)
        r = await self.sb.exec("cat; echo", stdin=b"from stdin")
        self.assertEqual(r.stdout, "from stdin\n")
        r = await self.sb.exec(["echo", "$HOME", "a b"])  # argv: no shell
        self.assertEqual(r.stdout, "$HOME a b\n")

    async def test_exit_kinds(self):
        r = await self.sb.run_shell("sleep 10", timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.code, 124)
        self.assertLess(r.duration, 5)
        r = await self.sb.run_shell("kill -9 $$")
        self.assertEqual((r.signal, r.code), (9, 137))
        r = await self.sb.run_shell("head -c 100000 /dev/zero", output_limit=1000)
        self.assertTrue(r.stdout_truncated)
        self.assertEqual(len(r.stdout_bytes), 1000)
        with self.assertRaises(libdsec.FailedPreconditionError):
            (await self.sb.run_shell("exit 2")).check()
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.sb.exec([])

    async def test_large_output(self):
        r = await self.sb.run_shell("head -c 3000000 /dev/zero | tr '\\0' x")
        self.assertEqual(r.stdout_bytes, b"x" * 3000000)

    async def test_streaming_is_incremental(self):
        proc = await self.sb.start("echo first; sleep 2; echo second >&2")
        t0 = time.monotonic()
        first = await proc.__anext__()
        self.assertLess(time.monotonic() - t0, 1.5, "the first line waited for the command's end")
        self.assertEqual((first.stream, first.data), ("stdout", b"first\n"))
        chunks = [c async for c in proc]
        self.assertEqual([(c.stream, c.text) for c in chunks], [("stderr", "second\n")])
        self.assertEqual(proc.exit.exit_code, 0)
        self.assertGreater(time.monotonic() - t0, 1.5)

    async def test_stdin(self):
        async with await self.sb.start(["cat"], stdin=b"one\n", stdin_open=True) as proc:
            # The initial bytes first (the server does not order them before
            # later writes), then more.
            self.assertEqual((await proc.__anext__()).data, b"one\n")
            await proc.write_stdin("two\n")
            await proc.write_stdin(b"three\n", close=True)
            r = await proc.wait()
        self.assertEqual(r.stdout, "two\nthree\n")
        # cat ends only when its input is closed.
        proc = await self.sb.start(["sh", "-c", "cat; echo end"], stdin_open=True)
        await self.sb.write_stdin(proc.exec_id, "x\n")
        await proc.close_stdin()
        self.assertEqual((await proc.wait()).stdout, "x\nend\n")

    async def test_tty_and_resize(self):
        proc = await self.sb.start("stty size; read line; stty size", tty=True, rows=30, cols=100)
        out = b""
        while b"30 100" not in out:
            out += (await proc.__anext__()).data
        await proc.resize(40, 120)
        await proc.write_stdin("go\n")
        r = await proc.wait()
        self.assertIn("40 120", r.stdout)
        self.assertEqual(r.stderr, "")  # one stream on a terminal
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.sb.resize_tty(proc.exec_id, 0, 10)

    async def test_detached_attach_and_journal(self):
        exec_id = await self.sb.exec_detached(
            "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.1; done")
        self.assertTrue(exec_id)
        full = await (await self.sb.attach(exec_id)).wait()
        self.assertEqual(full.stdout, "".join("out%d\n" % i for i in range(1, 6)))
        self.assertEqual(full.stderr, "".join("err%d\n" % i for i in range(1, 6)))
        tail = await (await self.sb.attach(exec_id, stdout_offset=len("out1\nout2\n"), stderr_offset=5)).wait()
        self.assertEqual(tail.stdout, "out3\nout4\nout5\n")
        self.assertEqual(tail.stderr, "err2\nerr3\nerr4\nerr5\n")
        journal = await self.sb.list_execs()
        mine = [e for e in journal if e.exec_id == exec_id]
        self.assertEqual(len(mine), 1)
        self.assertFalse(mine[0].running)
        self.assertEqual(mine[0].exit.exit_code, 0)
        self.assertEqual((mine[0].stdout_bytes, mine[0].stderr_bytes), (25, 25))
        self.assertIsNotNone(mine[0].started_at)
        with self.assertRaises(libdsec.NotFoundError):
            await (await self.sb.attach("x-no-such-exec")).wait()

    async def test_reattach_after_losing_the_stream(self):
        proc = await self.sb.start("for i in $(seq 1 20); do echo line$i; sleep 0.05; done")
        got = b""
        while len(got) < 20:
            got += (await proc.__anext__()).data
        await proc.close()
        with self.assertRaises(libdsec.FailedPreconditionError) as cm:
            await proc.wait()
        self.assertEqual(cm.exception.exec_id, proc.exec_id)
        rest = await (await self.sb.attach(proc.exec_id, stdout_offset=proc.stdout_offset)).wait()
        self.assertEqual(got + rest.stdout_bytes, b"".join(b"line%d\n" % i for i in range(1, 21)))

    async def test_signal(self):
        proc = await self.sb.start("sleep 30")
        await proc.signal(9)
        r = await asyncio.wait_for(proc.wait(), 10)
        self.assertEqual(r.signal, 9)
        proc = await self.sb.start("trap 'echo term; exit 3' TERM; while true; do sleep 0.1; done")
        await asyncio.sleep(0.3)
        await self.sb.signal(proc.exec_id)
        r = await asyncio.wait_for(proc.wait(), 10)
        self.assertEqual((r.stdout, r.exit_code), ("term\n", 3))
        with self.assertRaises(libdsec.InvalidArgumentError):
            await proc.signal(99)


class FileTest(support.SharedSandboxTestCase):

    async def test_write_read_stat(self):
        data = bytes(range(256)) * 12000  # 3 MB, several chunks
        info = await self.sb.write_file("/data/in.bin", data, make_parents=True, mode=0o600)
        self.assertEqual((info.size, info.mode, info.type), (len(data), 0o600, "file"))
        self.assertEqual(await self.sb.read_file("/data/in.bin"), data)
        st = await self.sb.stat("/data/in.bin")
        self.assertEqual((st.size, st.mode, st.uid, st.name), (len(data), 0o600, 0, "in.bin"))
        self.assertEqual(stat.S_IFMT(st.st_mode), stat.S_IFREG)
        self.assertIsNotNone(st.mod_time)
        await self.sb.write_file("/data/owned.txt", "text é", owner="1000")
        self.assertEqual((await self.sb.stat("/data/owned.txt")).uid, 1000)
        self.assertEqual(await self.sb.read_file("/data/owned.txt"), "text é".encode())
        self.assertTrue(await self.sb.exists("/data"))
        self.assertFalse(await self.sb.exists("/nope"))
        with self.assertRaises(libdsec.NotFoundError):
            await self.sb.read_file("/nope")
        with self.assertRaises(libdsec.NotFoundError):
            await self.sb.write_file("/no/parent/x", b"x")

    async def test_streams(self):
        src = io.BytesIO(b"y" * 2500000)
        await self.sb.upload("/up.bin", src)
        out = io.BytesIO()
        info = await self.sb.download("/up.bin", out)
        self.assertEqual((info.size, out.getvalue()), (2500000, b"y" * 2500000))

        async def gen():
            for i in range(3):
                yield b"part%d;" % i

        await self.sb.upload("/gen.txt", gen())
        self.assertEqual(await self.sb.read_file("/gen.txt"), b"part0;part1;part2;")

        class Boom(Exception):
            pass

        async def failing():
            yield b"partial"
            raise Boom()

        await self.sb.write_file("/keep.txt", b"old")
        with self.assertRaises(Boom):
            await self.sb.upload("/keep.txt", failing())
        # The client breaks the request body (test_transport checks what it
        # sends) and the server keeps the old file.
        self.assertEqual(await self.sb.read_file("/keep.txt"), b"old")
        await self.sb.write_file("/keep.txt", b"new")
        self.assertEqual(await self.sb.read_file("/keep.txt"), b"new")

    async def test_dir_ops(self):
        await self.sb.mkdir("/a/b/c", parents=True)
        info = await self.sb.mkdir("/a/d", mode=0o700, owner="1000")
        self.assertEqual((info.mode, info.uid, info.is_dir), (0o700, 1000, True))
        await self.sb.mkdir("/a/b", parents=True)  # exists: fine with parents
        with self.assertRaises(libdsec.AlreadyExistsError):
            await self.sb.mkdir("/a/b")
        await self.sb.write_file("/a/f", b"1")
        await self.sb.run_shell("ln -s f /a/link")
        listing = await self.sb.list_dir("/a")
        self.assertEqual(listing.names(), ["b", "d", "f", "link"])
        self.assertFalse(listing.truncated)
        types = {e.name: e.type for e in listing}
        self.assertEqual(types, {"b": "dir", "d": "dir", "f": "file", "link": "symlink"})
        self.assertEqual(len(await self.sb.list_dir("/a", limit=2)), 2)
        await self.sb.write_file("/a/g", b"2")
        with self.assertRaises(libdsec.AlreadyExistsError):
            await self.sb.rename("/a/f", "/a/g")
        await self.sb.rename("/a/f", "/a/g", overwrite=True)
        self.assertEqual(await self.sb.read_file("/a/g"), b"1")
        with self.assertRaises(libdsec.DSecError):
            await self.sb.remove("/a/b")  # not empty
        await self.sb.remove("/a/b", recursive=True)
        await self.sb.remove("/a/g")
        self.assertEqual((await self.sb.list_dir("/a")).names(), ["d", "link"])
        with self.assertRaises(libdsec.NotFoundError):
            await self.sb.list_dir("/nope")

    async def test_paths_cannot_escape(self):
        await self.sb.run_shell("ln -s /../../../../etc /escape")
        data = await self.sb.read_file("/escape/../../../etc/hostname")
        self.assertEqual(data, (await self.sb.read_file("/etc/hostname")))

    async def test_upload_and_download_dirs(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            os.makedirs(os.path.join(src, "sub", "deep"))
            with open(os.path.join(src, "a.txt"), "w") as f:
                f.write("alpha")
            with open(os.path.join(src, "sub", "run.sh"), "w") as f:
                f.write("#!/bin/sh\necho ran\n")
            os.chmod(os.path.join(src, "sub", "run.sh"), 0o755)
            with open(os.path.join(src, "sub", "deep", "big.bin"), "wb") as f:
                f.write(os.urandom(3 << 20))
            os.symlink("a.txt", os.path.join(src, "ln"))
            st = await self.sb.upload_dir(src, "/srv/proj", make_parents=True)
            self.assertEqual((st.files, st.links), (3, 1))
            self.assertGreaterEqual(st.dirs, 2)  # sub, sub/deep, and what make_parents made
            self.assertEqual(st.bytes, 5 + 19 + (3 << 20))
            r = await self.sb.run_shell("cd /srv/proj && sub/run.sh && cat ln && readlink ln")
            self.assertEqual(r.stdout, "ran\nalphaa.txt\n")

            dst = os.path.join(tmp, "dst")
            await self.sb.download_dir("/srv/proj", dst)
            self.assertEqual(sorted(os.listdir(dst)), ["a.txt", "ln", "sub"])
            with open(os.path.join(dst, "sub", "deep", "big.bin"), "rb") as f, \
                    open(os.path.join(src, "sub", "deep", "big.bin"), "rb") as g:
                self.assertEqual(f.read(), g.read())
            self.assertEqual(os.readlink(os.path.join(dst, "ln")), "a.txt")
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(dst, "sub", "run.sh")).st_mode), 0o755)

            # A single file lands under its name.
            one = os.path.join(tmp, "one")
            await self.sb.download_dir("/srv/proj/a.txt", one)
            with open(os.path.join(one, "a.txt")) as f:
                self.assertEqual(f.read(), "alpha")

    async def test_raw_tar(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tw:
            data = b"in a tar"
            ti = tarfile.TarInfo("t/x.txt")
            ti.size = len(data)
            tw.addfile(ti, io.BytesIO(data))
        st = await self.sb.upload_tar("/tar", buf.getvalue(), make_parents=True, owner="1000")
        self.assertEqual(st.files, 1)
        self.assertEqual((await self.sb.stat("/tar/t/x.txt")).uid, 1000)
        out = io.BytesIO()
        n = await self.sb.download_tar("/tar", out)
        self.assertEqual(n, len(out.getvalue()))
        with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tr:
            names = tr.getnames()
            self.assertTrue(any(n.endswith("t/x.txt") for n in names), names)
        bad = io.BytesIO()
        with tarfile.open(fileobj=bad, mode="w") as tw:
            ti = tarfile.TarInfo("../escape")
            tw.addfile(ti, io.BytesIO(b""))
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.sb.upload_tar("/tar", bad.getvalue())
        with self.assertRaises(libdsec.NotFoundError):
            await self.sb.download_tar("/nope", io.BytesIO())


class LifecycleTest(LiveTestCase):
    async def test_get_list_labels_timeouts_stats(self):
        sb = await self.new_sandbox(labels={"role": "a"}, ttl=600, idle_ttl=120, workdir="/tmp", user="1000",
                                    cpus=0.5, disk="1G")
        self.assertEqual((sb.state, sb.idle_ttl, sb.workdir, sb.user), ("running", 120.0, "/tmp", "1000"))
        self.assertEqual((sb.resources.cpus, sb.resources.disk), (0.5, 1 << 30))
        self.assertEqual((await self.sb_run(sb, "id -u; pwd")), "1000\n/tmp\n")
        other = await self.new_sandbox(labels={"role": "b"})
        got = await self.client.get(sb.id)
        self.assertEqual((got.id, got.labels), (sb.id, {"job": self.job, "role": "a"}))
        self.assertEqual(got.node, sb.node)
        listed = await self.client.list_sandboxes({"job": self.job})
        self.assertEqual(sorted(s.id for s in listed), sorted([sb.id, other.id]))
        listed = await self.client.list_sandboxes(["job=" + self.job, "role=b"])
        self.assertEqual([s.id for s in listed], [other.id])

        old = sb.expires_at
        await sb.set_timeout(ttl=3000)
        self.assertGreater((sb.expires_at - old).total_seconds(), 2000)
        await sb.set_timeout(idle_ttl=60)
        self.assertEqual(sb.idle_ttl, 60.0)
        with self.assertRaises(libdsec.InvalidArgumentError):
            await sb.set_timeout()

        await sb.update_labels({"phase": "2"}, remove=["role"])
        self.assertEqual(sb.labels, {"job": self.job, "phase": "2"})
        handle = self.client.sandbox(sb.id)
        await handle.refresh()
        self.assertEqual(handle.labels, sb.labels)

        st = await sb.stats()
        self.assertEqual((st.memory_limit, st.cpus, st.disk_limit), (64 << 20, 0.5, 1 << 30))
        self.assertGreater(st.pids_limit, 0)

        await sb.stop()
        self.assertEqual(sb.state, "deleted")
        with self.assertRaises(libdsec.NotFoundError):
            await sb.stop()

    async def sb_run(self, sb, cmd):
        return (await sb.run_shell(cmd)).stdout

    async def test_batch_and_bulk_delete(self):
        args = DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=32, labels={"job": self.job, "b": "1"},
                                    idempotency_key=support.unique("batch"))
        results = await self.client.batch_create(args, 3)
        self.assertEqual([r.index for r in results], [0, 1, 2])
        self.assertTrue(all(r.sandbox and r.error is None for r in results), results)
        again = await self.client.batch_create(args, 3)  # same key: the same sandboxes
        self.assertEqual([r.sandbox.id for r in again], [r.sandbox.id for r in results])
        deleted = await self.client.delete_by_labels({"job": self.job, "b": "1"})
        self.assertEqual(sorted(deleted), sorted(r.sandbox.id for r in results))
        self.assertEqual(await self.client.list_sandboxes({"job": self.job, "b": "1"}), [])
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.delete_by_labels({})
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.batch_create(args, 1001)

    async def test_idempotent_create(self):
        key = support.unique("idem")
        a = await self.new_sandbox(idempotency_key=key)
        b = await self.new_sandbox(idempotency_key=key)
        self.assertEqual(a.id, b.id)
        with self.assertRaises(libdsec.FailedPreconditionError):
            await self.new_sandbox(idempotency_key=key, memory="32M")

    async def test_watch(self):
        first = await self.new_sandbox()
        w = await self.client.watch({"job": self.job}, initial=True)
        async with w:
            ev = await asyncio.wait_for(w.__anext__(), 10)
            self.assertEqual((ev.type, ev.sandbox.id), ("created", first.id))
            sb = await self.new_sandbox()
            await sb.update_labels({"phase": "2"})
            await sb.stop()
            want = [("created", sb.id), ("updated", sb.id), ("deleted", sb.id)]
            got = []
            while len(got) < len(want):
                ev = await asyncio.wait_for(w.__anext__(), 10)
                got.append((ev.type, ev.sandbox.id))
                self.assertIsNotNone(ev.time)
            self.assertEqual(got, want)
        with self.assertRaises(StopAsyncIteration):
            await w.__anext__()

    async def test_sandbox_context_manager(self):
        async with await self.new_sandbox() as sb:
            self.assertEqual((await sb.run_shell("echo in")).stdout, "in\n")
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get(sb.id)


class ErrorTest(LiveTestCase):
    async def test_kinds(self):
        sb = await self.new_sandbox()
        with self.assertRaises(libdsec.NotFoundError) as cm:
            await self.client.get(sb.node + "-aaaaaaaaaaaa")
        self.assertIn("not found", str(cm.exception))
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get("nonode-aaaaaaaaaaaa")
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.create("no-such-image:42")
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.create(IMAGE, memory=1)
        bad = DSecClient(self.addr, "not-a-key", max_retries=0)
        try:
            with self.assertRaises(libdsec.UnauthenticatedError) as cm:
                await bad.open()
            self.assertIn("dsec key create", str(cm.exception))
        finally:
            await bad.close()

    async def test_resource_exhausted_has_a_hint(self):
        # A project at its sandbox limit: waiting (or a delete) helps.
        project = support.unique("pyfull")
        await self.client.set_project_limits(project, sandboxes=1)
        secret, _ = await self.client.create_key(name=project, project=project)
        c = DSecClient(self.addr, secret, max_retries=0)
        try:
            sb = await c.create(IMAGE, labels={"job": self.job}, memory="32M")
            try:
                with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
                    await c.create(IMAGE, labels={"job": self.job}, memory="32M")
                self.assertGreater(cm.exception.retry_after, 0)
                self.assertIn(project, str(cm.exception))
            finally:
                await sb.stop()
        finally:
            await c.close()

    async def test_never_fits_has_no_hint(self):
        # No node could ever give it: no retry helps, none is hinted.
        c = DSecClient(self.addr, self.key, max_retries=0)
        try:
            with self.assertRaises(libdsec.InvalidArgumentError) as cm:
                await c.create(IMAGE, memory="1024T")
            self.assertIsNone(cm.exception.retry_after)
            self.assertIn("--memory", str(cm.exception))
        finally:
            await c.close()

    async def test_deadlines(self):
        with self.assertRaises(libdsec.DeadlineExceededError):
            await self.client.create(IMAGE, labels={"job": self.job}, timeout=0.001)
        sb = await self.new_sandbox()
        t0 = time.monotonic()
        with self.assertRaises(libdsec.DeadlineExceededError):
            await sb.read_file("/etc/hostname", timeout=0.0001)
        self.assertLess(time.monotonic() - t0, 2)
        self.assertEqual((await sb.run_shell("echo still fine")).stdout, "still fine\n")

    async def test_restricted_key(self):
        secret, key = await self.client.create_key(name=support.unique("k"), project=support.unique("p"))
        self.assertTrue(secret)
        self.assertFalse(key.admin)
        mine = await self.new_sandbox()
        async with DSecClient(self.addr, secret) as other:
            who = await other.whoami()
            self.assertEqual((who.id, who.project), (key.id, key.project))
            self.assertNotIn(mine.id, [s.id for s in await other.list_sandboxes()])
            with self.assertRaises(libdsec.DSecError) as cm:
                await other.get(mine.id)
            self.assertIsInstance(cm.exception, (libdsec.NotFoundError, libdsec.PermissionDeniedError))
            with self.assertRaises(libdsec.PermissionDeniedError):
                await other.create_key(name="nope")


class ImageTest(LiveTestCase):
    async def test_images(self):
        images = await self.client.list_images()
        name = IMAGE if ":" in IMAGE else IMAGE + ":latest"
        self.assertIn(name, [i.name for i in images])
        img = await self.client.get_image(IMAGE)
        self.assertEqual(img.name, name)
        self.assertTrue(img.layers and img.layers[0].digest.startswith("sha256:"))
        self.assertEqual(img.size, sum(lay.size for lay in img.layers))
        copy = support.unique("pycopy") + ":v1"
        made = await self.client.create_image(copy, [lay.digest for lay in img.layers],
                                              libdsec.ImageConfig(env=["FROM_IMAGE=1"], workdir="/tmp"))
        self.assertEqual(made.name, copy)
        sb = await self.client.create(copy, labels={"job": self.job}, memory="32M")
        self.assertEqual((await sb.run_shell("echo $FROM_IMAGE; pwd")).stdout, "1\n/tmp\n")
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.upload_layer(b"not what the digest says", "sha256:" + "0" * 64, 24)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get_image("no-such-image:1")

    async def test_upload_layer(self):
        mkfs = shutil.which("mkfs.erofs")
        if mkfs is None:
            if support.required():
                self.fail("mkfs.erofs is missing (apt-get install erofs-utils)")
            self.skipTest("mkfs.erofs is missing")
        with tempfile.TemporaryDirectory() as tmp:
            tree = os.path.join(tmp, "tree")
            os.makedirs(os.path.join(tree, "opt"))
            with open(os.path.join(tree, "opt", "added.txt"), "w") as f:
                f.write("from an uploaded layer\n")
            img_path = os.path.join(tmp, "layer.erofs")
            subprocess.run([mkfs, img_path, tree], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(img_path, "rb") as f:
                data = f.read()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            with open(img_path, "rb") as f:
                layer = await self.client.upload_layer(f, digest, len(data))
        self.assertEqual((layer.digest, layer.size), (digest, len(data)))
        self.assertTrue(layer.media_type)
        again = await self.client.upload_layer(data, digest, len(data))
        self.assertEqual(again.digest, digest)
        base = await self.client.get_image(IMAGE)
        name = support.unique("pylayer") + ":v1"
        await self.client.create_image(name, [lay.digest for lay in base.layers] + [digest])
        sb = await self.client.create(name, labels={"job": self.job}, memory="32M")
        self.assertEqual((await sb.run_shell("cat /opt/added.txt")).stdout, "from an uploaded layer\n")


class ConcurrencyTest(LiveTestCase):
    async def test_many_calls_share_few_connections(self):
        c = DSecClient(self.addr, self.key, max_concurrency=4)
        try:
            sbs = await asyncio.gather(*[c.create(IMAGE, labels={"job": self.job}, memory="32M")
                                         for _ in range(5)])
            results = await asyncio.gather(*[sb.run_shell("echo %d" % i) for i, sb in enumerate(sbs)])
            self.assertEqual([r.stdout for r in results], ["%d\n" % i for i in range(5)])
            self.assertLessEqual(c.transport_stats["connections"], 4)
        finally:
            await c.close()


if __name__ == "__main__":
    unittest.main()


class SessionGradingTest(LiveTestCase):
    """Shell sessions, sealed execs and grade_from (issue 12)."""

    async def test_session_keeps_state(self):
        sb = await self.new_sandbox()
        session = await sb.session("main")
        r = await session.run("cd /tmp && export FOO=bar && f() { echo fn $1; }")
        self.assertEqual((r.exit_code, r.session_lost, r.session_restarted), (0, False, False))
        r = await session.run("pwd; echo $FOO; f x; echo err >&2; exit 4")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("/tmp\nbar\nfn x\n", "err\n", 4))
        other = await sb.session("other")
        r = await other.run("echo ${FOO:-unset}")
        self.assertEqual(r.stdout, "unset\n")
        self.assertEqual([s.name for s in await sb.list_sessions()], ["main", "other"])
        await session.delete()
        with self.assertRaises(libdsec.NotFoundError):
            await sb.delete_session("main")
        self.assertEqual([s.name for s in await sb.list_sessions()], ["other"])
        journal = [e for e in await sb.list_execs() if e.session == "main"]
        self.assertGreaterEqual(len(journal), 2)

    async def test_sealed_and_grade_from(self):
        sb = await self.new_sandbox()
        r = await sb.exec("echo sealed", sealed=True)
        self.assertEqual((r.stdout, r.sealed, r.exit_code), ("sealed\n", True, 0))
        r = await sb.exec("true")
        self.assertFalse(r.sealed)
        await sb.run_shell("mkdir -p /workspace/out && echo 42 > /workspace/out/answer && echo no > /workspace/secret")
        g = await sb.grade_from(["/workspace/out"], "cat /workspace/out/answer; cat /workspace/secret 2>/dev/null; exit 3")
        self.assertEqual((g.stdout, g.exit_code), ("42\n", 3))
        self.assertTrue(g.grader_sandbox_id and g.grader_sandbox_id != sb.id)
        self.assertGreaterEqual(g.copied_files, 1)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get(g.grader_sandbox_id)
        r = await sb.exec("echo kill", sealed="kill")
        self.assertTrue(r.sealed)

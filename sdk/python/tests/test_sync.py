"""The synchronous wrapper, libdsec.sync, against the live server."""

import asyncio
import concurrent.futures
import io
import multiprocessing
import os
import tempfile
import threading
import time
import unittest

import support
from support import IMAGE

import libdsec
from libdsec import sync


_forked_sandbox = None  # made in the parent, used by the forked workers


def _run_in_child(i):
    sb = _forked_sandbox
    return os.getpid(), sb.run_shell("echo %d" % i).stdout, sb.refresh().state


class SyncTest(unittest.TestCase):
    def setUp(self):
        self.addr, self.key = support.live_settings()
        self.job = support.unique("sync")
        self.client = sync.DSecClient(self.addr, self.key)
        self.addCleanup(self.client.close)
        self.addCleanup(self.cleanup)

    def cleanup(self):
        def stop(sb):
            try:
                sb.stop()
            except sync.NotFoundError:
                pass

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(stop, self.client.list_sandboxes({"job": self.job})))

    def test_listing(self):
        args = sync.DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=64, cpu_cores_limit=1,
                                         ttl_running_stop=300, network_rules={}, init_user="root",
                                         labels={"job": self.job})
        sandbox = self.client.run_container(args, timeout=120)
        self.assertIsInstance(sandbox, sync.Sandbox)
        result = sandbox.run_shell("echo hello world")
        self.assertEqual((result.stdout, result.exit_code), ("hello world\n", 0))
        sandbox.stop()
        self.assertEqual(sandbox.state, "deleted")
        with self.assertRaises(sync.NotFoundError):
            self.client.get(sandbox.id)
        # Network rules are accepted; the policy is the sandbox's.
        args = sync.DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=64, network_rules={"pypi": True},
                                         labels={"job": self.job})
        with self.client.run_container(args, timeout=120) as sb:
            self.assertEqual(sb.network().policy["rules"][0]["service"], "pypi")

    def test_everything_through_the_wrapper(self):
        self.assertTrue(self.client.open().whoami().admin)
        with self.client.create(IMAGE, labels={"job": self.job}, memory="64M") as sb:
            self.assertEqual(self.client.get(sb.id).id, sb.id)
            self.assertIn(sb.id, [s.id for s in self.client.list_sandboxes({"job": self.job})])
            sb.write_file("/f.txt", "data", make_parents=True)
            self.assertEqual(sb.read_file("/f.txt"), b"data")
            out = io.BytesIO()
            sb.download("/f.txt", out)
            self.assertEqual(out.getvalue(), b"data")
            self.assertEqual(sb.list_dir("/").truncated, False)
            self.assertEqual(sb.stat("/f.txt").size, 4)

            with sb.start("echo a; sleep 0.5; echo b", timeout=10) as proc:
                t0 = time.monotonic()
                seen = []
                for chunk in proc:
                    seen.append((chunk.text, time.monotonic() - t0))
                self.assertEqual([t for t, _ in seen], ["a\n", "b\n"])
                self.assertLess(seen[0][1], 0.4)
                self.assertEqual(proc.exit.exit_code, 0)

            exec_id = sb.exec_detached(["sh", "-c", "echo bg"])
            self.assertEqual(sb.attach(exec_id).wait().stdout, "bg\n")
            self.assertIn(exec_id, [e.exec_id for e in sb.list_execs()])
            self.assertEqual(sb.stats().memory_limit, 64 << 20)
            sb.update_labels({"x": "1"})
            self.assertEqual(sb.labels["x"], "1")

            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, "a"), "w") as f:
                    f.write("A")
                sb.upload_dir(tmp, "/up", make_parents=True)
                sb.download_dir("/up", os.path.join(tmp, "back"))
                with open(os.path.join(tmp, "back", "a")) as f:
                    self.assertEqual(f.read(), "A")

            results = self.client.batch_create(sync.DSecContainerRunArgs(container_image=IMAGE, memory_limit_mb=32,
                                                                         labels={"job": self.job}), 2)
            self.assertTrue(all(isinstance(r.sandbox, sync.Sandbox) for r in results))
        with self.assertRaises(sync.NotFoundError):
            self.client.get(sb.id)

    def test_watch(self):
        sb = self.client.create(IMAGE, labels={"job": self.job}, memory="32M")
        with self.client.watch({"job": self.job}, initial=True) as w:
            for ev in w:
                self.assertEqual((ev.type, ev.sandbox.id), ("created", sb.id))
                self.assertIsInstance(ev.sandbox, sync.Sandbox)
                break

    def test_threads_share_a_client(self):
        sb = self.client.create(IMAGE, labels={"job": self.job}, memory="32M")
        out = {}

        def run(i):
            out[i] = sb.run_shell("echo %d" % i).stdout

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(out, {i: "%d\n" % i for i in range(4)})

    @unittest.skipUnless("fork" in multiprocessing.get_all_start_methods(), "no fork() here")
    def test_fork_pool_of_reward_workers(self):
        # What an RL reward function does: a fork pool whose workers call
        # through the client (and a sandbox) the parent made before forking.
        global _forked_sandbox
        sb = self.client.create(IMAGE, labels={"job": self.job}, memory="32M")
        self.assertEqual(sb.run_shell("echo parent").stdout, "parent\n")
        _forked_sandbox = sb
        pool = multiprocessing.get_context("fork").Pool(4)
        try:
            try:
                results = pool.map_async(_run_in_child, range(8)).get(120)
            except multiprocessing.TimeoutError:
                self.fail("a forked worker hung in a call through the parent's client")
        finally:
            pool.terminate()
            pool.join()
        self.assertEqual(sorted(out for _, out, _ in results), sorted("%d\n" % i for i in range(8)))
        self.assertTrue(all(pid != os.getpid() and state == "running" for pid, _, state in results), results)
        # The parent's client and sandbox keep working.
        self.assertEqual(sb.run_shell("echo again").stdout, "again\n")
        self.assertIn(sb.id, [s.id for s in self.client.list_sandboxes({"job": self.job})])

    def test_inside_a_running_loop(self):
        # What a notebook does: sync calls while an event loop runs in the
        # calling thread.
        async def main():
            return self.client.whoami()

        self.assertTrue(asyncio.run(main()).admin)

    def test_errors_and_close(self):
        bad = sync.DSecClient(support.closed_port_addr(), "k", max_retries=0)
        with self.assertRaises(libdsec.UnavailableError) as cm:
            bad.open()
        self.assertIn("dsec up -d", str(cm.exception))
        bad.close()
        bad.close()  # idempotent
        c = sync.DSecClient(self.addr, self.key)
        c.close()
        with self.assertRaises(sync.FailedPreconditionError):
            c.whoami()


if __name__ == "__main__":
    unittest.main()

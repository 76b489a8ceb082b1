"""The clients after fork(): a child (multiprocessing with the fork start
method, a ProcessPoolExecutor of reward workers) gets its own event loop
thread and connections; the parent's keep working. Against a scripted fake
server, so that it runs without a dsec."""

import asyncio
import multiprocessing
import os
import signal
import sys
import threading
import unittest

import support
from support import FakeServer, Reply, end_stream, envelope, unary_ok

import libdsec
from libdsec import sync

SANDBOX = {"id": "node-abc", "image": "busybox:latest", "state": "STATE_RUNNING"}

# A hang fails the test instead of CI: no call here takes a second.
TIMEOUT = 30

_client = None  # the parent's client, inherited by the forked workers


def _whoami_and_get(i):
    c = _client
    out = []
    for _ in range(3):
        out.append(c.whoami().admin)
        out.append(c.get("node-abc").id)
        out.append(c.sandbox("node-abc").refresh().id)
    return os.getpid(), out


def _async_in_child(i):
    async def main():
        out = []
        for _ in range(3):
            out.append((await _client.get("node-abc")).id)
        return out

    return os.getpid(), asyncio.run(main())


def handle(path, headers, body):
    if path.endswith("/Watch"):
        # A keepalive now, the end after a while.
        return Reply(content_type="application/connect+json", chunks=[(0, envelope({})), (1.5, end_stream())])
    if path.endswith("/WhoAmI"):
        return unary_ok({"key": {"id": "k1", "admin": True}})
    return unary_ok({"sandbox": SANDBOX})


@unittest.skipUnless("fork" in multiprocessing.get_all_start_methods(), "no fork() here")
class ForkTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer(handle)
        self.addCleanup(self.srv.close)

    def pool_map(self, fn, n=8):
        global _client
        ctx = multiprocessing.get_context("fork")
        pool = ctx.Pool(4)
        try:
            res = pool.map_async(fn, range(n))
            try:
                return res.get(TIMEOUT)
            except multiprocessing.TimeoutError:
                self.fail("a forked worker hung in a call through the parent's client")
        finally:
            pool.terminate()
            pool.join()

    def test_sync_client_in_a_fork_pool(self):
        global _client
        c = sync.DSecClient(self.srv.addr, "test-key", max_retries=0, timeout=10)
        self.addCleanup(c.close)
        _client = c
        # The parent has a running loop thread and pooled connections (and a
        # thread in the middle of calls) when it forks.
        self.assertTrue(c.whoami().admin)
        sb = c.get("node-abc")
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                c.whoami()

        t = threading.Thread(target=busy, daemon=True)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(stop.set)

        results = self.pool_map(_whoami_and_get)
        for pid, out in results:
            self.assertNotEqual(pid, os.getpid())
            self.assertEqual(out, [True, "node-abc", "node-abc"] * 3)
        # The parent's client, and an object it returned before the fork.
        self.assertTrue(c.whoami().admin)
        self.assertEqual(sb.refresh().id, "node-abc")
        stop.set()
        t.join(TIMEOUT)
        self.assertFalse(t.is_alive())

    def test_sync_client_made_but_unused_before_the_fork(self):
        global _client
        c = sync.DSecClient(self.srv.addr, "test-key", max_retries=0, timeout=10)
        self.addCleanup(c.close)
        _client = c
        for _, out in self.pool_map(_whoami_and_get):
            self.assertEqual(out, [True, "node-abc", "node-abc"] * 3)
        self.assertTrue(c.whoami().admin)

    def test_async_client_in_a_forked_child(self):
        global _client
        c = libdsec.DSecClient(self.srv.addr, "test-key", max_retries=0, timeout=10)
        _client = c

        async def warm():
            # Idle pooled connections in the parent at the fork.
            await asyncio.gather(*(c.get("node-abc") for _ in range(4)))

        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        loop.run_until_complete(warm())
        made = c.transport_stats["connections"]
        before = self.srv.connections
        for _, out in self.pool_map(_async_in_child):
            self.assertEqual(out, ["node-abc"] * 3)
        # The children connected on their own: none reused a parent's socket.
        self.assertGreater(self.srv.connections, before)
        self.assertEqual(loop.run_until_complete(c.get("node-abc")).id, "node-abc")
        self.assertEqual(c.transport_stats["connections"], made, "the parent lost its pooled connections")
        loop.run_until_complete(c.close())

    def test_the_child_keeps_the_parents_sockets_intact(self):
        # A child that closes the client it inherited must not close or
        # unregister the parent's connections (they share the sockets and
        # the loop's epoll instance).
        c = sync.DSecClient(self.srv.addr, "test-key", max_retries=0, timeout=10)
        self.addCleanup(c.close)
        self.assertTrue(c.whoami().admin)
        made = c.transport_stats["connections"]
        pid = os.fork()
        if pid == 0:
            code = 1
            signal.alarm(TIMEOUT)  # a hang kills the child
            try:
                code = 0 if c.whoami().admin else 2
                c.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8, 0)
        for _ in range(3):
            self.assertTrue(c.whoami().admin)
        self.assertEqual(c.transport_stats["connections"], made, "the parent's connection was lost")


    def test_a_stream_open_at_the_fork_stays_the_parents(self):
        c = sync.DSecClient(self.srv.addr, "test-key", max_retries=0, timeout=10)
        self.addCleanup(c.close)
        w = c.watch()
        pid = os.fork()
        if pid == 0:
            code = 1
            signal.alarm(TIMEOUT)
            try:
                try:
                    next(iter(w))
                    code = 2
                except sync.FailedPreconditionError as e:
                    code = 0 if "before fork()" in str(e) else 3
                w.close()
                code = code or (0 if c.whoami().admin else 4)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(status, 0)
        # The parent reads its stream to the end the server gave it.
        with self.assertRaisesRegex(sync.UnavailableError, "ended the watch stream"):
            next(iter(w))
        self.assertTrue(c.whoami().admin)


if __name__ == "__main__":
    unittest.main()

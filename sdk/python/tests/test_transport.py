"""The protocol and connection behaviour against a scripted fake server:
retries and backoff, deadlines, keep-alive reuse, the concurrency limit,
incremental streams with keepalives, and errors that say what to do."""

import asyncio
import gzip
import json
import time
import unittest

import support
from support import FakeServer, Reply, end_stream, envelope, unary_error, unary_ok

import libdsec

SANDBOX = {"id": "node-abc", "image": "busybox:latest", "state": "STATE_RUNNING",
           "resources": {"memoryBytes": "67108864", "cpus": 1}, "idleTtl": "900s",
           "createdAt": "2026-01-02T03:04:05.123456789Z"}


class FakeTestCase(unittest.IsolatedAsyncioTestCase):
    def serve(self, handle):
        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        return srv

    def client(self, srv, **kwargs):
        c = libdsec.DSecClient(srv.addr, "test-key", **kwargs)
        self.addAsyncCleanup(c.close)
        return c


class RetryTest(FakeTestCase):
    async def test_resource_exhausted_waits_the_hint(self):
        calls = []

        def handle(path, headers, body):
            calls.append(time.monotonic())
            if len(calls) < 3:
                return unary_error(429, "resource_exhausted", "node full", retry_after=0.2)
            return unary_ok({"sandbox": SANDBOX})

        srv = self.serve(handle)
        sb = await self.client(srv).get("node-abc")
        self.assertEqual(sb.id, "node-abc")
        self.assertEqual(sb.resources.memory, 64 << 20)
        self.assertEqual(sb.idle_ttl, 900.0)
        self.assertEqual(sb.created_at.microsecond, 123456)
        self.assertEqual(len(calls), 3)
        for a, b in zip(calls, calls[1:]):
            self.assertGreaterEqual(b - a, 0.19, "retried before the server's hint")
        self.assertLess(calls[-1] - calls[0], 2.0)

    async def test_create_is_retried_after_refusals(self):
        n = []

        def handle(path, headers, body):
            n.append(json.loads(body))
            if len(n) == 1:
                return unary_error(429, "resource_exhausted", "full", retry_after=0.05)
            return unary_ok({"sandbox": SANDBOX})

        srv = self.serve(handle)
        args = libdsec.DSecContainerRunArgs(container_image="busybox", memory_limit_mb=64, network_rules={})
        sb = await self.client(srv).run_container(args, timeout=10)
        self.assertEqual(sb.state, "running")
        self.assertEqual(len(n), 2)
        self.assertEqual(n[0], n[1])
        self.assertEqual(srv.paths(), ["/dsec.sandbox.v1.SandboxService/Create"] * 2)

    async def test_unavailable_retried_only_when_safe(self):
        count = {"n": 0}

        def handle(path, headers, body):
            count["n"] += 1
            return unary_error(503, "unavailable", "edge restarting")

        srv = self.serve(handle)
        c = self.client(srv, max_retries=2)
        with self.assertRaises(libdsec.UnavailableError):
            await c.list_sandboxes()  # safe: tried 1 + 2 times
        self.assertEqual(count["n"], 3)
        count["n"] = 0
        with self.assertRaises(libdsec.UnavailableError):
            await c.delete("node-abc")  # not idempotent: tried once
        self.assertEqual(count["n"], 1)
        count["n"] = 0
        with self.assertRaises(libdsec.UnavailableError):
            await c.create("busybox")  # no idempotency key: a create may have happened
        self.assertEqual(count["n"], 1)
        count["n"] = 0
        with self.assertRaises(libdsec.UnavailableError):
            await c.create("busybox", idempotency_key="k1")  # keyed: safe
        self.assertEqual(count["n"], 3)

    async def test_other_kinds_not_retried(self):
        count = {"n": 0}

        def handle(path, headers, body):
            count["n"] += 1
            return unary_error(404, "not_found", "sandbox node-x not found")

        srv = self.serve(handle)
        with self.assertRaises(libdsec.NotFoundError) as cm:
            await self.client(srv).get("node-x")
        self.assertEqual(str(cm.exception), "sandbox node-x not found")
        self.assertEqual(count["n"], 1)

    async def test_retries_stop_at_the_deadline(self):
        def handle(path, headers, body):
            return unary_error(429, "resource_exhausted", "full", retry_after=5)

        srv = self.serve(handle)
        t0 = time.monotonic()
        with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
            await self.client(srv).create("busybox", timeout=1)
        self.assertLess(time.monotonic() - t0, 1.0, "waited for a retry past the deadline")
        self.assertEqual(cm.exception.retry_after, 5.0)
        self.assertEqual(len(srv.requests), 1)

    async def test_create_retries_log_and_stop_at_the_deadline(self):
        def handle(path, headers, body):
            return unary_error(429, "resource_exhausted", "no node has room for 64 MiB", retry_after=0.15)

        srv = self.serve(handle)
        c = self.client(srv, max_retries=100)
        t0 = time.monotonic()
        with self.assertLogs("libdsec", level="DEBUG") as logs:
            with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
                await c.create("busybox", timeout=0.8)
        self.assertLess(time.monotonic() - t0, 0.8, "waited for a retry past the deadline")
        self.assertIn("no node has room for 64 MiB", str(cm.exception))
        n = len(srv.requests)
        self.assertTrue(3 <= n <= 6, "%d creates within 0.8s of 0.15s hints" % n)
        self.assertEqual(len(logs.records), n - 1, "want one debug line per retry: %s" % logs.output)
        for i, r in enumerate(logs.records):
            self.assertEqual(r.levelname, "DEBUG")
            msg = r.getMessage()
            self.assertIn("create refused", msg)
            self.assertIn("retry %d of 100" % (i + 1), msg)
            self.assertIn("no node has room for 64 MiB", msg)

    async def test_invalid_argument_never_retried(self):
        def handle(path, headers, body):
            return unary_error(400, "invalid_argument", "memory 1 TiB is more than the largest node's 24 GiB")

        srv = self.serve(handle)
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client(srv).create("busybox", memory="1T")
        self.assertEqual(len(srv.requests), 1)

    async def test_max_retries_zero(self):
        def handle(path, headers, body):
            return unary_error(429, "resource_exhausted", "full", retry_after=0.01)

        srv = self.serve(handle)
        with self.assertRaises(libdsec.ResourceExhaustedError):
            await self.client(srv, max_retries=0).get("x")
        self.assertEqual(len(srv.requests), 1)


class ProtocolTest(FakeTestCase):
    async def test_request_form(self):
        srv = self.serve(lambda p, h, b: unary_ok({"sandbox": SANDBOX}))
        c = self.client(srv, user_agent="trainer/1")
        await c.get("node-abc", timeout=7)
        path, headers, body = srv.requests[0]
        self.assertEqual(path, "/dsec.sandbox.v1.SandboxService/Get")
        self.assertEqual(headers["Content-Type"], "application/json")
        self.assertEqual(headers["Authorization"], "Bearer test-key")
        self.assertEqual(headers["Connect-Protocol-Version"], "1")
        self.assertTrue(headers["User-Agent"].startswith("trainer/1 libdsec-python/"))
        self.assertTrue(5000 <= int(headers["Connect-Timeout-Ms"]) <= 7000)
        self.assertEqual(json.loads(body), {"id": "node-abc"})

    async def test_keep_alive_reuses_one_connection(self):
        srv = self.serve(lambda p, h, b: unary_ok({"sandbox": SANDBOX}))
        c = self.client(srv)
        for _ in range(5):
            await c.get("node-abc")
        self.assertEqual(srv.connections, 1)
        self.assertEqual(c.transport_stats["connections"], 1)

    async def test_connection_closed_by_server_is_replaced(self):
        srv = self.serve(lambda p, h, b: Reply(200, json.dumps({"sandbox": SANDBOX}).encode(), close=True))
        c = self.client(srv)
        for _ in range(3):
            await c.get("node-abc")
        self.assertEqual(srv.connections, 3)

    async def test_concurrency_limit(self):
        def handle(path, headers, body):
            time.sleep(0.05)
            return unary_ok({"sandbox": SANDBOX})

        srv = self.serve(handle)
        c = self.client(srv, max_concurrency=2)
        await asyncio.gather(*[c.get("node-abc") for _ in range(10)])
        self.assertEqual(len(srv.requests), 10)
        self.assertEqual(srv.max_in_flight, 2)
        self.assertLessEqual(c.transport_stats["connections"], 2)

    async def test_deadline(self):
        def handle(path, headers, body):
            time.sleep(1.5)
            return unary_ok({"sandbox": SANDBOX})

        srv = self.serve(handle)
        t0 = time.monotonic()
        with self.assertRaises(libdsec.DeadlineExceededError) as cm:
            await self.client(srv).get("node-abc", timeout=0.3)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertIn("timeout", str(cm.exception))
        self.assertIsInstance(cm.exception, TimeoutError)

    async def test_no_server(self):
        c = libdsec.DSecClient(support.closed_port_addr(), "k", max_retries=0)
        self.addAsyncCleanup(c.close)
        with self.assertRaises(libdsec.UnavailableError) as cm:
            await c.open()
        self.assertIn("no dsec server at %s: start it with `dsec up -d`" % c.addr, str(cm.exception))

    async def test_not_a_dsec_server(self):
        srv = self.serve(lambda p, h, b: Reply(404, b"404 page not found", content_type="text/plain"))
        with self.assertRaises(libdsec.InternalError) as cm:
            await self.client(srv).get("x")
        self.assertIn("check DSEC_ADDR", str(cm.exception))

    async def test_closed_client(self):
        srv = self.serve(lambda p, h, b: unary_ok({}))
        c = self.client(srv)
        await c.close()
        with self.assertRaises(libdsec.FailedPreconditionError):
            await c.get("x")

    async def test_gzip_unary_answer(self):
        body = gzip.compress(json.dumps({"sandbox": SANDBOX}).encode())
        srv = self.serve(lambda p, h, b: Reply(200, body, headers={"Content-Encoding": "gzip"}))
        self.assertEqual((await self.client(srv).get("node-abc")).id, "node-abc")


class StreamTest(FakeTestCase):
    def exec_reply(self, delays):
        started = envelope({"started": {"execId": "x1"}})
        chunks = [(0, started)]
        for i, d in enumerate(delays):
            chunks.append((d, envelope({"keepalive": {}})))
            chunks.append((0, envelope({"output": {"stream": "STREAM_STDOUT", "offset": str(i * 5),
                                                   "data": libdsec._wire.b64(b"line%d" % i)}})))
        chunks.append((0, envelope({"output": {"stream": "STREAM_STDERR", "data": libdsec._wire.b64(b"err")}})))
        chunks.append((0, envelope({"exit": {"exitCode": 3, "duration": "1.5s", "stdoutTruncated": True}})))
        chunks.append((0, end_stream()))
        return Reply(200, content_type="application/connect+json", chunks=chunks)

    async def test_output_arrives_before_the_end(self):
        srv = self.serve(lambda p, h, b: self.exec_reply([0, 0.6]))
        c = self.client(srv)
        proc = await c.sandbox("node-abc").start(["sh", "-c", "x"], env={"A": "1"}, timeout=5, output_limit=10)
        self.assertEqual(proc.exec_id, "x1")
        t0 = time.monotonic()
        first = await proc.read()
        self.assertEqual(first, libdsec.OutputChunk("stdout", b"line0", 0))
        self.assertLess(time.monotonic() - t0, 0.4, "the first output waited for later ones")
        res = await proc.wait()
        self.assertEqual(res.stdout, "line1")
        self.assertEqual(res.stderr, "err")
        self.assertEqual((res.exit_code, res.duration, res.stdout_truncated), (3, 1.5, True))
        self.assertEqual(proc.stdout_offset, 10)
        path, headers, body = srv.requests[0]
        self.assertEqual(headers["Content-Type"], "application/connect+json")
        self.assertEqual(body[0], 0)
        msg = json.loads(body[5:])
        self.assertEqual(msg, {"sandboxId": "node-abc", "argv": ["sh", "-c", "x"], "env": {"A": "1"},
                               "timeout": "5s", "outputLimit": "10"})
        # The stream was read to its end: its connection is reused.
        await c.sandbox("node-abc").exec("true")
        self.assertEqual(srv.connections, 1)

    async def test_end_stream_error(self):
        chunks = [(0, end_stream({"code": "not_found", "message": "exec x9 not found"}))]
        srv = self.serve(lambda p, h, b: Reply(200, content_type="application/connect+json", chunks=chunks))
        proc = await self.client(srv).sandbox("node-abc").attach("x9")
        with self.assertRaises(libdsec.NotFoundError) as cm:
            await proc.wait()
        self.assertIn("exec x9 not found", str(cm.exception))
        self.assertEqual(cm.exception.exec_id, "x9")

    async def test_stream_cut_before_exit(self):
        chunks = [(0, envelope({"started": {"execId": "x2"}})),
                  (0, envelope({"output": {"stream": "STREAM_STDOUT", "data": libdsec._wire.b64(b"abc")}})),
                  (0, end_stream())]
        srv = self.serve(lambda p, h, b: Reply(200, content_type="application/connect+json", chunks=chunks))
        proc = await self.client(srv).sandbox("node-abc").start("sleep 100")
        with self.assertRaises(libdsec.UnavailableError) as cm:
            await proc.wait()
        self.assertEqual(cm.exception.exec_id, "x2")
        self.assertIn("stdout_offset=3", str(cm.exception))

    async def test_idle_stream_is_dead(self):
        chunks = [(0, envelope({"started": {"execId": "x3"}}))]

        def handle(path, headers, body):
            return Reply(200, content_type="application/connect+json",
                         chunks=chunks + [(1.5, envelope({"keepalive": {}})), (0, end_stream())])

        srv = self.serve(handle)
        c = self.client(srv, stream_idle_timeout=0.3)
        proc = await c.sandbox("node-abc").start("sleep 100")
        with self.assertRaises(libdsec.UnavailableError) as cm:
            await proc.wait()
        self.assertIn("probably dead", str(cm.exception))
        self.assertEqual(cm.exception.exec_id, "x3")

    async def test_cancelled_stream_leaves_the_client_usable(self):
        def handle(path, headers, body):
            if path.endswith("/Get"):
                return unary_ok({"sandbox": SANDBOX})
            return Reply(200, content_type="application/connect+json",
                         chunks=[(0, envelope({"started": {"execId": "x4"}})), (1.0, end_stream())])

        srv = self.serve(handle)
        c = self.client(srv, max_concurrency=1)
        proc = await c.sandbox("node-abc").start("sleep 100")
        with self.assertRaises(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.2)
        # The stream's place and connection were given back: the next call
        # neither waits for the limit nor reuses the broken connection.
        sb = await asyncio.wait_for(c.get("node-abc"), 5)
        self.assertEqual(sb.id, "node-abc")
        self.assertEqual(c.transport_stats["connections"], 2)
        with self.assertRaises(libdsec.FailedPreconditionError) as cm:
            await proc.wait()
        self.assertEqual(cm.exception.exec_id, "x4")

    async def test_compressed_envelope(self):
        data = gzip.compress(json.dumps({"event": {"type": "EVENT_TYPE_CREATED", "sandbox": SANDBOX}}).encode())
        import struct

        env = struct.pack(">BI", 1, len(data)) + data
        chunks = [(0, envelope({"keepalive": {}})), (0, env), (0, end_stream())]
        srv = self.serve(lambda p, h, b: Reply(200, content_type="application/connect+json", chunks=chunks,
                                               headers={"Connect-Content-Encoding": "gzip"}))
        w = await self.client(srv).watch({"job": "a"}, initial=True)
        ev = await w.__anext__()
        self.assertEqual((ev.type, ev.sandbox.id), ("created", "node-abc"))
        with self.assertRaises(libdsec.UnavailableError):
            await w.__anext__()  # the server ended the watch
        self.assertEqual(json.loads(srv.requests[0][2][5:]), {"selector": {"job": "a"}, "initial": True})

    async def test_failing_upload_source_breaks_the_body(self):
        # The server must see an error, never the clean end of a partial
        # upload: the client sends a malformed chunk and no final one.
        srv = self.serve(lambda p, h, b: Reply(200, content_type="application/connect+json",
                                               chunks=[(0, envelope({"info": {}})), (0, end_stream())]))

        class Boom(Exception):
            pass

        async def failing():
            yield b"partial"
            await asyncio.sleep(0.1)
            raise Boom()

        c = self.client(srv)
        with self.assertRaises(Boom):
            await c.sandbox("node-abc").upload("/f", failing())
        for _ in range(100):
            if srv.broken_bodies:
                break
            await asyncio.sleep(0.02)
        self.assertEqual(len(srv.broken_bodies), 1)
        self.assertEqual(srv.requests, [], "the server saw a complete request")
        self.assertIn(b'"data"', srv.broken_bodies[0])
        # The client goes on working.
        await c.sandbox("node-abc").write_file("/f", b"whole")
        self.assertEqual(len(srv.requests), 1)

    async def test_client_stream_early_error(self):
        # The server refuses the upload after its header; the client stops
        # sending and reports the server's error.
        def handle(path, headers, body):
            return Reply(200, content_type="application/connect+json",
                         chunks=[(0, end_stream({"code": "not_found", "message": "no sandbox node-zzz"}))])

        srv = self.serve(handle)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client(srv).sandbox("node-zzz").write_file("/a", b"x" * 3000000)
        path, headers, body = srv.requests[0]
        self.assertEqual(path, "/dsec.sandbox.v1.SandboxService/WriteFile")
        first = json.loads(body[5:5 + int.from_bytes(body[1:5], "big")])
        self.assertEqual(first, {"header": {"sandboxId": "node-zzz", "path": "/a"}})


if __name__ == "__main__":
    unittest.main()

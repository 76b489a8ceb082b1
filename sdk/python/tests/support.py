"""Shared by the tests: the libdsec under test, the live server's settings,
and a scriptable fake Connect server for what a real one cannot be made to
do on demand (refuse, fail, stall).

Live tests read:
  DSEC_ADDR, DSEC_API_KEY    the `dsec up` to test against (the key may also
                             come from DSEC_STATE_DIR's admin.key)
  DSEC_TEST_IMAGE            an image with a busybox userland (default busybox)
  DSEC_TEST_REQUIRE_SERVER=1 fail, not skip, when no server answers (also
                             when CI=true)
"""

import asyncio
import http.server
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
# Test the source tree next to the tests.
sys.path.insert(0, os.path.dirname(HERE))

import libdsec  # noqa: E402
from libdsec import _wire  # noqa: E402

IMAGE = os.environ.get("DSEC_TEST_IMAGE", "busybox")

# The test cases run their loops in debug mode, whose slow-callback notes
# (base64 of large uploads) are noise here.
logging.getLogger("asyncio").setLevel(logging.ERROR)


def required() -> bool:
    return os.environ.get("DSEC_TEST_REQUIRE_SERVER") == "1" or os.environ.get("CI") == "true"


_live_checked = None


def live_settings():
    """Return (addr, key) of the live server, skipping the test when there is
    none (failing when one is required)."""
    global _live_checked
    if _live_checked is None:
        _live_checked = _check_live()
    ok, why, cfg = _live_checked
    if not ok:
        if required():
            raise AssertionError("no dsec server for the live tests: %s" % why)
        raise unittest.SkipTest("no dsec server (set DSEC_ADDR and DSEC_API_KEY): %s" % why)
    return cfg


def _check_live():
    try:
        cfg = libdsec.load_config()
    except libdsec.DSecError as e:
        return False, str(e), None
    if not os.environ.get("DSEC_ADDR") and not required():
        return False, "DSEC_ADDR is not set", None

    # The synchronous client runs its own loop, so this works from inside a
    # test's event loop too.
    from libdsec.sync import DSecClient

    try:
        with DSecClient(cfg.addr, cfg.api_key, max_retries=0) as c:
            c.get_image(IMAGE)
    except libdsec.DSecError as e:
        return False, str(e), None
    return True, "", (cfg.addr, cfg.api_key)


def unique(prefix: str = "py") -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


class LiveTestCase(unittest.IsolatedAsyncioTestCase):
    """A test against the live server, with a client per test and cleanup of
    the sandboxes it labels with self.job."""

    async def asyncSetUp(self):
        self.addr, self.key = live_settings()
        self.client = libdsec.DSecClient(self.addr, self.key)
        self.job = unique("job")

    async def asyncTearDown(self):
        try:
            # One by one in parallel: quicker than by selector, which the
            # server works through in turn.
            left = await self.client.list_sandboxes({"job": self.job})
            await asyncio.gather(*[_delete(sb) for sb in left])
        finally:
            await self.client.close()

    async def new_sandbox(self, **kwargs):
        labels = dict(kwargs.pop("labels", {}))
        labels.setdefault("job", self.job)
        return await self.client.create(IMAGE, labels=labels, memory=kwargs.pop("memory", "64M"), **kwargs)


class SharedSandboxTestCase(LiveTestCase):
    """A live test whose tests share one sandbox (self.sb), made once for
    the class with create_args."""

    create_args = {}

    @classmethod
    def setUpClass(cls):
        from libdsec.sync import DSecClient

        addr, key = live_settings()
        cls._sync = DSecClient(addr, key)
        cls._shared = cls._sync.create(IMAGE, memory="64M", labels={"job": unique("shared")}, **cls.create_args)

    @classmethod
    def tearDownClass(cls):
        try:
            cls._shared.stop()
        finally:
            cls._sync.close()

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.sb = await self.client.sandbox(self._shared.id).refresh()



async def _delete(sb):
    try:
        await sb.stop()
    except libdsec.NotFoundError:
        pass


# --- a fake Connect server ----------------------------------------------------


def envelope(msg, flags=0):
    payload = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def end_stream(error=None):
    return envelope({"error": error} if error else {}, flags=2)


class Reply:
    """What the fake server answers: a status, headers and body parts sent
    as chunks (each after its delay), or one body with a Content-Length."""

    def __init__(self, status=200, body=b"", *, content_type="application/json", chunks=None, headers=None,
                 close=False):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.chunks = chunks  # list of (delay seconds, bytes)
        self.headers = headers or {}
        self.close = close


def unary_ok(msg):
    return Reply(200, json.dumps(msg).encode())


def unary_error(status, code, message, retry_after=None):
    err = {"code": code, "message": message}
    if retry_after is not None:
        # google.rpc.RetryInfo{retry_delay: Duration{seconds, nanos}} by hand.
        secs, nanos = int(retry_after), int(round((retry_after % 1) * 1e9))
        dur = b""
        if secs:
            dur += b"\x08" + _varint(secs)
        if nanos:
            dur += b"\x10" + _varint(nanos)
        info = b"\x0a" + _varint(len(dur)) + dur
        err["details"] = [{"type": "google.rpc.RetryInfo", "value": _wire.b64(info).rstrip("=")}]
    return Reply(status, json.dumps(err).encode())


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class FakeServer:
    """An HTTP/1.1 server whose answers a test scripts with handle(path,
    headers, body) -> Reply. It counts connections and the calls in
    flight."""

    def __init__(self, handle):
        self.handle = handle
        self.requests = []
        self.broken_bodies = []
        self.connections = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._mu = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with fake._mu:
                    fake.connections += 1

            def log_message(self, *args):
                pass

            def do_POST(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    while True:
                        line = self.rfile.readline()
                        try:
                            size = int(line.split(b";")[0], 16)
                        except ValueError:
                            # A broken body (what a client sends when its
                            # upload's source fails): no answer.
                            with fake._mu:
                                fake.broken_bodies.append(body)
                            self.close_connection = True
                            return
                        if size == 0:
                            self.rfile.readline()
                            break
                        body += self.rfile.read(size)
                        self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with fake._mu:
                    fake.requests.append((self.path, dict(self.headers), body))
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    reply = fake.handle(self.path, self.headers, body)
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    if reply.close:
                        self.send_header("Connection", "close")
                        self.close_connection = True
                    if reply.chunks is None:
                        self.send_header("Content-Length", str(len(reply.body)))
                        self.end_headers()
                        self.wfile.write(reply.body)
                        self.wfile.flush()
                        return
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    for delay, data in reply.chunks:
                        if delay:
                            time.sleep(delay)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    with fake._mu:
                        fake.in_flight -= 1

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = "http://127.0.0.1:%d" % self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def paths(self):
        return [p for p, _, _ in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port_addr():
    """An address where nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port

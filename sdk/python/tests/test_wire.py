"""Wire forms, error mapping and argument checks, without a server."""

import datetime
import gzip
import unittest

import support  # noqa: F401  (puts the source tree on sys.path)

import libdsec
from libdsec import _wire, errors
from libdsec.client import create_request, parse_size, selector_of


class DurationTest(unittest.TestCase):
    def test_encode(self):
        cases = [(0, "0s"), (1, "1s"), (1.5, "1.5s"), (900, "900s"), (0.000000001, "0.000000001s"),
                 (-2.25, "-2.25s"), (3600.1, "3600.1s")]
        for secs, want in cases:
            self.assertEqual(_wire.duration(secs), want, "duration(%r)" % secs)

    def test_decode(self):
        for text, want in [("900s", 900.0), ("1.029078399s", 1.029078399), ("", 0.0), (None, 0.0), ("-1s", -1.0)]:
            self.assertAlmostEqual(_wire.parse_duration(text), want)
        with self.assertRaises(errors.InternalError):
            _wire.parse_duration("5m")

    def test_seconds_of(self):
        self.assertEqual(_wire.seconds_of(datetime.timedelta(minutes=2), "ttl"), 120.0)
        self.assertEqual(_wire.seconds_of(3, "ttl"), 3.0)
        self.assertIsNone(_wire.seconds_of(None, "ttl"))
        with self.assertRaises(libdsec.InvalidArgumentError):
            _wire.seconds_of("3", "ttl")


class TimestampTest(unittest.TestCase):
    def test_parse(self):
        utc = datetime.timezone.utc
        cases = [
            ("2026-11-30T01:28:46.009421962Z", datetime.datetime(2026, 11, 30, 1, 28, 46, 9421, tzinfo=utc)),
            ("2026-11-30T01:28:46Z", datetime.datetime(2026, 11, 30, 1, 28, 46, tzinfo=utc)),
            ("2026-11-30T01:28:46.5+02:00",
             datetime.datetime(2026, 11, 30, 1, 28, 46, 500000,
                               tzinfo=datetime.timezone(datetime.timedelta(hours=2)))),
        ]
        for text, want in cases:
            self.assertEqual(_wire.parse_timestamp(text), want, text)
        self.assertIsNone(_wire.parse_timestamp(""))
        with self.assertRaises(errors.InternalError):
            _wire.parse_timestamp("yesterday")


class BytesTest(unittest.TestCase):
    def test_base64_forms(self):
        data = bytes(range(256))
        std = _wire.b64(data)
        self.assertEqual(_wire.unb64(std), data)
        self.assertEqual(_wire.unb64(std.rstrip("=")), data)
        self.assertEqual(_wire.unb64(std.replace("+", "-").replace("/", "_")), data)
        self.assertEqual(_wire.unb64(""), b"")

    def test_envelope(self):
        env = _wire.envelope(b'{"a":1}', flags=2)
        self.assertEqual(env[:5], b"\x02\x00\x00\x00\x07")
        self.assertEqual(_wire.parse_envelope_header(env[:5]), (2, 7))
        with self.assertRaises(errors.InternalError):
            _wire.parse_envelope_header(b"\x00\xff\xff\xff\xff")

    def test_gzip(self):
        self.assertEqual(_wire.decompress(gzip.compress(b"hello"), "gzip"), b"hello")
        with self.assertRaises(errors.InternalError):
            _wire.decompress(b"x", "br")


class ErrorMappingTest(unittest.TestCase):
    def test_every_code(self):
        cases = {
            "invalid_argument": libdsec.InvalidArgumentError, "not_found": libdsec.NotFoundError,
            "already_exists": libdsec.AlreadyExistsError, "failed_precondition": libdsec.FailedPreconditionError,
            "aborted": libdsec.FailedPreconditionError, "resource_exhausted": libdsec.ResourceExhaustedError,
            "deadline_exceeded": libdsec.DeadlineExceededError, "unauthenticated": libdsec.UnauthenticatedError,
            "permission_denied": libdsec.PermissionDeniedError, "unavailable": libdsec.UnavailableError,
            "internal": libdsec.InternalError, "unknown": libdsec.InternalError, "data_loss": libdsec.InternalError,
            "unimplemented": libdsec.InternalError, "out_of_range": libdsec.InvalidArgumentError,
            "something_new": libdsec.InternalError,
        }
        for code, cls in cases.items():
            e = _wire.error_from_json({"code": code, "message": "boom"})
            self.assertIs(type(e), cls, code)
            self.assertIsInstance(e, libdsec.DSecError)
            self.assertIn("boom", str(e))
        self.assertIn("(unimplemented)", str(_wire.error_from_json({"code": "unimplemented", "message": "x"})))
        self.assertNotIn("(not_found)", str(_wire.error_from_json({"code": "not_found", "message": "x"})))

    def test_python_bases(self):
        self.assertIsInstance(libdsec.DeadlineExceededError("x"), TimeoutError)
        self.assertIsInstance(libdsec.UnavailableError("x"), ConnectionError)
        self.assertIsInstance(libdsec.InvalidArgumentError("x"), ValueError)

    def test_retry_info(self):
        # What connect-go sends for a 5s hint (from a real server).
        err = _wire.error_from_json({"code": "resource_exhausted", "message": "full", "details": [
            {"type": "google.rpc.RetryInfo", "value": "CgIIBQ", "debug": {"retryDelay": "5s"}}]})
        self.assertIsInstance(err, libdsec.ResourceExhaustedError)
        self.assertEqual(err.retry_after, 5.0)
        self.assertEqual(str(err), "full (retry after 5s)")
        # Seconds and nanos, no debug.
        self.assertAlmostEqual(_wire.decode_retry_info(b"\x0a\x08\x08\x01\x10\x80\xca\xb5\xee\x01"), 1.5)
        # Only the debug form.
        err = _wire.error_from_json({"code": "resource_exhausted", "details": [
            {"type": "google.rpc.RetryInfo", "debug": {"retryDelay": "0.25s"}}]})
        self.assertEqual(err.retry_after, 0.25)
        # Garbage is no hint.
        err = _wire.error_from_json({"code": "resource_exhausted", "details": [
            {"type": "google.rpc.RetryInfo", "value": "!!!"}, {"type": "other", "value": "CgIIBQ"}]})
        self.assertIsNone(err.retry_after)

    def test_http_statuses(self):
        e = _wire.error_from_http(404, "Not Found", b"404 page not found", "text/plain")
        self.assertIsInstance(e, libdsec.InternalError)
        self.assertIn("check DSEC_ADDR", str(e))
        e = _wire.error_from_http(503, "Service Unavailable", b"", "text/html")
        self.assertIsInstance(e, libdsec.UnavailableError)
        e = _wire.error_from_http(401, "Unauthorized", b'{"code":"unauthenticated","message":"bad key"}',
                                  "application/json")
        self.assertIsInstance(e, libdsec.UnauthenticatedError)
        self.assertEqual(str(e), "bad key")


class ArgumentsTest(unittest.TestCase):
    def test_parse_size(self):
        for text, want in [("512M", 512 << 20), ("2G", 2 << 30), ("1.5g", 3 << 29), ("100", 100), ("100B", 100),
                           ("4KiB", 4096), ("1Ti", 1 << 40), (1234, 1234)]:
            self.assertEqual(parse_size(text), want, text)
        for bad in ["", "-1", "1.5", "12X", "M", "1..5G", True]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(bad)):
                parse_size(bad)

    def test_selector(self):
        self.assertEqual(selector_of({"a": "1"}), {"a": "1"})
        self.assertEqual(selector_of("a=1"), {"a": "1"})
        self.assertEqual(selector_of(["a=1", "b=x=y"]), {"a": "1", "b": "x=y"})
        self.assertEqual(selector_of(None), {})
        with self.assertRaises(libdsec.InvalidArgumentError):
            selector_of(["nokey"])

    def test_create_request(self):
        req = libdsec.DSecContainerRunArgs(
            container_image="busybox", memory_limit_mb=4096, cpu_cores_limit=4, ttl_running_stop=300,
            network_rules={"npm": False}, init_user="root", env={"A": "1"}, cwd="/tmp", labels={"job": "x"},
            ttl_idle_stop=60, disk_limit_mb=1024, pids_limit=100, idempotency_key="k")._request()
        self.assertEqual(req, {
            "image": "busybox",
            "resources": {"memoryBytes": str(4096 << 20), "cpus": 4.0, "pids": "100", "diskBytes": str(1 << 30)},
            "labels": {"job": "x"}, "env": {"A": "1"}, "workdir": "/tmp", "user": "root", "ttl": "300s",
            "idleTtl": "60s", "idempotencyKey": "k", "network": {"text": "deny=npm"}})
        self.assertEqual(create_request("busybox"), {"image": "busybox", "resources": {}})
        for bad in [dict(image=""), dict(image="x", ttl=-1), dict(image="x", labels={"a": 1}),
                    dict(image="x", memory="lots")]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(bad)):
                create_request(**bad)

    def test_exit_status_code(self):
        self.assertEqual(libdsec.ExitStatus(exit_code=3).code, 3)
        self.assertEqual(libdsec.ExitStatus(signal=9).code, 137)
        self.assertEqual(libdsec.ExitStatus(timed_out=True, signal=9).code, 124)
        self.assertTrue(libdsec.ExitStatus().ok)
        # A timed-out exec on the wire: timed out, signal 9, no exit code.
        st = libdsec.ExitStatus._from_json("ex-1", {"signal": 9, "timedOut": True, "duration": "1s"})
        self.assertEqual((st.timed_out, st.signal, st.exit_code, st.code, st.ok), (True, 9, 0, 124, False))
        # The idle expiry the API reports (Go SDK: Sandbox.IdleExpiresAt).
        sb = libdsec.Sandbox._from_json(None, {"id": "n-a", "idleTtl": "900s", "idleExpiresAt": "2026-01-02T03:04:05Z"})
        self.assertEqual((sb.idle_ttl, sb.idle_expires_at.isoformat()), (900.0, "2026-01-02T03:04:05+00:00"))
        self.assertIsNone(libdsec.Sandbox._from_json(None, {"id": "n-a"}).idle_expires_at)
        r = libdsec.ExecResult(exit_code=1, stderr_bytes=b"bad \xff thing\n")
        self.assertEqual(r.stderr, "bad \ufffd thing\n")
        with self.assertRaises(libdsec.FailedPreconditionError) as cm:
            r.check()
        self.assertIn("bad", str(cm.exception))


if __name__ == "__main__":
    unittest.main()

"""Pause and resume against a scripted fake server, async and sync: the
wire form of sandbox.pause()/resume(), client.pause(labels=...) and
client.resume(labels=...), create's paused_ttl= and idle_action=,
set_timeout's, the paused fields and events, and errors through the one
table of codes. The same against a real dsec up is pause_live.py."""

import json
import unittest

import support  # noqa: F401  (the libdsec under test)
from support import FakeServer, unary_error, unary_ok

import libdsec
from libdsec import sync
from libdsec.client import create_request

PAUSED = {"id": "node-abc", "image": "busybox:latest", "state": "STATE_PAUSED", "resources": {},
          "idleAction": "pause", "pausedTtl": "86400s", "pausedAt": "2026-01-02T03:04:05Z",
          "pausedExpiresAt": "2026-01-03T03:04:05Z", "expiresAt": "2026-01-02T04:04:05Z"}


class WireTest(unittest.TestCase):
    def test_create_request(self):
        req = create_request("busybox", paused_ttl=3600, idle_action="pause")
        self.assertEqual((req["pausedTtl"], req["idleAction"]), ("3600s", "pause"))
        req = libdsec.DSecContainerRunArgs(container_image="busybox", paused_ttl=7200, idle_action="delete")._request()
        self.assertEqual((req["pausedTtl"], req["idleAction"]), ("7200s", "delete"))
        req = libdsec.DSecContainerRunArgs(container_image="busybox")._request()
        self.assertNotIn("pausedTtl", req)
        self.assertNotIn("idleAction", req)
        for bad in ["Pause", "sleep", 3]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(bad)):
                create_request("busybox", idle_action=bad)
        with self.assertRaises(libdsec.InvalidArgumentError):
            create_request("busybox", paused_ttl=-1)

    def test_paused_fields(self):
        sb = libdsec.Sandbox._from_json(None, PAUSED)
        self.assertEqual(sb.state, "paused")
        self.assertEqual((sb.idle_action, sb.paused_ttl), ("pause", 86400.0))
        self.assertEqual((sb.paused_at.day, sb.paused_expires_at.day), (2, 3))
        sb = libdsec.Sandbox._from_json(None, {"id": "x", "state": "STATE_RUNNING"})
        self.assertEqual((sb.idle_action, sb.paused_at, sb.paused_expires_at), ("delete", None, None))
        self.assertEqual(libdsec.Stats._from_json({"swappedBytes": "123"}).swapped, 123)


class FakePauseTest(unittest.IsolatedAsyncioTestCase):
    def serve(self):
        self.calls = []

        def result(sid, state):
            return {"id": sid, "state": state, "residentBytes": "8388608", "swappedBytes": "58720256", "took": "0.250s"}

        def handle(path, headers, body):
            msg = json.loads(body)
            if path.endswith("/WhoAmI"):
                return unary_ok({"key": {"id": "k1", "admin": True}})
            self.calls.append((path.rsplit("/", 1)[1], msg))
            if path.endswith("/Create"):
                return unary_ok({"sandbox": dict(PAUSED, state="STATE_RUNNING", pausedAt=None)})
            if path.endswith("/SetTimeout"):
                return unary_ok({"sandbox": PAUSED})
            state = "STATE_PAUSED" if path.endswith("/Pause") else "STATE_RUNNING"
            if msg.get("selector"):
                return unary_ok({"results": [
                    result("node-a", state),
                    {"id": "node-b", "error": {"code": "resource_exhausted", "message": "no room to resume it",
                                               "retryAfter": "5s"}},
                    {"id": "node-c", "error": {"code": "failed_precondition", "message": "sandbox node-c is exited"}}]})
            if msg.get("id") == "node-full":
                return unary_error(429, "resource_exhausted", "sandbox node-full is paused and node n has no room",
                                   retry_after=5)
            if msg.get("id") == "node-gone":
                return unary_error(404, "not_found", "sandbox node-gone not found")
            return unary_ok({"results": [result(msg["id"], state)]})

        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        return srv

    async def test_pause_resume(self):
        srv = self.serve()
        async with libdsec.DSecClient(srv.addr, "test-key") as client:
            sb = await client.create("busybox", paused_ttl=7200, idle_action="pause")
            self.assertEqual(self.calls[-1][1]["pausedTtl"], "7200s")
            self.assertEqual(self.calls[-1][1]["idleAction"], "pause")
            res = await sb.pause()
            self.assertEqual(self.calls[-1], ("Pause", {"id": "node-abc"}))
            self.assertEqual((res.id, res.state, res.resident_bytes, res.swapped_bytes, res.took),
                             ("node-abc", "paused", 8 << 20, 56 << 20, 0.25))
            self.assertEqual(sb.state, "paused")
            res = await sb.resume()
            self.assertEqual(self.calls[-1], ("Resume", {"id": "node-abc"}))
            self.assertEqual((res.state, sb.state), ("running", "running"))

            with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
                await client.sandbox("node-full").resume()
            self.assertEqual(cm.exception.retry_after, 5)
            with self.assertRaises(libdsec.NotFoundError):
                await client.sandbox("node-gone").pause()

            results = await client.pause(labels={"job": "rl"})
            self.assertEqual(self.calls[-1], ("Pause", {"selector": {"job": "rl"}}))
            self.assertEqual([r.id for r in results], ["node-a", "node-b", "node-c"])
            self.assertEqual((results[0].state, results[0].error), ("paused", None))
            self.assertIsInstance(results[1].error, libdsec.ResourceExhaustedError)
            self.assertEqual(results[1].error.retry_after, 5)
            self.assertIsInstance(results[2].error, libdsec.FailedPreconditionError)
            results = await client.resume(labels="job=rl")
            self.assertEqual(self.calls[-1], ("Resume", {"selector": {"job": "rl"}}))
            self.assertEqual(results[0].state, "running")
            n = len(self.calls)
            for sel in [None, {}, []]:
                with self.assertRaises(libdsec.InvalidArgumentError):
                    await client.pause(labels=sel)
                with self.assertRaises(libdsec.InvalidArgumentError):
                    await client.resume(sel)
            self.assertEqual(len(self.calls), n)

            await sb.set_timeout(paused_ttl=3600, idle_action="pause")
            self.assertEqual(self.calls[-1], ("SetTimeout", {"id": "node-abc", "pausedTtl": "3600s",
                                                            "idleAction": "pause"}))
            self.assertEqual(sb.state, "paused")
            self.assertEqual(sb.paused_expires_at.day, 3)
            for kwargs in [{}, {"paused_ttl": 0}, {"idle_action": "stop"}, {"paused_ttl": -5}]:
                with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(kwargs)):
                    await sb.set_timeout(**kwargs)

    def test_sync(self):
        srv = self.serve()
        with sync.DSecClient(srv.addr, "test-key") as client:
            sb = client.create("busybox", idle_action="pause")
            self.assertEqual(sb.pause().state, "paused")
            self.assertEqual(sb.state, "paused")
            self.assertEqual(sb.resume().state, "running")
            self.assertEqual([r.id for r in client.pause(labels={"job": "rl"})], ["node-a", "node-b", "node-c"])
            self.assertEqual(client.resume(labels=["job=rl"])[0].state, "running")
            with self.assertRaises(libdsec.ResourceExhaustedError):
                client.sandbox("node-full").resume()


class EventsTest(unittest.TestCase):
    def test_event_names(self):
        from libdsec.client import _EVENTS
        from libdsec import _wire
        self.assertEqual(_wire.enum_name("EVENT_TYPE_PAUSED", "EVENT_TYPE_", _EVENTS), "paused")
        self.assertEqual(_wire.enum_name("EVENT_TYPE_RESUMED", "EVENT_TYPE_", _EVENTS), "resumed")
        self.assertEqual(_wire.enum_name(8, "EVENT_TYPE_", _EVENTS), "paused")


if __name__ == "__main__":
    unittest.main()

"""Rollouts and exec step keys: against a real `dsec up` (see support.py),
and the step helper's broken-stream paths against the scripted fake."""

import json
import os
import unittest
import uuid

import support
from support import IMAGE, FakeServer, Reply, end_stream, envelope, unary_ok

import libdsec
from libdsec import DSecClient, Step, member, sync
from libdsec import _wire


def spec(job):
    return {"labels": {"job": job}, "ttl": 600,
            "members": [member("worker", IMAGE, role="worker", memory="64M", env={"MODE": "w"}),
                        member("agent", IMAGE, memory="64M")]}


class RolloutLiveTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.addr, self.key = support.live_settings()
        self.client = DSecClient(self.addr, self.key)
        await self.client.open()
        self.addAsyncCleanup(self.client.close)
        self.job = "py-" + uuid.uuid4().hex[:8]

    async def test_create_reconnect_status_delete(self):
        ro = await self.client.create_rollout(spec(self.job), idempotency_key=self.job)
        self.addAsyncCleanup(self._delete, ro.id)
        self.assertEqual([(m.name, m.role, m.state) for m in ro.members],
                         [("worker", "worker", "running"), ("agent", "sandbox", "running")])
        self.assertEqual(ro.labels, {"job": self.job})
        again = await self.client.create_rollout(spec(self.job), idempotency_key=self.job)
        self.assertEqual(again.id, ro.id)

        worker = ro.worker()
        r = await worker.run_shell("echo $MODE $DSEC_ROLLOUT $DSEC_ROLLOUT_MEMBER")
        self.assertEqual(r.stdout, "w %s worker\n" % ro.id)
        got = await ro.member("agent").refresh()
        self.assertEqual(got.labels.get(libdsec.rollout.ROLLOUT_LABEL), ro.id)

        await ro.set_status({"step.1": "done", "progress": "1/2"})
        self.assertEqual(ro.status, {"step.1": "done", "progress": "1/2"})
        with self.assertRaises(libdsec.InvalidArgumentError):
            await ro.set_status({"bad key": "x"})

        # A new process (a restarted trainer) reconnects by ID.
        async with DSecClient(self.addr, self.key) as other:
            back = await other.rollout(ro.id)
            self.assertEqual(back.status, {"step.1": "done", "progress": "1/2"})
            self.assertEqual([m.sandbox_id for m in back.members], [m.sandbox_id for m in ro.members])
            await back.set_status(remove=["progress"])
        self.assertEqual((await ro.refresh()).status, {"step.1": "done"})
        listed = await self.client.list_rollouts({"job": self.job})
        self.assertEqual([x.id for x in listed], [ro.id])
        with self.assertRaises(libdsec.FailedPreconditionError):
            await self.client.delete(ro.members[1].sandbox_id)

        await ro.delete()
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.rollout(ro.id)
        self.assertEqual(await self.client.list_sandboxes({"job": self.job}), [])

    async def test_all_or_none(self):
        bad = spec(self.job)
        bad["members"].append(member("helper", "no-such-image"))
        with self.assertRaises(libdsec.NotFoundError) as cm:
            await self.client.create_rollout(bad)
        self.assertIn("helper", str(cm.exception))
        self.assertEqual(await self.client.list_sandboxes({"job": self.job}), [])

    async def test_steps_fast_forward(self):
        sb = await self.client.create(IMAGE, memory="64M", ttl=600)
        self.addAsyncCleanup(sb.stop)

        def step(i, cmd):
            return Step(key="step-%d" % i, command=cmd)

        def effect(i):
            return "echo %d >> /tmp/effects; echo out%d" % (i, i)

        plan = [step(1, effect(1)), step(2, effect(2) + "; exit 3"), step(3, "sleep 1; " + effect(3)),
                step(4, effect(4))]
        first = await sb.run_steps(plan[:2])
        self.assertEqual([(r.source, r.exit_code) for r in first], [("ran", 0), ("ran", 3)])
        await sb.exec_detached(plan[2].command, step_key=plan[2].key)
        rs = await sb.run_steps(plan)
        self.assertEqual([r.source for r in rs], ["recorded", "recorded", "attached", "ran"])
        self.assertEqual([r.stdout for r in rs], ["out1\n", "out2\n", "out3\n", "out4\n"])
        self.assertEqual(rs[1].exit_code, 3)
        self.assertEqual((await sb.run_shell("cat /tmp/effects")).stdout, "1\n2\n3\n4\n")
        with self.assertRaises(libdsec.AlreadyExistsError) as cm:
            await sb.exec("true", step_key="step-1")
        self.assertIn(rs[0].exec_id, str(cm.exception))
        infos = await sb.list_execs(step_keys=["step-2", "step-4"])
        self.assertEqual([(i.step_key, i.exit.exit_code) for i in infos], [("step-2", 3), ("step-4", 0)])
        r = await sb.run_step("step-4", effect(4))
        self.assertEqual((r.source, r.stdout), ("recorded", "out4\n"))

    async def _delete(self, id):
        try:
            await self.client.delete_rollout(id)
        except libdsec.NotFoundError:
            pass


class RolloutSyncLiveTest(unittest.TestCase):
    def test_sync(self):
        addr, key = support.live_settings()
        job = "pysync-" + uuid.uuid4().hex[:8]
        with sync.DSecClient(addr, key) as c:
            ro = c.create_rollout(spec(job))
            try:
                self.assertIsInstance(ro, sync.Rollout)
                agent = ro.member("agent")
                self.assertIsInstance(agent, sync.Sandbox)
                r = agent.run_step("s1", "echo once >> /tmp/e; cat /tmp/e")
                self.assertEqual((r.source, r.stdout), ("ran", "once\n"))
                r = agent.run_step("s1", "echo once >> /tmp/e; cat /tmp/e")
                self.assertEqual((r.source, r.stdout), ("recorded", "once\n"))
                ro.set_status({"done": "1"})
                self.assertEqual(c.rollout(ro.id).status, {"done": "1"})
            finally:
                ro.delete()


def started(exec_id):
    return envelope({"started": {"execId": exec_id}})


class StepsFakeTest(unittest.IsolatedAsyncioTestCase):
    """What the step helper does when streams break, on a scripted server:
    it never starts a step twice."""

    def serve(self, handle):
        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        self.srv = srv
        c = libdsec.DSecClient(srv.addr, "test-key", max_retries=0)
        self.addAsyncCleanup(c.close)
        return c.sandbox("node-abc")

    async def test_stream_broken_after_start_is_followed(self):
        def handle(path, headers, body):
            if path.endswith("/ListExecs"):
                return unary_ok({})
            if path.endswith("/Exec"):
                # Started, then the connection ends without the exit.
                return Reply(200, content_type="application/connect+json", chunks=[(0, started("x1"))])
            if path.endswith("/Attach"):
                return Reply(200, content_type="application/connect+json", chunks=[
                    (0, envelope({"output": {"stream": "STREAM_STDOUT", "data": _wire.b64(b"done\n")}})),
                    (0, envelope({"exit": {"exitCode": 0}})), (0, end_stream())])
            raise AssertionError(path)

        sb = self.serve(handle)
        r = await sb.run_step("k1", "echo done")
        self.assertEqual((r.source, r.stdout, r.exec_id), ("ran", "done\n", "x1"))
        paths = [p.rsplit("/", 1)[1] for p, _, _ in self.srv.requests]
        self.assertEqual(paths.count("Exec"), 1, paths)
        self.assertIn("Attach", paths)
        body = json.loads([b for p, _, b in self.srv.requests if p.endswith("/Exec")][0][5:])
        self.assertEqual(body["stepKey"], "k1")

    async def test_key_taken_is_followed(self):
        def handle(path, headers, body):
            if path.endswith("/ListExecs"):
                keys = json.loads(body).get("stepKeys")
                if handle.listed:
                    return unary_ok({"execs": [{"execId": "x9", "stepKey": "k1", "running": True}]})
                handle.listed = True
                self.assertEqual(keys, ["k1"])
                return unary_ok({})
            if path.endswith("/Exec"):
                return Reply(409, body=json.dumps({"code": "already_exists", "message": "step key taken"}).encode())
            if path.endswith("/Attach"):
                self.assertEqual(json.loads(body[5:])["execId"], "x9")
                return Reply(200, content_type="application/connect+json", chunks=[
                    (0, envelope({"exit": {"exitCode": 4}})), (0, end_stream())])
            raise AssertionError(path)

        handle.listed = False
        sb = self.serve(handle)
        r = await sb.run_step("k1", "echo x")
        self.assertEqual((r.source, r.exit_code), ("attached", 4))


if __name__ == "__main__":
    unittest.main()

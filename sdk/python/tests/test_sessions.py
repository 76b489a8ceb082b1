"""Shell sessions, sealed execs and GradeFrom against the scripted fake
server: what goes on the wire, the result fields, and what is refused
before a call."""

import json
import unittest

from support import FakeServer, Reply, end_stream, envelope, unary_error, unary_ok

import libdsec
from libdsec import _wire, sync


def exec_stream(exit_msg, out=b"", err=b"", exec_id="x1"):
    chunks = [(0, envelope({"started": {"execId": exec_id}}))]
    if out:
        chunks.append((0, envelope({"output": {"stream": "STREAM_STDOUT", "data": _wire.b64(out)}})))
    if err:
        chunks.append((0, envelope({"output": {"stream": "STREAM_STDERR", "data": _wire.b64(err)}})))
    chunks += [(0, envelope({"exit": exit_msg})), (0, end_stream())]
    return Reply(200, content_type="application/connect+json", chunks=chunks)


def stream_body(body):
    """The JSON message of a streaming request's body (one envelope)."""
    return json.loads(body[5:])


class FakeCase(unittest.IsolatedAsyncioTestCase):
    def serve(self, handle):
        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        self.srv = srv
        c = libdsec.DSecClient(srv.addr, "test-key", max_retries=0)
        self.addAsyncCleanup(c.close)
        return c.sandbox("node-abc")


class SessionTest(FakeCase):
    async def test_run_in_a_session(self):
        exits = [{"exitCode": 2, "sessionRestarted": True, "duration": "0.5s"},
                 {"timedOut": True, "sessionLost": True}]

        def handle(path, headers, body):
            return exec_stream(exits.pop(0), out=b"/tmp\n", err=b"warn\n")

        sb = self.serve(handle)
        session = await sb.session("main", shell="/bin/sh")
        self.assertEqual((session.name, session.shell), ("main", "/bin/sh"))
        r = await session.run("cd /tmp && pwd", env={"A": "1"}, timeout=5)
        self.assertEqual((r.exec_id, r.exit_code, r.stdout, r.stderr), ("x1", 2, "/tmp\n", "warn\n"))
        self.assertEqual((r.session_restarted, r.session_lost, r.sealed, r.duration), (True, False, False, 0.5))
        path, _, body = self.srv.requests[0]
        self.assertTrue(path.endswith("/Exec"))
        self.assertEqual(stream_body(body), {"sandboxId": "node-abc", "shell": "cd /tmp && pwd", "session": "main",
                                             "sessionShell": "/bin/sh", "env": {"A": "1"}, "timeout": "5s"})
        r = await (await sb.session("main")).run("sleep 100")
        self.assertTrue(r.session_lost and r.timed_out)
        self.assertEqual(r.code, 124)
        # A session without a shell sends none.
        self.assertNotIn("sessionShell", stream_body(self.srv.requests[1][2]))

    async def test_refused_before_the_call(self):
        sb = self.serve(lambda p, h, b: unary_ok({}))
        for name in ["", "a" * 65, "a/b", "a b", "..\n", None, 3]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(name)):
                await sb.session(name)
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(name)):
                await sb.delete_session(name)
        session = await sb.session("main")
        with self.assertRaises(libdsec.InvalidArgumentError):
            await session.run(["ls", "-l"])
        with self.assertRaises(libdsec.InvalidArgumentError):
            await sb.exec("true", sealed="thaw")
        self.assertEqual(self.srv.requests, [])

    async def test_busy_session_and_unknown_session(self):
        def handle(path, headers, body):
            if path.endswith("/Exec"):
                return Reply(200, content_type="application/connect+json", chunks=[
                    (0, end_stream({"code": "aborted", "message": "session main is running exec x1: wait for it"}))])
            return unary_error(404, "not_found", "session gone of sandbox node-abc does not exist")

        sb = self.serve(handle)
        session = await sb.session("main")
        with self.assertRaises(libdsec.FailedPreconditionError) as cm:
            await session.run("true")
        self.assertIn("wait for it", str(cm.exception))
        with self.assertRaises(libdsec.NotFoundError):
            await (await sb.session("gone")).delete()

    async def test_list_and_delete(self):
        def handle(path, headers, body):
            if path.endswith("/ListSessions"):
                return unary_ok({"sessions": [
                    {"name": "a", "shell": "/bin/bash", "createdAt": "2026-01-02T03:04:05Z", "commands": "3"},
                    {"name": "b", "shell": "/bin/sh", "commands": "1", "runningExecId": "x9"}]})
            return unary_ok({})

        sb = self.serve(handle)
        got = await sb.list_sessions()
        self.assertEqual([(s.name, s.shell, s.commands, s.running_exec_id) for s in got],
                         [("a", "/bin/bash", 3, ""), ("b", "/bin/sh", 1, "x9")])
        self.assertEqual(got[0].created_at.year, 2026)
        self.assertIsInstance(got[0], libdsec.SessionInfo)
        await (await sb.session("a")).delete()
        await sb.delete_session("b")
        self.assertEqual([json.loads(b) for p, _, b in self.srv.requests[1:]],
                         [{"sandboxId": "node-abc", "name": "a"}, {"sandboxId": "node-abc", "name": "b"}])
        self.assertTrue(self.srv.requests[1][0].endswith("/DeleteSession"))

    async def test_journal_fields(self):
        sb = self.serve(lambda p, h, b: unary_ok({"execs": [
            {"execId": "x1", "argv": ["true"], "sealed": True, "exit": {"sealed": True}},
            {"execId": "x2", "argv": ["/bin/bash"], "session": "main", "exit": {"sessionLost": True}}]}))
        execs = await sb.list_execs()
        self.assertEqual([(e.session, e.sealed) for e in execs], [("", True), ("main", False)])
        self.assertTrue(execs[0].exit.sealed and execs[1].exit.session_lost)


class SealedTest(FakeCase):
    async def test_sealed_values(self):
        sb = self.serve(lambda p, h, b: exec_stream({"sealed": True}, out=b"honest\n"))
        for sealed, want in [(True, "SEAL_FREEZE"), ("freeze", "SEAL_FREEZE"), ("kill", "SEAL_KILL"),
                             (False, None), (None, None)]:
            r = await sb.exec(["/.dsec/bin/sh", "-c", "true"], sealed=sealed)
            self.assertTrue(r.sealed)
            self.assertEqual(r.stdout, "honest\n")
            self.assertEqual(stream_body(self.srv.requests[-1][2]).get("sealed"), want, sealed)
        await sb.run_shell("true", sealed="kill")
        self.assertEqual(stream_body(self.srv.requests[-1][2])["sealed"], "SEAL_KILL")
        await sb.exec_detached("true", sealed=True)
        msg = stream_body(self.srv.requests[-1][2])
        self.assertEqual((msg["sealed"], msg["detach"]), ("SEAL_FREEZE", True))


class GradeTest(FakeCase):
    async def test_grade_from(self):
        answers = [unary_ok({"exit": {"exitCode": 1, "duration": "2s"}, "stdout": _wire.b64(b"1 failed\n"),
                             "stderr": _wire.b64(b"trace\n"), "graderSandboxId": "node-grader",
                             "copiedFiles": "12", "copiedBytes": "3456"}),
                   unary_ok({"exit": {}}),
                   unary_error(400, "failed_precondition", "/workspace/dev is a device: only regular files, directories "
                                                           "and links are copied"),
                   unary_ok({})]
        sb = self.serve(lambda p, h, b: answers.pop(0))
        r = await sb.grade_from(["/workspace", "/etc/answer"], ["pytest", "-q"], image="grader:1", env={"CI": "1"},
                                cwd="/workspace", timeout=60, memory=1 << 30, cpus=2, max_copy_bytes=1 << 28,
                                output_limit=1 << 20)
        self.assertIsInstance(r, libdsec.GradeResult)
        self.assertEqual((r.exit_code, r.code, r.ok, r.stdout, r.stderr, r.duration),
                         (1, 1, False, "1 failed\n", "trace\n", 2.0))
        self.assertEqual((r.grader_sandbox_id, r.copied_files, r.copied_bytes), ("node-grader", 12, 3456))
        path, _, body = self.srv.requests[0]
        self.assertTrue(path.endswith("/GradeFrom"))
        self.assertEqual(json.loads(body), {
            "sandboxId": "node-abc", "paths": ["/workspace", "/etc/answer"], "argv": ["pytest", "-q"], "image": "grader:1",
            "env": {"CI": "1"}, "cwd": "/workspace", "timeout": "60s", "outputLimit": str(1 << 20),
            "maxCopyBytes": str(1 << 28), "resources": {"memoryBytes": str(1 << 30), "cpus": 2.0}})
        r = await sb.grade_from(("/workspace",), "cd /workspace && make test")
        self.assertTrue(r.ok)
        self.assertEqual(json.loads(self.srv.requests[1][2]),
                         {"sandboxId": "node-abc", "paths": ["/workspace"], "shell": "cd /workspace && make test"})
        with self.assertRaises(libdsec.FailedPreconditionError) as cm:
            await sb.grade_from(["/workspace"], "true")
        self.assertIn("only regular files", str(cm.exception))
        with self.assertRaises(libdsec.InternalError):
            await sb.grade_from(["/workspace"], "true")
        # A grade is not retried: it would copy and run again.
        self.assertEqual(len(self.srv.requests), 4)

    async def test_refused_before_the_call(self):
        sb = self.serve(lambda p, h, b: unary_ok({}))
        for paths, cmd, kw in [([], "true", {}), ("/workspace", "true", {}), (["work"], "true", {}),
                               (["/p"] * 257, "true", {}), (["/workspace"], "", {}), (["/workspace"], [], {}),
                               (["/workspace"], "true", {"timeout": 0}), (["/workspace"], "true", {"max_copy_bytes": -1})]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr((paths, cmd, kw))):
                await sb.grade_from(paths, cmd, **kw)
        self.assertEqual(self.srv.requests, [])


class SyncSessionTest(unittest.TestCase):
    def test_sync_session(self):
        def handle(path, headers, body):
            if path.endswith("/WhoAmI"):
                return unary_ok({})
            return exec_stream({"exitCode": 0}, out=b"bar\n")

        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        with sync.DSecClient(srv.addr, "test-key") as c:
            session = c.sandbox("node-abc").session("main")
            self.assertIsInstance(session, sync.Session)
            r = session.run("echo $FOO")
            self.assertEqual((r.stdout, r.exit_code), ("bar\n", 0))
        execs = [b for p, _, b in srv.requests if p.endswith("/Exec")]
        self.assertEqual(stream_body(execs[0])["session"], "main")


if __name__ == "__main__":
    unittest.main()

"""Sandboxes: commands, files and lifetimes of one sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import inspect
import os
import re
from typing import (TYPE_CHECKING, Any, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence, Union)

from . import _tar, _wire, errors
from ._transport import NoRetry, ServerStream, Transport
from .network import Network, NetworkInfo, network_request, policy_of, results_of
from .pack import Pack
from .types import (DirListing, ExecInfo, ExecResult, ExitStatus, FileInfo, GradeResult, OutputChunk, PauseResult,
                    Resources, SessionInfo, Stats, Step, StepResult, TarStats)

if TYPE_CHECKING:
    from .client import DSecClient

__all__ = ["Sandbox", "Process", "Session"]

_SVC = "dsec.sandbox.v1.SandboxService/"
_CHUNK = 1 << 20

_STATES = {1: "creating", 2: "running", 3: "paused", 4: "exited", 5: "failed", 6: "deleted"}

# What a sandbox's idle TTL does when it runs out.
IDLE_ACTIONS = ("delete", "pause")


def check_idle_action(action: Optional[str]) -> Optional[str]:
    """Return an idle action ("delete" or "pause"), refusing others; None
    and "" leave it unset."""
    if action is None or action == "":
        return None
    if action not in IDLE_ACTIONS:
        raise errors.InvalidArgumentError("idle_action %.40r: use \"delete\" (the default) or \"pause\"" % (action,))
    return action


async def pause_call(t: Transport, method: str, msg: Dict[str, Any], timeout: Optional[float]) -> Dict[str, Any]:
    """Call Pause or Resume: retried when the server is unavailable (both
    are idempotent), never after ResourceExhausted, which (as in the Go
    SDK) is the caller's to wait out with its retry_after: a resume the
    node has no room for leaves the sandbox paused."""

    async def once(remaining: Optional[float]) -> Dict[str, Any]:
        try:
            return await t.unary(_SVC + method, msg, timeout=remaining, safe=False)
        except errors.ResourceExhaustedError as e:
            raise NoRetry(e) from None

    return await t.call(once, timeout=timeout, safe=True, what=method.lower())


def pause_results_of(resp: Mapping[str, Any]) -> List[PauseResult]:
    """The results of a Pause or Resume answer, errors mapped by the one
    table of codes."""
    out = []
    for r in resp.get("results") or []:
        res = PauseResult(id=r.get("id", ""), resident_bytes=_wire.to_int(r.get("residentBytes")),
                          swapped_bytes=_wire.to_int(r.get("swappedBytes")))
        if r.get("error"):
            e = r["error"]
            ra = _wire.parse_duration(e.get("retryAfter")) or None
            res.error = errors.error_from_code(e.get("code", ""), e.get("message", ""), ra)
        else:
            res.state = _wire.enum_name(r.get("state"), "STATE_", _STATES)
            res.took = _wire.parse_duration(r.get("took"))
        out.append(res)
    return out

Command = Union[str, Sequence[str]]
# How a command runs sealed: False/None (not), True or "freeze" (the
# sandbox's other processes frozen while it runs), "kill" (killed).
Sealed = Union[bool, str, None]

_SESSION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# The longest step key, in bytes; how often a step whose stream broke is
# followed (or looked up) again.
_MAX_STEP_KEY = 256
_STEP_TRIES = 8


def _step_key(key: Optional[str]) -> Optional[str]:
    if key is None or key == "":
        return None
    if not isinstance(key, str):
        raise errors.InvalidArgumentError("step_key must be a string, not %s" % type(key).__name__)
    if len(key.encode("utf-8")) > _MAX_STEP_KEY:
        raise errors.InvalidArgumentError("step key of %d bytes: at most %d" % (len(key.encode("utf-8")),
                                                                                  _MAX_STEP_KEY))
    return key


def _step_of(s: Any) -> Step:
    if isinstance(s, Step):
        return s
    if isinstance(s, Mapping):
        opts = {k: v for k, v in s.items() if k not in ("key", "command", "exec_id")}
        return Step(key=s.get("key", ""), command=s.get("command", ""), exec_id=s.get("exec_id", ""), options=opts)
    if isinstance(s, (tuple, list)) and len(s) == 2:
        return Step(key=s[0], command=s[1])
    raise errors.InvalidArgumentError("a step is a Step, a mapping {key, command, ...} or a (key, command) pair, "
                                      "not %r" % (s,))


def _step_result(res: ExecResult, key: str, source: str) -> StepResult:
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(ExecResult)}
    return StepResult(**fields, step_key=key, source=source)


def _backoff(attempt: int) -> float:
    return min(5.0, 0.25 * (2 ** (attempt - 1)))


def _seal(sealed: Sealed) -> Optional[str]:
    if sealed is None or sealed is False:
        return None
    if sealed is True or sealed == "freeze":
        return "SEAL_FREEZE"
    if sealed == "kill":
        return "SEAL_KILL"
    raise errors.InvalidArgumentError("sealed=%r: use True (or \"freeze\") to freeze the sandbox's other processes "
                                      "while the command runs, or \"kill\" to kill them" % (sealed,))


def _check_session_name(name: Any) -> str:
    if not isinstance(name, str) or not _SESSION_NAME.fullmatch(name):
        raise errors.InvalidArgumentError("session name %.80r: use 1 to 64 of A-Z, a-z, 0-9, _, . and - "
                                          "(example: \"main\")" % (name,))
    return name
Data = Union[bytes, bytearray, memoryview, str]
# What uploads read: bytes, a binary file object (read(n), sync or async),
# or an iterable or async iterable of bytes.
Source = Any



def _set_command(msg: Dict[str, Any], command: Union[str, Sequence[str]], what: str,
                 shell_example: str, argv_example: str) -> None:
    """Sets msg's shell (a string) or argv (a list) from command, refusing an
    empty one with an example of each."""
    if isinstance(command, str):
        if not command:
            raise errors.InvalidArgumentError("%s: empty shell command (example: %s)" % (what, shell_example))
        msg["shell"] = command
        return
    argv = _wire.string_list(command, "the command")
    if not argv:
        raise errors.InvalidArgumentError("%s: empty command (example: %s)" % (what, argv_example))
    msg["argv"] = argv

class Sandbox:
    """A sandbox as the server last described it, and a handle to act on it.

    Get one from :meth:`DSecClient.run_container`, ``create``, ``get``,
    ``list_sandboxes`` or ``sandbox(id)``. ``async with sandbox:`` stops
    (deletes) it on exit.

    Attributes:
        id: its ID (also its hostname).
        image: the image it runs (NAME:TAG).
        labels: its labels.
        state: "creating", "running", "paused", "exited", "failed",
            "deleted" or "unknown".
        reason: why it failed or exited.
        resources: its limits (:class:`Resources`).
        node, backend, project: where and how it runs, and whose it is.
        created_at: when it was created.
        expires_at: when its hard TTL ends it (while it is paused: were it
            resumed now; paused time does not count).
        idle_ttl: seconds without use after which it is deleted (or paused,
            with idle_action "pause").
        idle_expires_at: when its idle TTL ends it unless something uses it
            first; None while a stream is open, while it is paused, or
            without an idle TTL.
        idle_action: what its idle TTL does: "delete" or "pause".
        paused_ttl: seconds it may stay paused before it is deleted.
        paused_at, paused_expires_at: while it is paused, when it was paused
            and when its paused TTL deletes it; None otherwise.
        user, workdir, env: the defaults of its commands.
        network_policy: its network policy document ({"mode": "none"}
            without network); network() adds its addresses and counters.
    """

    def __init__(self, client: "DSecClient", id: str) -> None:
        self._client = client
        self.id = id
        self.image = ""
        self.labels: Dict[str, str] = {}
        self.state = "unknown"
        self.reason = ""
        self.resources = Resources()
        self.node = ""
        self.backend = ""
        self.project = ""
        self.created_at: Optional[datetime.datetime] = None
        self.expires_at: Optional[datetime.datetime] = None
        self.idle_ttl = 0.0
        self.idle_expires_at: Optional[datetime.datetime] = None
        self.idle_action = "delete"
        self.paused_ttl = 0.0
        self.paused_at: Optional[datetime.datetime] = None
        self.paused_expires_at: Optional[datetime.datetime] = None
        self.user = ""
        self.workdir = ""
        self.env: Dict[str, str] = {}
        self.network_policy: Dict[str, Any] = {"mode": "none"}

    @classmethod
    def _from_json(cls, client: "DSecClient", m: Mapping[str, Any]) -> "Sandbox":
        sb = cls(client, m.get("id", ""))
        sb._update(m)
        return sb

    def _update(self, m: Optional[Mapping[str, Any]]) -> None:
        if not m:
            return
        self.id = m.get("id", self.id)
        self.image = m.get("image", "")
        self.labels = dict(m.get("labels") or {})
        self.state = _wire.enum_name(m.get("state"), "STATE_", _STATES)
        self.reason = m.get("reason", "")
        self.resources = Resources._from_json(m.get("resources"))
        self.node = m.get("node", "")
        self.backend = m.get("backend", "")
        self.project = m.get("project", "")
        self.created_at = _wire.parse_timestamp(m.get("createdAt"))
        self.expires_at = _wire.parse_timestamp(m.get("expiresAt"))
        self.idle_ttl = _wire.parse_duration(m.get("idleTtl"))
        self.idle_expires_at = _wire.parse_timestamp(m.get("idleExpiresAt"))
        self.idle_action = m.get("idleAction") or "delete"
        self.paused_ttl = _wire.parse_duration(m.get("pausedTtl"))
        self.paused_at = _wire.parse_timestamp(m.get("pausedAt"))
        self.paused_expires_at = _wire.parse_timestamp(m.get("pausedExpiresAt"))
        self.user = m.get("user", "")
        self.workdir = m.get("workdir", "")
        self.env = dict(m.get("env") or {})
        self.network_policy = policy_of(m.get("network"))

    def __repr__(self) -> str:
        return "Sandbox(id=%r, image=%r, state=%r)" % (self.id, self.image, self.state)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.stop()
        except errors.NotFoundError:
            pass

    @property
    def _t(self) -> Transport:
        return self._client._transport()

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self._client._call_timeout(timeout)

    # --- lifecycle --------------------------------------------------------

    async def stop(self, *, timeout: Optional[float] = None) -> None:
        """Stop and delete the sandbox (deleting is stopping); its state
        becomes "deleted". A sandbox already gone raises NotFoundError."""
        await self._client.delete(self.id, timeout=timeout)
        self.state = "deleted"

    async def delete(self, *, timeout: Optional[float] = None) -> None:
        """The same as :meth:`stop`."""
        await self.stop(timeout=timeout)

    async def refresh(self, *, timeout: Optional[float] = None) -> "Sandbox":
        """Reread the sandbox from the server into this object; return it."""
        resp = await self._t.unary(_SVC + "Get", {"id": self.id}, timeout=self._timeout(timeout), safe=True)
        self._update(resp.get("sandbox"))
        return self

    async def set_timeout(self, ttl: Optional[_wire.Seconds] = None, idle_ttl: Optional[_wire.Seconds] = None, *,
                          paused_ttl: Optional[_wire.Seconds] = None, idle_action: Optional[str] = None,
                          timeout: Optional[float] = None) -> None:
        """Change the lifetimes of the live sandbox: ttl is a new hard TTL
        counted from now (for a paused sandbox, from its resume: paused time
        does not count), idle_ttl a new idle TTL, paused_ttl a new paused TTL
        (counted from the pause for a paused sandbox), all seconds or
        timedelta; idle_action "delete" or "pause" is what the idle TTL
        does. None keeps one as it is; a paused sandbox stays paused. The
        sandbox's fields are updated from the answer."""
        t = _wire.seconds_of(ttl, "ttl")
        it = _wire.seconds_of(idle_ttl, "idle_ttl")
        pt = _wire.seconds_of(paused_ttl, "paused_ttl")
        action = check_idle_action(idle_action)
        if any(v is not None and v <= 0 for v in (t, it, pt)):
            raise errors.InvalidArgumentError("set timeout of sandbox %s: TTLs must be positive (got ttl %s, idle "
                                              "TTL %s, paused TTL %s)" % (self.id, t, it, pt))
        if t is None and it is None and pt is None and action is None:
            raise errors.InvalidArgumentError("set timeout of sandbox %s: give a ttl, an idle_ttl, a paused_ttl or "
                                              "an idle_action" % self.id)
        msg: Dict[str, Any] = {"id": self.id}
        if t is not None:
            msg["ttl"] = _wire.duration(t)
        if it is not None:
            msg["idleTtl"] = _wire.duration(it)
        if pt is not None:
            msg["pausedTtl"] = _wire.duration(pt)
        if action is not None:
            msg["idleAction"] = action
        resp = await self._t.unary(_SVC + "SetTimeout", msg, timeout=self._timeout(timeout), safe=True)
        self._update(resp.get("sandbox"))

    async def pause(self, *, timeout: Optional[float] = None) -> PauseResult:
        """Pause the sandbox: its processes stop and its node pushes its
        memory out of RAM (to swap, where the node has it); files, processes
        and state stay. Paused time counts against neither its hard nor its
        idle TTL; its paused TTL (default 24 h) deletes it if it stays paused
        longer. Any later command, file operation, attach, session command
        or port connection resumes it first. Pausing a paused sandbox
        reports it as it is. ``state`` is updated."""
        resp = await pause_call(self._t, "Pause", {"id": self.id}, self._timeout(timeout))
        return self._pause_result("pause", resp)

    async def resume(self, *, timeout: Optional[float] = None) -> PauseResult:
        """Make the paused sandbox run again; resuming a running sandbox
        reports it as it is. A node that cannot hold its memory again raises
        ResourceExhaustedError (with retry_after) and it stays paused.
        ``state`` is updated."""
        resp = await pause_call(self._t, "Resume", {"id": self.id}, self._timeout(timeout))
        return self._pause_result("resume", resp)

    def _pause_result(self, what: str, resp: Mapping[str, Any]) -> PauseResult:
        for r in pause_results_of(resp):
            if r.id == self.id:
                if r.error is not None:
                    raise r.error
                self.state = r.state
                return r
        raise errors.InternalError("%s: the server did not answer for sandbox %s" % (what, self.id))

    async def update_labels(self, labels: Optional[Mapping[str, str]] = None, remove: Iterable[str] = (), *,
                            timeout: Optional[float] = None) -> None:
        """Set the labels of ``labels`` and remove the keys of ``remove`` (a
        key in both is set). The sandbox's fields are updated."""
        set_ = _wire.string_map(labels, "labels")
        rm = _wire.string_list(remove, "remove")
        if not set_ and not rm:
            raise errors.InvalidArgumentError("update labels of sandbox %s: nothing to set or remove" % self.id)
        resp = await self._t.unary(_SVC + "UpdateLabels", {"id": self.id, "set": set_, "remove": rm},
                                   timeout=self._timeout(timeout), safe=True)
        self._update(resp.get("sandbox"))

    async def update_network(self, network: Network = None, *, network_rules: Optional[Mapping[str, bool]] = None,
                             merge: bool = False, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Replace the sandbox's network policy (or with merge add the rules
        to it) and return the policy now in force. network and
        network_rules are as at create (libdsec.network); None is no
        network. It applies to new connections at once; established ones
        it no longer allows are cut."""
        msg: Dict[str, Any] = {"id": self.id, "policy": network_request(network_rules, network) or {"mode": "none"}}
        if merge:
            msg["merge"] = True
        resp = await self._t.unary(_SVC + "UpdateNetwork", msg, timeout=self._timeout(timeout), safe=not merge)
        for r in results_of(resp):
            if r.id == self.id:
                if r.error is not None:
                    raise r.error
                return r.policy or {"mode": "none"}
        raise errors.InternalError("update network: the server did not answer for sandbox %s" % self.id)

    async def network(self, *, timeout: Optional[float] = None) -> NetworkInfo:
        """Report the sandbox's network: its policy, addresses, counters and
        recent denials (why a connection failed)."""
        resp = await self._t.unary(_SVC + "GetNetwork", {"id": self.id}, timeout=self._timeout(timeout), safe=True)
        return NetworkInfo._from_json(resp)

    async def stats(self, *, timeout: Optional[float] = None) -> Stats:
        """Report the sandbox's resource use and limits."""
        resp = await self._t.unary(_SVC + "Stats", {"id": self.id}, timeout=self._timeout(timeout), safe=True)
        return Stats._from_json(resp)

    async def pack_diff(self, name: str, *, scrub: Iterable[str] = (), force: bool = False,
                        public: Optional[bool] = None, timeout: Optional[float] = 600) -> Pack:
        """Pack the sandbox's changes into a new environment (pack_diff).

        The sandbox's writable layer becomes a new read-only layer, and name
        (NAME[:TAG]) is registered as the sandbox's environment plus that
        layer, with the config of the image the sandbox was made from.
        Sandboxes created from name see the files as this one has them:
        deleted files stay deleted, replaced directories stay replaced,
        owners and modes are kept. ``scrub`` lists absolute paths left out
        of the new layer (the new environment shows them as this sandbox's
        environment had them). The sandbox is frozen while its writable
        layer is read, then runs on.

        The new environment belongs to the key's project and is private
        unless ``public=True``. Onto an existing NAME:TAG only its project
        (or an admin key) may pack (PermissionDeniedError), and other layers
        need ``force=True``.

        Raises FailedPreconditionError while another pack of the sandbox
        runs or when it is being deleted, NotFoundError once it is deleted.
        """
        if not name or not isinstance(name, str):
            raise errors.InvalidArgumentError("pack: no name given for the new environment (example: myenv:1)")
        paths = _wire.string_list([scrub] if isinstance(scrub, str) else scrub, "scrub")
        msg: Dict[str, Any] = {"sandboxId": self.id, "name": name, "scrub": paths, "force": bool(force)}
        if public is not None:
            msg["public"] = bool(public)
        resp = await self._t.unary(_SVC + "PackDiff", msg, timeout=self._timeout(timeout), safe=False)
        return Pack._from_json(resp)

    # --- commands ---------------------------------------------------------

    def _exec_msg(self, command: Command, env: Optional[Mapping[str, str]], cwd: Optional[str],
                  user: Optional[str], stdin: Optional[Data], timeout: Optional[_wire.Seconds], stdin_open: bool,
                  tty: bool, rows: int, cols: int, output_limit: Optional[int], detach: bool,
                  sealed: Sealed = None, session: Optional[str] = None,
                  session_shell: Optional[str] = None, step_key: Optional[str] = None) -> Dict[str, Any]:
        msg: Dict[str, Any] = {"sandboxId": self.id}
        key = _step_key(step_key)
        if key is not None:
            msg["stepKey"] = key
        _set_command(msg, command, "exec", "\"echo hello\"", "[\"ls\", \"-l\"]")
        if env:
            msg["env"] = _wire.string_map(env, "env")
        if cwd:
            msg["cwd"] = cwd
        if user:
            msg["user"] = str(user)
        if stdin is not None:
            msg["stdin"] = _wire.b64(_bytes(stdin))
        t = _wire.seconds_of(timeout, "timeout")
        if t is not None:
            if t <= 0:
                raise errors.InvalidArgumentError("exec: timeout %gs is not positive" % t)
            msg["timeout"] = _wire.duration(t)
        if stdin_open:
            msg["stdinOpen"] = True
        if tty:
            msg["tty"] = True
        if not (0 <= rows <= 65535 and 0 <= cols <= 65535):
            raise errors.InvalidArgumentError("exec: terminal size %dx%d is out of range (0 to 65535 each)"
                                              % (rows, cols))
        if rows:
            msg["rows"] = rows
        if cols:
            msg["cols"] = cols
        if output_limit is not None:
            if output_limit < 0:
                raise errors.InvalidArgumentError("exec: output limit %d is negative" % output_limit)
            msg["outputLimit"] = str(output_limit)
        if detach:
            msg["detach"] = True
        seal = _seal(sealed)
        if seal:
            msg["sealed"] = seal
        if session is not None:
            msg["session"] = _check_session_name(session)
            if "argv" in msg:
                raise errors.InvalidArgumentError("a session runs shell lines, not argv lists: give the command as "
                                                  "one string (example: \"cd /tmp && ls\")")
            if session_shell:
                msg["sessionShell"] = str(session_shell)
        return msg

    async def start(self, command: Command, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    user: Optional[str] = None, stdin: Optional[Data] = None,
                    timeout: Optional[_wire.Seconds] = None, stdin_open: bool = False, tty: bool = False,
                    rows: int = 0, cols: int = 0, output_limit: Optional[int] = None,
                    sealed: Sealed = None, step_key: Optional[str] = None) -> "Process":
        """Start a command and return once it runs, as a :class:`Process`
        whose output is read by iterating it (``async for chunk in proc``)
        and whose end is ``await proc.wait()``.

        Args:
            command: a string runs with ``/bin/sh -c``; a list of strings
                runs directly (argv[0] looked up in PATH).
            env: variables added to the sandbox's environment.
            cwd: working directory (default: the sandbox's).
            user: name, uid or uid:gid in the sandbox (default: the
                sandbox's).
            stdin: bytes (or text) written to the command's standard input,
                which is then closed unless stdin_open.
            timeout: seconds (or timedelta) after which the command's
                process group is killed; its result then says timed_out.
            stdin_open: keep standard input open for ``proc.write_stdin``.
            tty: run on a terminal of rows x cols (default 24x80); output
                then comes as one stream, stdout, and stdin stays open.
            output_limit: cap of each output stream in bytes (default 16
                MiB); past it the command runs on, the rest is dropped and
                the result says so.
            sealed: True (or "freeze") runs the command sealed: every other
                process of the sandbox is frozen while it runs and thawed
                afterwards ("kill" kills them instead); it runs in the
                sandbox's mount and pid view as recorded at create, with the
                platform's read-only tools first on PATH (/.dsec/bin) and the
                image's original layers read-only at /.dsec/image, and
                nothing of the sandbox can ptrace or signal it. The result
                then says ``sealed``. For graders.
            step_key: names this step of your work in the sandbox's journal
                (at most 256 bytes): a command with the step key of an
                earlier command of the sandbox raises AlreadyExistsError
                naming it, so that a restarted client finds the step
                (``list_execs(step_keys=[...])``) instead of running it
                twice. :meth:`run_steps` does that for a list of steps.
        """
        msg = self._exec_msg(command, env, cwd, user, stdin, timeout, stdin_open, tty, rows, cols, output_limit,
                             False, sealed=sealed, step_key=step_key)
        return await self._start_msg(msg)

    async def _start_msg(self, msg: Dict[str, Any]) -> "Process":
        stream = await self._t.server_stream(_SVC + "Exec", msg)
        proc = Process(self, stream, "")
        await proc._await_start()
        return proc

    async def exec(self, command: Command, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   user: Optional[str] = None, stdin: Optional[Data] = None,
                   timeout: Optional[_wire.Seconds] = None, output_limit: Optional[int] = None,
                   sealed: Sealed = None, step_key: Optional[str] = None) -> ExecResult:
        """Run a command, wait for it and return its output and exit status.
        A string runs with ``/bin/sh -c``, a list directly; the other
        arguments are those of :meth:`start`. A command that fails is not an
        error: look at ``exit_code``, ``signal``, ``timed_out``, or call
        ``result.check()``."""
        proc = await self.start(command, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                output_limit=output_limit, sealed=sealed, step_key=step_key)
        return await proc.wait()

    async def run_shell(self, command: str, **kwargs: Any) -> ExecResult:
        """Run a shell command line (``/bin/sh -c``) and return its result;
        the keyword arguments are those of :meth:`exec`."""
        if not isinstance(command, str):
            raise errors.InvalidArgumentError("run_shell takes a command line (a string); use exec for an argv list")
        return await self.exec(command, **kwargs)

    async def exec_detached(self, command: Command, *, env: Optional[Mapping[str, str]] = None,
                            cwd: Optional[str] = None, user: Optional[str] = None, stdin: Optional[Data] = None,
                            timeout: Optional[_wire.Seconds] = None, stdin_open: bool = False, tty: bool = False,
                            rows: int = 0, cols: int = 0, output_limit: Optional[int] = None,
                            sealed: Sealed = None, step_key: Optional[str] = None) -> str:
        """Start a command in the background and return its exec ID as soon
        as it runs. Its output is kept in the sandbox: follow it with
        :meth:`attach`, list it with :meth:`list_execs`. Arguments are those
        of :meth:`start`."""
        msg = self._exec_msg(command, env, cwd, user, stdin, timeout, stdin_open, tty, rows, cols, output_limit,
                             True, sealed=sealed, step_key=step_key)
        stream = await self._t.server_stream(_SVC + "Exec", msg)
        proc = Process(self, stream, "")
        try:
            await proc._await_start()
        finally:
            await proc.close()
        return proc.exec_id

    async def attach(self, exec_id: str, stdout_offset: int = 0, stderr_offset: int = 0) -> "Process":
        """Follow a command by its exec ID, whether it still runs or has
        ended: its output from the given byte offsets of each stream (0
        replays it all), then its exit. An unknown exec ID raises
        NotFoundError when the process is read."""
        if not exec_id:
            raise errors.InvalidArgumentError("attach: empty exec ID (list_execs lists them)")
        if stdout_offset < 0 or stderr_offset < 0:
            raise errors.InvalidArgumentError("attach: offsets must be >= 0 (got %d and %d)"
                                              % (stdout_offset, stderr_offset))
        stream = await self._t.server_stream(_SVC + "Attach", {
            "sandboxId": self.id, "execId": exec_id,
            "stdoutOffset": str(stdout_offset), "stderrOffset": str(stderr_offset)})
        proc = Process(self, stream, exec_id)
        proc.stdout_offset, proc.stderr_offset = stdout_offset, stderr_offset
        return proc

    async def write_stdin(self, exec_id: str, data: Data, close: bool = False, *,
                          timeout: Optional[float] = None) -> None:
        """Write to the standard input of a command started with stdin_open
        or a TTY; close it after data when close is set."""
        b = _bytes(data)
        for i in range(0, max(len(b), 1), _CHUNK):
            part = b[i:i + _CHUNK]
            last = i + _CHUNK >= len(b)
            msg: Dict[str, Any] = {"sandboxId": self.id, "execId": exec_id}
            if part:
                msg["data"] = _wire.b64(part)
            if close and last:
                msg["close"] = True
            await self._t.unary(_SVC + "WriteStdin", msg, timeout=self._timeout(timeout), safe=False)

    async def close_stdin(self, exec_id: str, *, timeout: Optional[float] = None) -> None:
        """Close a command's standard input (it then reads end of file)."""
        await self.write_stdin(exec_id, b"", close=True, timeout=timeout)

    async def signal(self, exec_id: str, sig: int = 15, *, timeout: Optional[float] = None) -> None:
        """Send signal number sig to a command's process group. Numbers are
        Linux's (the sandbox's): 15 is SIGTERM, 9 SIGKILL."""
        sig = int(sig)
        if not 0 <= sig <= 64:
            raise errors.InvalidArgumentError("signal %d: Linux signals are 1 to 64" % sig)
        await self._t.unary(_SVC + "Signal", {"sandboxId": self.id, "execId": exec_id, "signal": sig},
                            timeout=self._timeout(timeout), safe=False)

    async def resize_tty(self, exec_id: str, rows: int, cols: int, *, timeout: Optional[float] = None) -> None:
        """Change the terminal size of a TTY command."""
        if not (0 < rows <= 65535 and 0 < cols <= 65535):
            raise errors.InvalidArgumentError("resize: terminal size %dx%d is out of range (1 to 65535 each)"
                                              % (rows, cols))
        await self._t.unary(_SVC + "ResizeTTY", {"sandboxId": self.id, "execId": exec_id, "rows": rows,
                                                 "cols": cols}, timeout=self._timeout(timeout), safe=True)

    async def list_execs(self, *, step_keys: Optional[Iterable[str]] = None,
                         timeout: Optional[float] = None) -> List[ExecInfo]:
        """Return the sandbox's command journal: every exec and its result,
        oldest first; with step_keys, only the execs of those step keys."""
        msg: Dict[str, Any] = {"sandboxId": self.id}
        if step_keys:
            msg["stepKeys"] = _wire.string_list(step_keys, "step_keys")
        resp = await self._t.unary(_SVC + "ListExecs", msg, timeout=self._timeout(timeout), safe=True)
        return [ExecInfo._from_json(e) for e in resp.get("execs") or []]

    # --- steps: commands that run at most once -------------------------------

    async def run_step(self, key: str, command: Command, *, exec_id: str = "", **options: Any) -> StepResult:
        """Run one step at most once in the sandbox: its recorded result if
        it ran, its end if it runs, else it runs now (see
        :meth:`run_steps`). options are those of :meth:`exec`."""
        return (await self.run_steps([Step(key=key, command=command, exec_id=exec_id, options=options)]))[0]

    async def run_steps(self, steps: Iterable[Any]) -> List[StepResult]:
        """Run steps in order, each at most once in the sandbox, and return
        their results (:class:`StepResult`: an ExecResult with ``source``).

        A step is a :class:`Step`, a mapping ``{"key", "command", ...exec
        options}`` or a ``(key, command)`` pair. The journal is read once: a
        step it holds (by key, or by exec_id) is not run again: an ended
        one's result and output are read back ("recorded"), a running one
        is followed to its end ("attached"). A step the journal lacks runs
        with its key as the command's step key ("ran"); if another client
        started it meanwhile (the key is taken), that command is followed
        instead. A stream that breaks is followed again by exec ID, and a
        start whose fate is unknown (the stream broke before the server
        said it started) is looked up by its key before it is tried again.
        A restarted trainer or worker calls it with the same steps and
        fast-forwards to where it was. A command that fails is a result,
        not an error.
        """
        plan = [_step_of(s) for s in steps]
        for s in plan:
            _step_key(s.key)
        keys = [s.key for s in plan if s.key]
        by_id = any(s.exec_id for s in plan)
        journal: List[ExecInfo] = []
        if keys or by_id:
            journal = await self.list_execs(step_keys=None if by_id else keys)
        out: List[StepResult] = []
        for s in plan:
            found = next((e for e in journal if (s.key and e.step_key == s.key) or
                          (s.exec_id and e.exec_id == s.exec_id)), None)
            if found is not None:
                out.append(await self._follow_step(found.exec_id, s.key, "attached" if found.running else "recorded"))
            else:
                out.append(await self._start_step(s))
        return out

    async def _start_step(self, s: Step) -> StepResult:
        for attempt in range(1, _STEP_TRIES + 1):
            taken = False
            try:
                proc = await self.start(s.command, step_key=s.key or None, **s.options)
            except errors.AlreadyExistsError:
                if not s.key:
                    raise
                taken = True
            except errors.UnavailableError:
                # Unknown whether it started: its key says, below.
                if not s.key or attempt == _STEP_TRIES:
                    raise
                await asyncio.sleep(_backoff(attempt))
            else:
                try:
                    return _step_result(await proc.wait(), s.key, "ran")
                except errors.UnavailableError:
                    if not proc.exec_id:
                        raise
                    # It started; its stream broke: follow it, never start
                    # it again.
                    return await self._follow_step(proc.exec_id, s.key, "ran")
                finally:
                    await proc.close()
            try:
                found = await self.list_execs(step_keys=[s.key])
            except errors.UnavailableError:
                if attempt == _STEP_TRIES:
                    raise
                continue
            if found:
                return await self._follow_step(found[0].exec_id, s.key, "attached" if found[0].running else "recorded")
            if taken:
                raise errors.AlreadyExistsError("step key %r is taken in sandbox %s, yet no exec of it is in its "
                                                "journal" % (s.key, self.id))
        raise errors.UnavailableError("step %r in sandbox %s: the server could not be reached" % (s.key, self.id))

    async def _follow_step(self, exec_id: str, key: str, source: str) -> StepResult:
        for attempt in range(1, _STEP_TRIES + 1):
            try:
                proc = await self.attach(exec_id)
            except errors.UnavailableError:
                if attempt == _STEP_TRIES:
                    raise
                await asyncio.sleep(_backoff(attempt))
                continue
            try:
                return _step_result(await proc.wait(), key, source)
            except errors.UnavailableError:
                if attempt == _STEP_TRIES:
                    raise
                await asyncio.sleep(_backoff(attempt))
            finally:
                await proc.close()
        raise AssertionError("unreachable")

    # --- sessions and grading ---------------------------------------------

    async def session(self, name: str, *, shell: Optional[str] = None) -> "Session":
        """Return the sandbox's shell session called name (1 to 64 of
        A-Z, a-z, 0-9, ``_``, ``.`` and ``-``), without calling the server:
        the session is made by its first command, with shell (default
        /bin/bash when the image has it, else /bin/sh)."""
        return Session(self, _check_session_name(name), shell)

    async def list_sessions(self, *, timeout: Optional[float] = None) -> List[SessionInfo]:
        """Return the sandbox's shell sessions, by name."""
        resp = await self._t.unary(_SVC + "ListSessions", {"sandboxId": self.id}, timeout=self._timeout(timeout),
                                   safe=True)
        return [SessionInfo._from_json(m) for m in resp.get("sessions") or []]

    async def delete_session(self, name: str, *, timeout: Optional[float] = None) -> None:
        """End the sandbox's session called name: its shell and every
        process it started are killed; a command running in it ends with
        session_lost. A session that does not exist raises NotFoundError."""
        await self._t.unary(_SVC + "DeleteSession", {"sandboxId": self.id, "name": _check_session_name(name)},
                            timeout=self._timeout(timeout), safe=False)

    async def grade_from(self, paths: Iterable[str], command: Command, *, image: Optional[str] = None,
                         env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                         user: Optional[str] = None, timeout: Optional[_wire.Seconds] = None,
                         output_limit: Optional[int] = None, memory: Optional[int] = None,
                         cpus: Optional[float] = None, max_copy_bytes: Optional[int] = None,
                         call_timeout: Optional[float] = None) -> GradeResult:
        """Judge the sandbox's work outside its reach: the server makes a
        fresh sandbox from this sandbox's original image (its layers, not
        what the sandbox wrote; or image), copies only paths (absolute; a
        directory with everything below it) from this sandbox to the same
        paths there (regular files and directories; symbolic links are
        copied as links, never followed; anything else is refused), runs
        command there (a string with ``/bin/sh -c``, a list directly),
        deletes it and returns the result. This sandbox is not changed. A
        command that fails is not an error: look at the result's code.

        Args:
            timeout: seconds after which the grading command is killed
                (default 10 minutes).
            memory, cpus: the grading sandbox's resources (default: this
                sandbox's).
            max_copy_bytes: most bytes copied (default 1 GiB); beyond it the
                call fails.
            call_timeout: deadline of the whole call (default: the command's
                timeout plus a few minutes for the sandbox and the copy).
        """
        if isinstance(paths, str):
            raise errors.InvalidArgumentError("grade_from: paths is a list of paths (example: [\"/work\"])")
        plist = _wire.string_list(paths, "paths")
        if not plist:
            raise errors.InvalidArgumentError("grade_from: no paths to copy: name the sandbox's files or directories "
                                              "to grade (example: [\"/work\"])")
        if len(plist) > 256:
            raise errors.InvalidArgumentError("grade_from: %d paths to copy; at most 256 (copy their common "
                                              "directory instead)" % len(plist))
        for p in plist:
            if not p.startswith("/"):
                raise errors.InvalidArgumentError("grade_from: path %.80r is not absolute (example: /workspace)" % p)
        msg: Dict[str, Any] = {"sandboxId": self.id, "paths": plist}
        _set_command(msg, command, "grade_from", "\"cd /workspace && make test\"", "[\"pytest\", \"-q\"]")
        if image:
            msg["image"] = str(image)
        if env:
            msg["env"] = _wire.string_map(env, "env")
        if cwd:
            msg["cwd"] = cwd
        if user:
            msg["user"] = str(user)
        t = _wire.seconds_of(timeout, "timeout")
        if t is not None:
            if t <= 0:
                raise errors.InvalidArgumentError("grade_from: timeout %gs is not positive" % t)
            msg["timeout"] = _wire.duration(t)
        for name, v, key in (("output_limit", output_limit, "outputLimit"),
                             ("max_copy_bytes", max_copy_bytes, "maxCopyBytes")):
            if v is not None:
                if v < 0:
                    raise errors.InvalidArgumentError("grade_from: %s %d is negative" % (name, v))
                msg[key] = str(int(v))
        res: Dict[str, Any] = {}
        if memory:
            res["memoryBytes"] = str(int(memory))
        if cpus:
            res["cpus"] = float(cpus)
        if res:
            msg["resources"] = res
        if call_timeout is None:
            call_timeout = self._client._call_timeout(None)
            if call_timeout is not None:
                call_timeout = max(call_timeout, (t if t is not None else 600.0) + 300.0)
        resp = await self._t.unary(_SVC + "GradeFrom", msg, timeout=call_timeout, safe=False)
        return GradeResult._from_grade_json(resp)

    # --- files ------------------------------------------------------------
    # Paths are resolved in the sandbox's own view of its file system:
    # symlinks and .. cannot leave it.

    async def read_file(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        """Return the contents of a regular file in the sandbox."""
        buf = bytearray()

        async def attempt(_: Optional[float]) -> bytes:
            del buf[:]
            await self._read_stream(path, buf.extend, retry_ok=True)
            return bytes(buf)

        return await self._t.call(attempt, timeout=timeout, safe=True)

    async def download(self, path: str, fileobj: Any, *, timeout: Optional[float] = None) -> FileInfo:
        """Write a regular file of the sandbox to fileobj (anything with a
        write method, sync or async) as it streams in; return the file's
        description."""

        async def attempt(_: Optional[float]) -> FileInfo:
            return await self._read_stream(path, fileobj.write, retry_ok=True)

        return await self._t.call(attempt, timeout=timeout, safe=True)

    async def _read_stream(self, path: str, write: Any, retry_ok: bool) -> FileInfo:
        stream = await self._t.server_stream(_SVC + "ReadFile", {"sandboxId": self.id, "path": path})
        info = FileInfo(path=path)
        wrote = False
        try:
            while True:
                try:
                    msg = await stream.recv()
                except errors.DSecError as e:
                    raise (NoRetry(e) if wrote else e) from None
                if msg is None:
                    return info
                if msg.get("info"):
                    info = FileInfo._from_json(msg["info"])
                data = _wire.unb64(msg.get("data"))
                if data:
                    wrote = True
                    r = write(data)
                    if inspect.isawaitable(r):
                        await r
        finally:
            stream.close()

    async def write_file(self, path: str, data: Data, *, mode: Optional[int] = None, make_parents: bool = False,
                         owner: Optional[str] = None, timeout: Optional[float] = None) -> FileInfo:
        """Write data (bytes, or text as UTF-8) to a regular file in the
        sandbox, replacing it.

        Args:
            mode: permission bits (default 0o644).
            make_parents: create missing parent directories (0o755).
            owner: name, uid or uid:gid that owns it (default root).
        """
        b = _bytes(data)

        async def attempt(remaining: Optional[float]) -> FileInfo:
            return await self._upload(path, _tar_bytes_chunks(b), mode, make_parents, owner, remaining)

        return await self._t.call(attempt, timeout=timeout, safe=True)

    async def upload(self, path: str, source: Source, *, mode: Optional[int] = None, make_parents: bool = False,
                     owner: Optional[str] = None, timeout: Optional[float] = None) -> FileInfo:
        """Write what source yields to a regular file in the sandbox,
        replacing it, streamed in chunks of at most 1 MiB. source is bytes,
        a binary file object (its read may be sync or async), or an
        iterable or async iterable of bytes. If reading source fails, the
        upload is abandoned and the file left as it was. Options are those
        of :meth:`write_file`."""
        return await self._t.call(
            lambda remaining: self._upload(path, _chunks(source), mode, make_parents, owner, remaining),
            timeout=timeout, safe=False)

    async def _upload(self, path: str, chunks: AsyncIterator[bytes], mode: Optional[int], make_parents: bool,
                      owner: Optional[str], timeout: Optional[float]) -> FileInfo:
        header: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if mode is not None:
            header["mode"] = _perm(mode)
        if make_parents:
            header["makeParents"] = True
        if owner:
            header["user"] = str(owner)

        async def messages() -> AsyncIterator[Dict[str, Any]]:
            yield {"header": header}
            async for c in chunks:
                yield {"data": _wire.b64(c)}

        try:
            resp = await self._t.client_stream(_SVC + "WriteFile", messages(), timeout=timeout)
        finally:
            await _aclose(chunks)
        return FileInfo._from_json(resp.get("info"))

    async def stat(self, path: str, *, timeout: Optional[float] = None) -> FileInfo:
        """Describe a file in the sandbox, following symlinks inside it."""
        resp = await self._t.unary(_SVC + "Stat", {"sandboxId": self.id, "path": path},
                                   timeout=self._timeout(timeout), safe=True)
        return FileInfo._from_json(resp.get("info"))

    async def exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        """Whether path exists in the sandbox."""
        try:
            await self.stat(path, timeout=timeout)
        except errors.NotFoundError:
            return False
        return True

    async def list_dir(self, path: str, *, limit: int = 0, timeout: Optional[float] = None) -> DirListing:
        """List a directory of the sandbox (symlinks are listed, not
        followed); at most limit entries (default and maximum 10000)."""
        msg: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if limit:
            msg["limit"] = int(limit)
        resp = await self._t.unary(_SVC + "ListDir", msg, timeout=self._timeout(timeout), safe=True)
        return DirListing([FileInfo._from_json(e) for e in resp.get("entries") or []], bool(resp.get("truncated")))

    async def mkdir(self, path: str, *, mode: Optional[int] = None, parents: bool = False,
                    owner: Optional[str] = None, timeout: Optional[float] = None) -> FileInfo:
        """Make a directory: mode 0o755 unless given, owned by root unless
        owner, with its missing parents when parents (an existing directory
        is then no error)."""
        msg: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if mode is not None:
            msg["mode"] = _perm(mode)
        if parents:
            msg["parents"] = True
        if owner:
            msg["user"] = str(owner)
        resp = await self._t.unary(_SVC + "MakeDir", msg, timeout=self._timeout(timeout), safe=parents)
        return FileInfo._from_json(resp.get("info"))

    async def remove(self, path: str, *, recursive: bool = False, timeout: Optional[float] = None) -> None:
        """Remove a file or an empty directory, or a whole tree when
        recursive."""
        await self._t.unary(_SVC + "Remove", {"sandboxId": self.id, "path": path, "recursive": recursive},
                            timeout=self._timeout(timeout), safe=False)

    async def rename(self, src: str, dst: str, *, overwrite: bool = False, timeout: Optional[float] = None) -> None:
        """Rename a file or directory; an existing dst raises
        AlreadyExistsError unless overwrite."""
        await self._t.unary(_SVC + "Rename", {"sandboxId": self.id, "from": src, "to": dst, "overwrite": overwrite},
                            timeout=self._timeout(timeout), safe=False)

    async def download_tar(self, path: str, fileobj: Any, *, timeout: Optional[float] = None) -> int:
        """Write the file or tree at path to fileobj (write may be sync or
        async) as a tar archive, as it streams in; entries are named
        relative to path. Return the archive's size."""

        async def attempt(_: Optional[float]) -> int:
            stream = await self._t.server_stream(_SVC + "DownloadTar", {"sandboxId": self.id, "path": path})
            n = 0
            try:
                while True:
                    try:
                        msg = await stream.recv()
                    except errors.DSecError as e:
                        raise (NoRetry(e) if n else e) from None
                    if msg is None:
                        return n
                    data = _wire.unb64(msg.get("data"))
                    if data:
                        n += len(data)
                        r = fileobj.write(data)
                        if inspect.isawaitable(r):
                            await r
            finally:
                stream.close()

        return await self._t.call(attempt, timeout=timeout, safe=True)

    async def upload_tar(self, dir: str, source: Source, *, make_parents: bool = False,
                         owner: Optional[str] = None, timeout: Optional[float] = None) -> TarStats:
        """Extract the tar archive source yields (see :meth:`upload`) into
        the directory dir of the sandbox. The server refuses a bad archive
        (names or links that leave dir, devices) before it writes anything.
        Owners in the archive are ignored: everything belongs to root or
        owner; make_parents creates dir."""
        return await self._t.call(
            lambda remaining: self._upload_tar(dir, _chunks(source), make_parents, owner, remaining),
            timeout=timeout, safe=False)

    async def _upload_tar(self, dir: str, chunks: AsyncIterator[bytes], make_parents: bool, owner: Optional[str],
                          timeout: Optional[float]) -> TarStats:
        header: Dict[str, Any] = {"sandboxId": self.id, "path": dir}
        if make_parents:
            header["makeParents"] = True
        if owner:
            header["user"] = str(owner)

        async def messages() -> AsyncIterator[Dict[str, Any]]:
            yield {"header": header}
            async for c in chunks:
                yield {"data": _wire.b64(c)}

        try:
            m = await self._t.client_stream(_SVC + "UploadTar", messages(), timeout=timeout)
        finally:
            await _aclose(chunks)
        return TarStats(files=_wire.to_int(m.get("files")), dirs=_wire.to_int(m.get("dirs")),
                        links=_wire.to_int(m.get("links")), bytes=_wire.to_int(m.get("bytes")))

    async def upload_dir(self, local_dir: str, remote_dir: str, *, make_parents: bool = False,
                         owner: Optional[str] = None, timeout: Optional[float] = None) -> TarStats:
        """Copy the local tree local_dir into the directory remote_dir of the
        sandbox (local_dir's entries become remote_dir's), streamed as a tar
        archive while it is read: regular files, directories and symlinks
        with their permission bits and times; hard links as copies; other
        files left out. Options are those of :meth:`upload_tar`."""
        local_dir = os.fspath(local_dir)
        if not os.path.isdir(local_dir):
            raise errors.InvalidArgumentError("upload %s: not a local directory" % local_dir)
        return await self._t.call(
            lambda remaining: self._upload_tar(remote_dir, _tar.tar_chunks(local_dir), make_parents, owner,
                                               remaining),
            timeout=timeout, safe=False)

    async def download_dir(self, remote_path: str, local_dir: str, *, timeout: Optional[float] = None) -> None:
        """Copy the tree at remote_path into the local directory local_dir
        (created if missing): remote_path's entries become local_dir's, and
        a file lands in local_dir under its name.

        The archive comes from an untrusted sandbox, so it is extracted
        defensively: absolute names, .. elements, paths through symlinks
        and devices raise ArchiveError and nothing is written outside
        local_dir. Symlinks are created as they are; permission bits are
        kept without setuid, setgid and sticky; owners are not.
        """
        sp = _tar.spool()
        await self.download_tar(remote_path, sp, timeout=timeout)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _tar.extract_spooled, sp, os.fspath(local_dir), _tar.base_of(remote_path))


class Session:
    """A named shell session of a sandbox (``await sandbox.session("main")``):
    a shell that lives on between commands, so that cwd, environment,
    functions, aliases and background jobs carry from one command to the
    next. Each command still has its own exec ID, stdout, stderr and exit
    code; a session runs one command at a time (another raises
    FailedPreconditionError), and several sessions of a sandbox run
    concurrently.

    A command's timeout interrupts its foreground processes (SIGINT): the
    result says ``timed_out`` with ``signal`` 2 and no exit code. If they
    outlive the interrupt for a grace period the shell is killed: the result
    says ``timed_out``, ``signal`` 9 and ``session_lost``, and the next
    command runs in a new shell and says ``session_restarted``.

    Attributes:
        sandbox: the sandbox.
        name: the session's name.
        shell: the shell it is made with on its first command (None: the
            server's default).
    """

    def __init__(self, sandbox: Sandbox, name: str, shell: Optional[str] = None) -> None:
        self.sandbox = sandbox
        self.name = name
        self.shell = shell

    def __repr__(self) -> str:
        return "Session(sandbox=%r, name=%r)" % (self.sandbox.id, self.name)

    def _msg(self, command: str, env: Optional[Mapping[str, str]], cwd: Optional[str], user: Optional[str],
             stdin: Optional[Data], timeout: Optional[_wire.Seconds], output_limit: Optional[int],
             detach: bool) -> Dict[str, Any]:
        if not isinstance(command, str):
            raise errors.InvalidArgumentError("a session runs shell lines: give the command as one string "
                                              "(example: \"cd /tmp && ls\")")
        return self.sandbox._exec_msg(command, env, cwd, user, stdin, timeout, False, False, 0, 0, output_limit,
                                      detach, session=self.name, session_shell=self.shell)

    async def start(self, command: str, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    user: Optional[str] = None, stdin: Optional[Data] = None,
                    timeout: Optional[_wire.Seconds] = None, output_limit: Optional[int] = None) -> "Process":
        """Start the shell line command in the session and return once it
        runs, as a :class:`Process` (see :meth:`Sandbox.start`)."""
        return await self.sandbox._start_msg(self._msg(command, env, cwd, user, stdin, timeout, output_limit,
                                                       False))

    async def run(self, command: str, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  user: Optional[str] = None, stdin: Optional[Data] = None,
                  timeout: Optional[_wire.Seconds] = None, output_limit: Optional[int] = None) -> ExecResult:
        """Run the shell line command in the session, wait for it and return
        its output and exit status (with ``session_lost`` and
        ``session_restarted``). A command that fails is not an error."""
        proc = await self.start(command, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                output_limit=output_limit)
        return await proc.wait()

    async def run_detached(self, command: str, *, env: Optional[Mapping[str, str]] = None,
                           cwd: Optional[str] = None, user: Optional[str] = None, stdin: Optional[Data] = None,
                           timeout: Optional[_wire.Seconds] = None, output_limit: Optional[int] = None) -> str:
        """Start the shell line command in the session and return its exec
        ID at once; follow it with :meth:`Sandbox.attach`."""
        msg = self._msg(command, env, cwd, user, stdin, timeout, output_limit, True)
        stream = await self.sandbox._t.server_stream(_SVC + "Exec", msg)
        proc = Process(self.sandbox, stream, "")
        try:
            await proc._await_start()
        finally:
            await proc.close()
        return proc.exec_id

    async def delete(self, *, timeout: Optional[float] = None) -> None:
        """End the session (see :meth:`Sandbox.delete_session`)."""
        await self.sandbox.delete_session(self.name, timeout=timeout)


class Process:
    """A running (or ended) command: iterate it for its output, wait for its
    end, write its input, resize its terminal, signal it.

    ``async for chunk in proc`` yields :class:`OutputChunk` objects as the
    output arrives and stops at the command's end, after which ``exit``
    holds its :class:`ExitStatus`. ``await proc.wait()`` reads the rest and
    returns an :class:`ExecResult` with the output not yet iterated. Close
    the process (``await proc.close()`` or ``async with proc``) to stop
    following it; the command runs on.

    Attributes:
        exec_id: the command's ID.
        exit: how it ended, once it has.
        stdout_offset, stderr_offset: bytes of each stream received so far
            (from the attach offsets), where to attach again from.
    """

    def __init__(self, sandbox: Sandbox, stream: ServerStream, exec_id: str) -> None:
        self.sandbox = sandbox
        self.exec_id = exec_id
        self.exit: Optional[ExitStatus] = None
        self.stdout_offset = 0
        self.stderr_offset = 0
        self._stream: Optional[ServerStream] = stream
        self._pending: List[Dict[str, Any]] = []

    def __repr__(self) -> str:
        return "Process(exec_id=%r, sandbox=%r, exit=%r)" % (self.exec_id, self.sandbox.id, self.exit)

    async def __aenter__(self) -> "Process":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __aiter__(self) -> "Process":
        return self

    async def __anext__(self) -> OutputChunk:
        chunk = await self.read()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    def _fail(self, e: errors.DSecError) -> errors.DSecError:
        if self.exec_id:
            e.exec_id = self.exec_id
            e.message = "exec %s in sandbox %s: %s" % (self.exec_id, self.sandbox.id, e.message)
            e.args = (e.message,)
        return e

    async def _recv(self) -> Optional[Dict[str, Any]]:
        if self._pending:
            return self._pending.pop(0)
        stream = self._stream
        if stream is None:
            raise self._fail(errors.FailedPreconditionError(
                "the process is closed; attach to the command again with sandbox.attach(exec_id, stdout_offset, "
                "stderr_offset)"))
        try:
            msg = await stream.recv()
        except errors.DSecError as e:
            stream.close()
            self._stream = None
            raise self._fail(e) from None
        except BaseException:
            # Cancelled or timed out in the middle of a read: the stream
            # cannot be resumed.
            stream.close()
            self._stream = None
            raise
        if msg is None:
            stream.close()
            self._stream = None
            if not self.exec_id:
                raise errors.UnavailableError("exec in sandbox %s: the stream ended before the command started; it "
                                              "is unknown whether it ran" % self.sandbox.id)
            raise self._fail(errors.UnavailableError(
                "the stream ended before the command exited; it may still be running: attach to it with "
                "sandbox.attach(%r, stdout_offset=%d, stderr_offset=%d)"
                % (self.exec_id, self.stdout_offset, self.stderr_offset)))
        return msg

    async def _await_start(self) -> None:
        """Read up to the started event, keeping anything before it."""
        try:
            while True:
                msg = await self._recv()
                if isinstance(msg.get("started"), dict):
                    self.exec_id = msg["started"].get("execId", "")
                    return
                self._pending.append(msg)
        except BaseException:
            await self.close()
            raise

    async def read(self) -> Optional[OutputChunk]:
        """Return the next piece of output, or None once the command ended
        (then ``exit`` is set)."""
        while self.exit is None:
            msg = await self._recv()
            if isinstance(msg.get("started"), dict):
                self.exec_id = msg["started"].get("execId", "") or self.exec_id
            elif isinstance(msg.get("output"), dict):
                out = msg["output"]
                data = _wire.unb64(out.get("data"))
                name = "stderr" if out.get("stream") in ("STREAM_STDERR", 2) else "stdout"
                offset = _wire.to_int(out.get("offset"))
                if name == "stdout":
                    self.stdout_offset = offset + len(data)
                else:
                    self.stderr_offset = offset + len(data)
                if data:
                    return OutputChunk(name, data, offset)
            elif isinstance(msg.get("exit"), dict):
                self.exit = ExitStatus._from_json(self.exec_id, msg["exit"])
                stream, self._stream = self._stream, None
                if stream is not None:
                    # Read the end of the stream so the connection is reused.
                    try:
                        await stream.recv()
                    except errors.DSecError:
                        pass
                    stream.close()
            # keepalives and events this version does not know are skipped
        return None

    async def wait(self) -> ExecResult:
        """Read the rest of the output until the command ends; return its
        exit status with the output not read before."""
        out, err = bytearray(), bytearray()
        while True:
            chunk = await self.read()
            if chunk is None:
                break
            (err if chunk.stream == "stderr" else out).extend(chunk.data)
        assert self.exit is not None
        st = self.exit
        fields = {f.name: getattr(st, f.name) for f in dataclasses.fields(ExitStatus)}
        return ExecResult(**fields, stdout_bytes=bytes(out), stderr_bytes=bytes(err))

    async def write_stdin(self, data: Data, close: bool = False) -> None:
        """Write to the command's standard input (started with stdin_open or
        tty); close it after data when close is set."""
        await self.sandbox.write_stdin(self.exec_id, data, close)

    async def close_stdin(self) -> None:
        """Close the command's standard input."""
        await self.sandbox.close_stdin(self.exec_id)

    async def resize(self, rows: int, cols: int) -> None:
        """Change the command's terminal size."""
        await self.sandbox.resize_tty(self.exec_id, rows, cols)

    async def signal(self, sig: int = 15) -> None:
        """Send signal number sig (Linux numbering) to the command's process
        group."""
        await self.sandbox.signal(self.exec_id, sig)

    async def close(self) -> None:
        """Stop following the command; it runs on. Idempotent."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def _bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise errors.InvalidArgumentError("want bytes or str, not %s" % type(data).__name__)


def _perm(mode: int) -> int:
    mode = int(mode)
    if not 0 <= mode <= 0o7777:
        raise errors.InvalidArgumentError("mode %o has bits beyond permissions (0o7777)" % mode)
    return mode


async def _tar_bytes_chunks(b: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(b), _CHUNK):
        yield b[i:i + _CHUNK]


async def _chunks(source: Source) -> AsyncIterator[bytes]:
    """Yield what an upload source holds in chunks of at most 1 MiB."""
    if isinstance(source, (bytes, bytearray, memoryview, str)):
        async for c in _tar_bytes_chunks(_bytes(source)):
            yield c
        return
    if hasattr(source, "read"):
        while True:
            c = source.read(_CHUNK)
            if inspect.isawaitable(c):
                c = await c
            if not c:
                return
            yield _bytes(c)
    elif hasattr(source, "__aiter__"):
        async for c in source:
            for i in range(0, len(c), _CHUNK):
                yield _bytes(c[i:i + _CHUNK])
    elif hasattr(source, "__iter__"):
        for c in source:
            for i in range(0, len(c), _CHUNK):
                yield _bytes(c[i:i + _CHUNK])
    else:
        raise errors.InvalidArgumentError("upload: want bytes, a binary file or an iterable of bytes, not %s"
                                          % type(source).__name__)


async def _aclose(gen: Any) -> None:
    aclose = getattr(gen, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            pass

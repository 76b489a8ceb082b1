"""Plain data the API returns: exit statuses, command output, file
descriptions, statistics, events, images and keys.

Durations are float seconds; times are timezone-aware datetimes (UTC);
sizes are bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import stat as _stat
from typing import Any, Dict, Iterator, List, Mapping, Optional, TYPE_CHECKING

from . import _wire, errors

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = [
    "Resources", "ExitStatus", "ExecResult", "OutputChunk", "ExecInfo", "FileInfo", "DirListing",
    "TarStats", "Stats", "Event", "BatchResult", "Layer", "ImageConfig", "Image", "Key", "SessionInfo",
    "GradeResult",
]


@dataclasses.dataclass
class Resources:
    """What a sandbox may use.

    Attributes:
        memory: memory limit in bytes.
        cpus: CPU cap in cores (may be fractional).
        pids: most processes and threads.
        disk: size of the writable layer in bytes.
    """

    memory: int = 0
    cpus: float = 0.0
    pids: int = 0
    disk: int = 0

    @classmethod
    def _from_json(cls, m: Optional[Mapping[str, Any]]) -> "Resources":
        m = m or {}
        return cls(memory=_wire.to_int(m.get("memoryBytes")), cpus=_wire.to_float(m.get("cpus")),
                   pids=_wire.to_int(m.get("pids")), disk=_wire.to_int(m.get("diskBytes")))


@dataclasses.dataclass
class ExitStatus:
    """How a command ended. A command that ran and failed is not an error.

    Attributes:
        exec_id: the command's ID in its sandbox (attach to it with it).
        exit_code: its exit code when it exited.
        signal: the number of the signal that ended it (exit_code is then
            0 and means nothing).
        timed_out: its timeout killed its process group; signal is then 9
            and exit_code 0 (``code`` is 124, as the CLI exits).
        oom_killed: the kernel killed it for memory.
        stdout_truncated, stderr_truncated: the stream passed its cap and the
            rest of it was dropped.
        duration: how long it ran, in seconds.
        lost: its end was not observed (its node's keeper restarted while it
            ran); the other fields say nothing.
        sealed: it ran sealed (``exec(..., sealed=True)``).
        session_lost: its session's shell ended (its timeout's grace period
            passed, it ended the shell, the session was deleted, or the
            keeper restarted): the session's state is gone and its next
            command gets a new shell.
        session_restarted: it ran in a new shell that replaced a lost one:
            state set by the session's earlier commands (cwd, environment,
            jobs) is gone.
    """

    exec_id: str = ""
    exit_code: int = 0
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0
    lost: bool = False
    sealed: bool = False
    session_lost: bool = False
    session_restarted: bool = False

    @property
    def code(self) -> int:
        """The exit code a shell reports: 124 for a timeout, 128+N for
        signal N, else exit_code."""
        if self.timed_out:
            return 124
        if self.signal:
            return 128 + self.signal
        return self.exit_code

    @property
    def ok(self) -> bool:
        """Whether the command exited with code 0 on its own."""
        return self.code == 0 and not self.lost and not self.oom_killed

    @classmethod
    def _from_json(cls, exec_id: str, m: Mapping[str, Any]) -> "ExitStatus":
        return cls(**_exit_fields(exec_id, m))


def _exit_fields(exec_id: str, m: Mapping[str, Any]) -> Dict[str, Any]:
    return dict(
        exec_id=exec_id,
        exit_code=_wire.to_int(m.get("exitCode")),
        signal=_wire.to_int(m.get("signal")),
        timed_out=bool(m.get("timedOut")),
        oom_killed=bool(m.get("oomKilled")),
        stdout_truncated=bool(m.get("stdoutTruncated")),
        stderr_truncated=bool(m.get("stderrTruncated")),
        duration=_wire.parse_duration(m.get("duration")),
        lost=bool(m.get("lost")),
        sealed=bool(m.get("sealed")),
        session_lost=bool(m.get("sessionLost")),
        session_restarted=bool(m.get("sessionRestarted")),
    )


@dataclasses.dataclass
class ExecResult(ExitStatus):
    """A finished command with its output.

    Attributes:
        stdout_bytes, stderr_bytes: the output as it came.
        stdout, stderr: the same decoded as UTF-8 (undecodable bytes
            replaced).
    """

    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    def check(self) -> "ExecResult":
        """Return self if the command succeeded, else raise
        FailedPreconditionError with its code and the end of its stderr."""
        if not self.ok:
            tail = self.stderr[-500:].strip()
            raise errors.FailedPreconditionError(
                "exec %s failed with code %d%s" % (self.exec_id, self.code, ": " + tail if tail else ""),
                exec_id=self.exec_id)
        return self


@dataclasses.dataclass
class OutputChunk:
    """A piece of a command's output.

    Attributes:
        stream: "stdout" or "stderr".
        data: the bytes.
        offset: the byte offset of data in its stream.
    """

    stream: str
    data: bytes
    offset: int = 0

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclasses.dataclass
class ExecInfo:
    """One entry of a sandbox's command journal.

    Attributes:
        exec_id: the command's ID.
        argv: the command (a shell line shows as ["/bin/sh", "-c", line]).
        tty: it runs on a terminal.
        started_at: when it started.
        running: it has not ended (exit is then None).
        exit: how it ended, once it has.
        stdout_bytes, stderr_bytes: sizes of its output streams, the offsets
            up to which attach can replay them.
        session: the shell session it ran in, if any.
        sealed: it ran sealed.
        step_key: its step key (``exec(..., step_key=...)``), if any.
    """

    exec_id: str
    argv: List[str]
    tty: bool = False
    started_at: Optional[datetime.datetime] = None
    running: bool = False
    exit: Optional[ExitStatus] = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    session: str = ""
    sealed: bool = False
    step_key: str = ""

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "ExecInfo":
        exec_id = m.get("execId", "")
        return cls(exec_id=exec_id, argv=list(m.get("argv") or []), tty=bool(m.get("tty")),
                   started_at=_wire.parse_timestamp(m.get("startedAt")), running=bool(m.get("running")),
                   exit=ExitStatus._from_json(exec_id, m["exit"]) if m.get("exit") is not None else None,
                   stdout_bytes=_wire.to_int(m.get("stdoutBytes")), stderr_bytes=_wire.to_int(m.get("stderrBytes")),
                   session=m.get("session") or "", sealed=bool(m.get("sealed")), step_key=m.get("stepKey") or "")


@dataclasses.dataclass
class Step:
    """One command of a job, for :meth:`Sandbox.run_steps`.

    Attributes:
        key: its step key: unique in the sandbox, at most 256 bytes. A step
            without one is found by exec_id only.
        command: a string runs with ``/bin/sh -c``, a list directly.
        exec_id: the exec of an earlier run of this step, when known.
        options: the other arguments of :meth:`Sandbox.exec` (env, cwd,
            user, stdin, timeout, output_limit).
    """

    key: str = ""
    command: Any = ""
    exec_id: str = ""
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepResult(ExecResult):
    """A step's result: how its command ended and its whole output, as an
    :class:`ExecResult`, and where it came from.

    Attributes:
        step_key: the step's key.
        source: "ran" (it had never started: it ran now), "attached" (it
            was running: followed to its end) or "recorded" (it had ended:
            read back from the journal).
    """

    step_key: str = ""
    source: str = "ran"


@dataclasses.dataclass
class SessionInfo:
    """One shell session of a sandbox.

    Attributes:
        name: its name.
        shell: the shell's path in the sandbox.
        created_at: when it was made.
        commands: how many commands ran in it so far.
        running_exec_id: the command running now, if any.
    """

    name: str
    shell: str = ""
    created_at: Optional[datetime.datetime] = None
    commands: int = 0
    running_exec_id: str = ""

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "SessionInfo":
        return cls(name=m.get("name", ""), shell=m.get("shell", ""),
                   created_at=_wire.parse_timestamp(m.get("createdAt")), commands=_wire.to_int(m.get("commands")),
                   running_exec_id=m.get("runningExecId", ""))


@dataclasses.dataclass
class GradeResult(ExecResult):
    """A finished grade (:meth:`Sandbox.grade_from`): the grading command's
    exit status and output (exec_id is empty), and what was copied.

    Attributes:
        grader_sandbox_id: the grading sandbox, deleted when the call
            returned.
        copied_files, copied_bytes: what was copied from the sandbox graded.
    """

    grader_sandbox_id: str = ""
    copied_files: int = 0
    copied_bytes: int = 0

    @classmethod
    def _from_grade_json(cls, m: Mapping[str, Any]) -> "GradeResult":
        if not isinstance(m.get("exit"), dict):
            raise errors.InternalError("grade: the server's answer had no exit status (is it older than this "
                                       "client?)")
        return cls(**_exit_fields("", m["exit"]), stdout_bytes=_wire.unb64(m.get("stdout")),
                   stderr_bytes=_wire.unb64(m.get("stderr")), grader_sandbox_id=m.get("graderSandboxId", ""),
                   copied_files=_wire.to_int(m.get("copiedFiles")), copied_bytes=_wire.to_int(m.get("copiedBytes")))


_TYPE_BITS = {"dir": _stat.S_IFDIR, "symlink": _stat.S_IFLNK, "fifo": _stat.S_IFIFO,
              "socket": _stat.S_IFSOCK, "device": _stat.S_IFCHR, "file": _stat.S_IFREG}


@dataclasses.dataclass
class FileInfo:
    """A file in a sandbox.

    Attributes:
        path: its path in the sandbox.
        name: its base name (set in directory listings).
        type: "file", "dir", "symlink", "fifo", "socket", "device", or ""
            when the server did not say.
        link_target: a symlink's target.
        size: size in bytes.
        mode: permission bits (with setuid, setgid and sticky), like
            st_mode & 0o7777.
        mod_time: last modification.
        is_dir: it is a directory.
        uid, gid: owner as seen in the sandbox.
    """

    path: str = ""
    name: str = ""
    type: str = ""
    link_target: str = ""
    size: int = 0
    mode: int = 0
    mod_time: Optional[datetime.datetime] = None
    is_dir: bool = False
    uid: int = 0
    gid: int = 0

    @property
    def st_mode(self) -> int:
        """mode with the file type bits, as os.stat's st_mode."""
        return self.mode | _TYPE_BITS.get(self.type, _stat.S_IFDIR if self.is_dir else 0)

    @classmethod
    def _from_json(cls, m: Optional[Mapping[str, Any]]) -> "FileInfo":
        m = m or {}
        typ = m.get("type", "")
        return cls(path=m.get("path", ""), name=m.get("name", ""), type=typ, link_target=m.get("linkTarget", ""),
                   size=_wire.to_int(m.get("size")), mode=_wire.to_int(m.get("mode")) & 0o7777,
                   mod_time=_wire.parse_timestamp(m.get("modTime")), is_dir=bool(m.get("isDir")) or typ == "dir",
                   uid=_wire.to_int(m.get("uid")), gid=_wire.to_int(m.get("gid")))


@dataclasses.dataclass
class DirListing:
    """A directory's entries; truncated says the server left entries out
    past its limit (10000). Iterating it iterates the entries."""

    entries: List[FileInfo]
    truncated: bool = False

    def __iter__(self) -> Iterator[FileInfo]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> List[str]:
        """The entries' names, sorted."""
        return sorted(e.name for e in self.entries)


@dataclasses.dataclass
class TarStats:
    """What an archive upload extracted: regular files (and fifos),
    directories, links, and bytes of file data."""

    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0


@dataclasses.dataclass
class Stats:
    """A sandbox's resource use and limits.

    Attributes:
        cpu: CPU time its processes used, in seconds.
        cpus: its CPU cap in cores.
        memory, memory_limit: bytes.
        pids, pids_limit: processes and threads.
        disk, disk_limit: the writable layer's use and size in bytes.
        oom_kills: processes the kernel killed for memory.
        output, output_limit: bytes of exec output kept, and the quota.
        net_out, net_in, net_connections, net_denied: network counters
            (zero without network; Sandbox.network() has them all).
        networked: whether the sandbox has a network (a policy that
            allows anything).
        swapped: bytes of a paused sandbox's memory out of RAM, in the
            node's swap, as its pause left it.
    """

    cpu: float = 0.0
    cpus: float = 0.0
    memory: int = 0
    memory_limit: int = 0
    pids: int = 0
    pids_limit: int = 0
    disk: int = 0
    disk_limit: int = 0
    oom_kills: int = 0
    output: int = 0
    output_limit: int = 0
    net_out: int = 0
    net_in: int = 0
    net_connections: int = 0
    net_denied: int = 0
    networked: bool = False
    swapped: int = 0

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "Stats":
        i = _wire.to_int
        return cls(cpu=_wire.parse_duration(m.get("cpuUsage")), cpus=_wire.to_float(m.get("cpusLimit")),
                   memory=i(m.get("memoryBytes")), memory_limit=i(m.get("memoryLimit")), pids=i(m.get("pids")),
                   pids_limit=i(m.get("pidsLimit")), disk=i(m.get("diskBytes")), disk_limit=i(m.get("diskLimit")),
                   oom_kills=i(m.get("oomKills")), output=i(m.get("outputBytes")),
                   output_limit=i(m.get("outputLimit")), net_out=i(m.get("netBytesOut")),
                   net_in=i(m.get("netBytesIn")), net_connections=i(m.get("netConnectionsOut")),
                   net_denied=i(m.get("netDenied")),
                   networked=bool(m.get("networked", False)), swapped=i(m.get("swappedBytes")))


@dataclasses.dataclass
class Event:
    """A change of a sandbox's state.

    Attributes:
        type: "created", "exited", "oom", "ttl_expired", "failed",
            "deleted", "updated", "paused", "resumed", or "unknown".
        sandbox: the sandbox as it is after the change.
        reason: why, for people.
        time: when.
    """

    type: str
    sandbox: Optional["Sandbox"]
    reason: str = ""
    time: Optional[datetime.datetime] = None


@dataclasses.dataclass
class PauseResult:
    """The outcome of a pause or resume of one sandbox.

    Attributes:
        id: the sandbox's ID.
        state: its state after it: "paused" after a pause, "running" after
            a resume ("" when it failed).
        resident_bytes: its memory in RAM when the call returned.
        swapped_bytes: its memory out of RAM, in the node's swap.
        took: seconds the pause or resume took; 0 when it was already so.
        error: why it failed for this sandbox (by labels only: by ID the
            call raises), e.g. ResourceExhaustedError with retry_after when
            the node cannot hold a resumed sandbox.
    """

    id: str = ""
    state: str = ""
    resident_bytes: int = 0
    swapped_bytes: int = 0
    took: float = 0.0
    error: Optional[errors.DSecError] = None


@dataclasses.dataclass
class BatchResult:
    """The outcome of one item of a batch create: the sandbox, or the
    error that kept it from being created (e.g. ResourceExhaustedError with
    retry_after)."""

    index: int
    sandbox: Optional["Sandbox"] = None
    error: Optional[errors.DSecError] = None


@dataclasses.dataclass
class Layer:
    """A stored read-only EROFS layer; digest is sha256:<hex>."""

    digest: str
    size: int = 0
    media_type: str = ""


@dataclasses.dataclass
class ImageConfig:
    """How to run an image; env holds "K=V" entries."""

    env: List[str] = dataclasses.field(default_factory=list)
    workdir: str = ""
    user: str = ""
    entrypoint: List[str] = dataclasses.field(default_factory=list)
    cmd: List[str] = dataclasses.field(default_factory=list)

    def _to_json(self) -> Dict[str, Any]:
        return {"env": list(self.env), "workdir": self.workdir, "user": self.user,
                "entrypoint": list(self.entrypoint), "cmd": list(self.cmd)}


@dataclasses.dataclass
class Image:
    """A named, ordered list of layers (an environment); name is NAME:TAG,
    layers lowest first, size their sum. project made it: only it (or an
    admin key) deletes or rewrites it. A public image runs for every
    project, a private one only for its own."""

    name: str
    layers: List[Layer] = dataclasses.field(default_factory=list)
    config: ImageConfig = dataclasses.field(default_factory=ImageConfig)
    created_at: Optional[datetime.datetime] = None
    size: int = 0
    project: str = ""
    public: bool = False

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "Image":
        c = m.get("config") or {}
        return cls(name=m.get("name", ""),
                   layers=[Layer(digest=x.get("digest", ""), size=_wire.to_int(x.get("size")),
                                 media_type=x.get("mediaType", "")) for x in m.get("layers") or []],
                   config=ImageConfig(env=list(c.get("env") or []), workdir=c.get("workdir", ""),
                                      user=c.get("user", ""), entrypoint=list(c.get("entrypoint") or []),
                                      cmd=list(c.get("cmd") or [])),
                   created_at=_wire.parse_timestamp(m.get("createdAt")), size=_wire.to_int(m.get("size")),
                   project=m.get("project", ""), public=bool(m.get("public")))


@dataclasses.dataclass
class Key:
    """An API key's description (never its secret); admin keys may create
    keys; project is the project whose sandboxes it sees."""

    id: str
    name: str = ""
    project: str = ""
    admin: bool = False
    created_at: Optional[datetime.datetime] = None
    #: When the key stops working; None: never.
    expires_at: Optional[datetime.datetime] = None

    @classmethod
    def _from_json(cls, m: Optional[Mapping[str, Any]]) -> "Key":
        m = m or {}
        return cls(id=m.get("id", ""), name=m.get("name", ""), project=m.get("project", ""),
                   admin=bool(m.get("admin")), created_at=_wire.parse_timestamp(m.get("createdAt")),
                   expires_at=_wire.parse_timestamp(m.get("expiresAt")))


@dataclasses.dataclass
class ProjectLimits:
    """What a project's live sandboxes may hold at once on all nodes:
    memory_bytes (sum of their memory limits) and sandboxes, 0 for no
    limit; max_ttl_s is the longest hard or idle TTL in seconds (7 days
    unless set)."""

    memory_bytes: int = 0
    sandboxes: int = 0
    max_ttl_s: float = 0.0


@dataclasses.dataclass
class Project:
    """A project's limits and what its live sandboxes hold (as the nodes
    last reported); keys counts its API keys (for admin keys only)."""

    name: str
    limits: ProjectLimits = dataclasses.field(default_factory=ProjectLimits)
    memory_bytes: int = 0
    sandboxes: int = 0
    keys: int = 0

    @classmethod
    def _from_json(cls, m: Optional[Mapping[str, Any]]) -> "Project":
        m = m or {}
        lim, use = m.get("limits") or {}, m.get("usage") or {}
        return cls(name=m.get("name", ""),
                   limits=ProjectLimits(memory_bytes=_wire.to_int(lim.get("memoryBytes")),
                                        sandboxes=_wire.to_int(lim.get("sandboxes")),
                                        max_ttl_s=_wire.parse_duration(lim.get("maxTtl"))),
                   memory_bytes=_wire.to_int(use.get("memoryBytes")), sandboxes=_wire.to_int(use.get("sandboxes")),
                   keys=_wire.to_int(m.get("keys")))


def _layer_from_json(m: Mapping[str, Any]) -> Layer:
    return Layer(digest=m.get("digest", ""), size=_wire.to_int(m.get("size")), media_type=m.get("mediaType", ""))


@dataclasses.dataclass
class LayerUsage:
    """A stored layer with the images (NAME:TAG) whose layer lists name it
    and the live sandboxes that mount it (IDs of the caller's project; every
    project for an admin key)."""

    layer: Layer
    created_at: Optional[datetime.datetime] = None
    images: List[str] = dataclasses.field(default_factory=list)
    sandboxes: List[str] = dataclasses.field(default_factory=list)

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "LayerUsage":
        return cls(layer=_layer_from_json(m.get("layer") or {}), created_at=_wire.parse_timestamp(m.get("createdAt")),
                   images=list(m.get("images") or []), sandboxes=list(m.get("sandboxes") or []))


@dataclasses.dataclass
class ImageDetails:
    """An image with the usage of each of its layers, in the image's order."""

    image: Image
    layers: List[LayerUsage] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class DiskUsage:
    """The layer store in sums: every layer is exactly one of shared (2+
    images), unique (1 image), unreferenced but in use by a sandbox, or
    reclaimable (what garbage_collect with no grace period removes)."""

    layers: List[LayerUsage]
    layer_count: int = 0
    total_bytes: int = 0
    shared_count: int = 0
    shared_bytes: int = 0
    unique_count: int = 0
    unique_bytes: int = 0
    unreferenced_in_use_count: int = 0
    unreferenced_in_use_bytes: int = 0
    reclaimable_count: int = 0
    reclaimable_bytes: int = 0
    image_count: int = 0
    sandbox_count: int = 0

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "DiskUsage":
        names = ("layer_count", "total_bytes", "shared_count", "shared_bytes", "unique_count", "unique_bytes",
                 "unreferenced_in_use_count", "unreferenced_in_use_bytes", "reclaimable_count",
                 "reclaimable_bytes", "image_count", "sandbox_count")

        def camel(s: str) -> str:
            first, *rest = s.split("_")
            return first + "".join(w.title() for w in rest)

        return cls(layers=[LayerUsage._from_json(u) for u in m.get("layers") or []],
                   **{n: _wire.to_int(m.get(camel(n))) for n in names})


@dataclasses.dataclass
class KeptLayer:
    """An unreferenced layer garbage_collect kept, and why."""

    layer: Layer
    reason: str = ""


@dataclasses.dataclass
class GCResult:
    """What garbage_collect removed (or, dry, would remove), the
    unreferenced layers it kept, and the orphan blobs (stored bytes no
    layer names, left by a failed upload) it removed."""

    removed: List[Layer] = dataclasses.field(default_factory=list)
    removed_bytes: int = 0
    kept: List[KeptLayer] = dataclasses.field(default_factory=list)
    orphan_blobs: List[Layer] = dataclasses.field(default_factory=list)

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "GCResult":
        return cls(removed=[_layer_from_json(x) for x in m.get("removed") or []],
                   removed_bytes=_wire.to_int(m.get("removedBytes")),
                   kept=[KeptLayer(_layer_from_json(k.get("layer") or {}), k.get("reason", ""))
                         for k in m.get("kept") or []],
                   orphan_blobs=[_layer_from_json(x) for x in m.get("orphanBlobs") or []])

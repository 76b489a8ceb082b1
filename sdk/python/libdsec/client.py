"""The asyncio client: DSecClient and DSecContainerRunArgs."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import __version__, _wire, errors
from ._transport import NoRetry, ServerStream, Transport, _forked_leftovers
from .config import Config, load_config
from .network import Network, NetworkResult, network_request, results_of
from .rollout import Rollout, _spec
from .sandbox import Sandbox, Source, _chunks, check_idle_action, pause_call, pause_results_of
from .types import BatchResult, Event, Image, ImageConfig, Key, Layer, PauseResult
from .types import DiskUsage, GCResult, ImageDetails, LayerUsage, Project

__all__ = ["DSecClient", "DSecContainerRunArgs", "WatchStream", "parse_size", "MAX_BATCH"]

_SVC = "dsec.sandbox.v1.SandboxService/"
_IMG = "dsec.image.v1.ImageService/"
_ADM = "dsec.admin.v1.AdminService/"
_RO = "dsec.rollout.v1.RolloutService/"

MIB = 1 << 20

# The most sandboxes one batch create makes.
MAX_BATCH = 1000

_EVENTS = {1: "created", 2: "exited", 3: "oom", 4: "ttl_expired", 5: "failed", 6: "deleted", 7: "updated",
           8: "paused", 9: "resumed"}

_DEFAULT = object()

Selector = Union[Mapping[str, str], Iterable[str], str, None]


@dataclasses.dataclass
class DSecContainerRunArgs:
    """What :meth:`DSecClient.run_container` creates. Only container_image
    is required; zero values take the server's defaults (CONTRACT.md).

    Attributes:
        container_image: image or environment, NAME[:TAG].
        memory_limit_mb: memory limit in MiB (default 512).
        cpu_cores_limit: CPU cap in cores, may be fractional (default 1).
        ttl_running_stop: hard TTL in seconds: the sandbox is deleted this
            long after creation (default 3600).
        network_rules: network access by intent, e.g. {"pypi": True,
            "npm": False}: targets (normally catalogue services) allowed
            when True and denied when False (docs/network.md); {} or None
            is no network (loopback only).
        network: instead of network_rules, the CLI's --network syntax
            ("allow=pypi,github,deny=npm", "open", "policy=FILE.json") or a
            policy document ({"rules": [{"action": "allow", "service":
            "pypi"}]}).
        init_user: default user of commands: name, uid or uid:gid (default
            root).
        env: environment variables of every command, on top of the image's.
        cwd: default working directory of commands (default the image's,
            else /).
        labels: labels (k=v) to select the sandbox by.
        ttl_idle_stop: idle TTL in seconds: deleted after this long without
            use (default 900), or paused with idle_action "pause".
        paused_ttl: seconds the sandbox may stay paused before it is
            deleted (default 86400); paused time counts against neither
            TTL.
        idle_action: what the idle TTL does: "delete" (the default) or
            "pause" (the next request resumes it).
        disk_limit_mb: size of the writable layer in MiB (default 10240).
        pids_limit: most processes and threads (default 4096).
        backend: isolation backend (default "container").
        idempotency_key: a retry with the same key and arguments returns the
            same sandbox (kept 24 h per API key); with it, a create that
            failed as Unavailable is retried too.
    """

    container_image: str
    memory_limit_mb: int = 0
    cpu_cores_limit: float = 0
    ttl_running_stop: float = 0
    network_rules: Optional[Mapping[str, bool]] = None
    init_user: str = ""
    env: Optional[Mapping[str, str]] = None
    cwd: str = ""
    labels: Optional[Mapping[str, str]] = None
    ttl_idle_stop: float = 0
    disk_limit_mb: int = 0
    pids_limit: int = 0
    backend: str = ""
    idempotency_key: str = ""
    network: Network = None
    paused_ttl: float = 0
    idle_action: str = ""

    def _request(self) -> Dict[str, Any]:
        """The create request for these arguments."""
        return create_request(
            self.container_image, labels=self.labels, env=self.env,
            memory=_mib(self.memory_limit_mb, "memory_limit_mb"), cpus=self.cpu_cores_limit,
            pids=self.pids_limit, disk=_mib(self.disk_limit_mb, "disk_limit_mb"), workdir=self.cwd,
            user=self.init_user, ttl=self.ttl_running_stop or None, idle_ttl=self.ttl_idle_stop or None,
            backend=self.backend, idempotency_key=self.idempotency_key,
            network_rules=self.network_rules, network=self.network,
            paused_ttl=self.paused_ttl or None, idle_action=self.idle_action or None)


def _mib(v: Union[int, float], what: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise errors.InvalidArgumentError("%s must be a number of MiB >= 0, not %r" % (what, v))
    return int(v * MIB)


_SIZE = re.compile(r"^([0-9]+)(?:\.([0-9]+))?([KMGT]?)(I?B?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(s: Union[str, int]) -> int:
    """Parse a size in bytes as the CLI and the API take it: a number and an
    optional unit K, M, G or T, all powers of 1024 ("512M" is 512 MiB),
    case-insensitive and optionally followed by "i", "iB" or "B". Ints are
    bytes."""
    if isinstance(s, bool):
        raise errors.InvalidArgumentError("size %r is not a size" % (s,))
    if isinstance(s, int):
        if s < 0:
            raise errors.InvalidArgumentError("size %d is negative" % s)
        return s
    if not isinstance(s, str):
        raise errors.InvalidArgumentError("size %r: want bytes (int) or a string such as \"512M\"" % (s,))
    m = _SIZE.match(s.strip().upper()[:64])
    if m is None or (m.group(3) == "" and m.group(4) not in ("", "B")):
        raise errors.InvalidArgumentError(
            "size %r: want a number and an optional unit K, M, G or T, powers of 1024, such as \"512M\" or "
            "\"1.5G\"" % s)
    whole, frac, unit = m.group(1), m.group(2), m.group(3)
    mult = _UNITS[unit]
    if frac and mult == 1:
        raise errors.InvalidArgumentError("size %r is a fraction of a byte" % s)
    value = int(whole) * mult
    if frac:
        value += int(frac) * mult // (10 ** len(frac))
    if value >= 1 << 63:
        raise errors.InvalidArgumentError("size %r is too large" % s)
    return value


def create_request(image: str, *, labels: Optional[Mapping[str, str]] = None,
                   env: Optional[Mapping[str, str]] = None, memory: Union[int, str, None] = None,
                   cpus: Optional[float] = None, pids: Optional[int] = None, disk: Union[int, str, None] = None,
                   workdir: Optional[str] = None, user: Optional[str] = None,
                   ttl: Optional[_wire.Seconds] = None, idle_ttl: Optional[_wire.Seconds] = None,
                   backend: Optional[str] = None, idempotency_key: Optional[str] = None,
                   layers: Optional[Iterable[str]] = None,
                   layer_config: Optional[ImageConfig] = None,
                   network_rules: Optional[Mapping[str, bool]] = None,
                   network: Network = None, paused_ttl: Optional[_wire.Seconds] = None,
                   idle_action: Optional[str] = None) -> Dict[str, Any]:
    layer_list = _wire.string_list(layers or (), "layers")
    if layer_list and image:
        raise errors.InvalidArgumentError("create: give an image or a list of layers, not both")
    if not layer_list and (not image or not isinstance(image, str)):
        raise errors.InvalidArgumentError("create: no image given (example: busybox or debian:12)")
    res: Dict[str, Any] = {}
    if memory:
        res["memoryBytes"] = str(parse_size(memory))
    if cpus:
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus < 0:
            raise errors.InvalidArgumentError("cpus must be a number of cores > 0, not %r" % (cpus,))
        res["cpus"] = float(cpus)
    if pids:
        res["pids"] = str(int(pids))
    if disk:
        res["diskBytes"] = str(parse_size(disk))
    msg: Dict[str, Any] = {"resources": res}
    if layer_list:
        msg["layers"] = layer_list
        if layer_config is not None:
            msg["layerConfig"] = {"env": list(layer_config.env), "workdir": layer_config.workdir,
                                  "user": layer_config.user}
    else:
        msg["image"] = image
    if labels:
        msg["labels"] = _wire.string_map(labels, "labels")
    if env:
        msg["env"] = _wire.string_map(env, "env")
    if workdir:
        msg["workdir"] = workdir
    if user:
        msg["user"] = str(user)
    for key, val, what in (("ttl", ttl, "ttl"), ("idleTtl", idle_ttl, "idle_ttl"),
                           ("pausedTtl", paused_ttl, "paused_ttl")):
        secs = _wire.seconds_of(val, what)
        if secs is not None:
            if secs <= 0:
                raise errors.InvalidArgumentError("%s must be positive, not %g" % (what, secs))
            msg[key] = _wire.duration(secs)
    action = check_idle_action(idle_action)
    if action is not None:
        msg["idleAction"] = action
    if backend:
        msg["backend"] = backend
    if idempotency_key:
        msg["idempotencyKey"] = idempotency_key
    net = network_request(network_rules, network)
    if net is not None:
        msg["network"] = net
    return msg


def selector_of(sel: Selector) -> Dict[str, str]:
    """Accept a label selector as a mapping, a "k=v" string or an iterable
    of them."""
    if sel is None:
        return {}
    if isinstance(sel, Mapping):
        return _wire.string_map(sel, "selector")
    if isinstance(sel, str):
        sel = [sel]
    out: Dict[str, str] = {}
    for item in sel:
        if not isinstance(item, str) or "=" not in item:
            raise errors.InvalidArgumentError("label selector %r: want k=v" % (item,))
        k, _, v = item.partition("=")
        out[k] = v
    return out


class DSecClient:
    """An asyncio client of one dsec API server.

    The server and key are found as every dsec client does: the arguments,
    then DSEC_ADDR / DSEC_API_KEY, then ~/.config/dsec/config.toml, then the
    admin key in the state dir (see :mod:`libdsec.config`). Share one client
    per process and event loop: it keeps HTTP/1.1 connections alive in a
    pool.

    Use it as ``async with DSecClient() as client:``, or call ``await
    client.open()`` and ``await client.close()``. Calls made before open()
    open the client without its check.

    Args:
        addr: the API's URL (default DSEC_ADDR, the config file, or
            http://127.0.0.1:7420).
        api_key: the API key (default DSEC_API_KEY, the config file, or
            <state_dir>/admin.key).
        state_dir: where to look for admin.key (default DSEC_STATE_DIR or
            /var/lib/dsec).
        timeout: default seconds for calls that answer at once (create takes
            its own, 120 s by default; commands and streams have none).
        max_concurrency: the most calls and open streams at a time (None:
            no limit); more wait their turn. Each open stream (a running
            Process, a watch) holds a place until it ends.
        max_retries: how often calls that are safe to repeat are retried
            after ResourceExhausted (waiting the server's hint) or
            Unavailable (backing off from 0.25 s); never after other
            errors, InvalidArgument above all. A wait that would end after
            the call's timeout is not started: the server's last error is
            raised at once. Each retry is logged at DEBUG on the "libdsec"
            logger (attempt, wait, the server's message).
        stream_idle_timeout: seconds without a byte on a stream (the server
            sends keepalives every 10 s) after which it is taken for dead.
        max_idle_connections: idle connections kept for reuse.
        connect_timeout: seconds to connect.
        user_agent: put before this library's User-Agent.
    """

    def __init__(self, addr: Optional[str] = None, api_key: Optional[str] = None, *,
                 state_dir: Optional[str] = None, timeout: Optional[float] = 60.0,
                 max_concurrency: Optional[int] = None, max_retries: int = 3,
                 stream_idle_timeout: Optional[float] = 60.0, max_idle_connections: int = 32,
                 connect_timeout: float = 10.0, user_agent: Optional[str] = None) -> None:
        self.config: Config = load_config(addr, api_key, state_dir)
        if max_concurrency is not None and max_concurrency < 1:
            raise errors.InvalidArgumentError("max_concurrency must be >= 1 or None, not %r" % (max_concurrency,))
        if max_retries < 0:
            raise errors.InvalidArgumentError("max_retries must be >= 0")
        if user_agent and ("\r" in user_agent or "\n" in user_agent):
            raise errors.InvalidArgumentError("the user agent %r contains a line break" % user_agent)
        self.timeout = timeout
        ua = "libdsec-python/" + __version__
        self._opts = dict(max_concurrency=max_concurrency, max_retries=max_retries,
                          max_idle=max_idle_connections, connect_timeout=connect_timeout,
                          stream_idle_timeout=stream_idle_timeout)
        self._ua = user_agent + " " + ua if user_agent else ua
        self._t: Optional[Transport] = None
        self._closed = False

    @property
    def addr(self) -> str:
        """The URL of the API this client calls."""
        return self.config.addr

    def __repr__(self) -> str:
        return "DSecClient(addr=%r)" % self.addr

    def _transport(self) -> Transport:
        if self._closed:
            raise errors.FailedPreconditionError("the client is closed: make a new DSecClient")
        if self._t is not None and self._t.stale:
            # A fork() child: the parent's connections are not ours (see
            # Transport.close); or their loop is gone. Connect anew.
            if self._t.forked:
                _forked_leftovers.append(self._t)
            self._t = None
        if self._t is None:
            self._t = Transport(self.config.addr, self.config.api_key, self.config.key_hint, self._ua,
                                **self._opts)  # type: ignore[arg-type]
        return self._t

    def _call_timeout(self, timeout: Any) -> Optional[float]:
        if timeout is None or timeout is _DEFAULT:
            return self.timeout
        return float(timeout)

    @property
    def transport_stats(self) -> Dict[str, int]:
        """Counters of the connection pool: {"connections": opened so far}."""
        return {"connections": self._t.connections_made if self._t else 0}

    async def open(self) -> "DSecClient":
        """Check that the server answers and accepts the key (one WhoAmI
        call); return the client. A missing server raises UnavailableError
        saying how to start one, a bad key UnauthenticatedError."""
        await self.whoami()
        return self

    async def close(self) -> None:
        """Close the idle connections; later calls fail. Streams still open
        close their own. Idempotent."""
        self._closed = True
        t, self._t = self._t, None
        if t is not None:
            await t.close()

    async def __aenter__(self) -> "DSecClient":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- sandboxes --------------------------------------------------------

    async def run_container(self, args: DSecContainerRunArgs, timeout: Optional[float] = 120) -> Sandbox:
        """Create a sandbox as args say and return it once it runs.

        timeout bounds the whole call in seconds, including the retries
        after ResourceExhausted (the platform is full: the call waits the
        server's retry hint and tries again).
        """
        if not isinstance(args, DSecContainerRunArgs):
            raise errors.InvalidArgumentError("run_container takes DSecContainerRunArgs, not %s"
                                              % type(args).__name__)
        return await self._create(args._request(), timeout)

    async def create(self, image: str = "", *, labels: Optional[Mapping[str, str]] = None,
                     env: Optional[Mapping[str, str]] = None, memory: Union[int, str, None] = None,
                     cpus: Optional[float] = None, pids: Optional[int] = None, disk: Union[int, str, None] = None,
                     workdir: Optional[str] = None, user: Optional[str] = None,
                     ttl: Optional[_wire.Seconds] = None, idle_ttl: Optional[_wire.Seconds] = None,
                     backend: Optional[str] = None, idempotency_key: Optional[str] = None,
                     layers: Optional[Iterable[str]] = None, layer_config: Optional[ImageConfig] = None,
                     network_rules: Optional[Mapping[str, bool]] = None, network: Network = None,
                     paused_ttl: Optional[_wire.Seconds] = None, idle_action: Optional[str] = None,
                     timeout: Optional[float] = 120) -> Sandbox:
        """Create a sandbox from image and return it once it runs; the
        Go-style form of :meth:`run_container`.

        Args:
            memory, disk: bytes, or sizes such as "512M" and "2G".
            cpus: CPU cap in cores.
            ttl, idle_ttl, paused_ttl: seconds or timedelta.
            idle_action: "delete" (the default) or "pause".
            layers: instead of image, an explicit environment: layer digests
                ("sha256:<hex>"), lowest first, each a registered layer, run
                with layer_config (an :class:`ImageConfig`; its env, workdir
                and user are used).
            The rest: see :class:`DSecContainerRunArgs`.
        """
        return await self._create(create_request(
            image, labels=labels, env=env, memory=memory, cpus=cpus, pids=pids, disk=disk, workdir=workdir,
            user=user, ttl=ttl, idle_ttl=idle_ttl, backend=backend, idempotency_key=idempotency_key,
            layers=layers, layer_config=layer_config, network_rules=network_rules, network=network,
            paused_ttl=paused_ttl, idle_action=idle_action), timeout)

    async def _create(self, req: Dict[str, Any], timeout: Optional[float]) -> Sandbox:
        t = self._transport()
        # A refusal (ResourceExhausted) created nothing, so it is always
        # retried; Unavailable only with an idempotency key.
        keyed = bool(req.get("idempotencyKey"))
        resp = await t.call(lambda remaining: self._create_once(t, req, remaining, keyed),
                            timeout=timeout, safe=True, what="create")
        return Sandbox._from_json(self, resp.get("sandbox") or {})

    async def _create_once(self, t: Transport, req: Dict[str, Any], remaining: Optional[float],
                           keyed: bool) -> Dict[str, Any]:
        try:
            return await t.unary(_SVC + "Create", req, timeout=remaining, safe=False)
        except errors.UnavailableError as e:
            if keyed:
                raise
            raise NoRetry(e) from None

    async def batch_create(self, args: DSecContainerRunArgs, count: int,
                           timeout: Optional[float] = 300) -> List[BatchResult]:
        """Create count sandboxes (1 to 1000) from one template in one call;
        return a result per item in index order. Items fail on their own
        (BatchResult.error); the call raises only for the call as a whole.
        With args.idempotency_key K, item i is keyed K/i."""
        if not isinstance(args, DSecContainerRunArgs):
            raise errors.InvalidArgumentError("batch_create takes DSecContainerRunArgs, not %s"
                                              % type(args).__name__)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_BATCH:
            raise errors.InvalidArgumentError("batch create: count %r is out of range: create 1 to %d sandboxes "
                                              "per call" % (count, MAX_BATCH))
        tmpl = args._request()
        t = self._transport()
        resp = await t.unary(_SVC + "BatchCreate", {"template": tmpl, "count": count},
                             timeout=self._call_timeout(timeout), safe=bool(tmpl.get("idempotencyKey")))
        out: List[BatchResult] = []
        for r in resp.get("results") or []:
            res = BatchResult(index=_wire.to_int(r.get("index")))
            if r.get("error"):
                e = r["error"]
                ra = _wire.parse_duration(e.get("retryAfter")) or None
                res.error = errors.error_from_code(e.get("code", ""), e.get("message", ""), ra)
            elif r.get("sandbox"):
                res.sandbox = Sandbox._from_json(self, r["sandbox"])
            else:
                res.error = errors.InternalError("batch create: the server sent neither a sandbox nor an error "
                                                 "for item %d" % res.index)
            out.append(res)
        if len(out) != count:
            raise errors.InternalError("batch create: the server answered %d of %d items (made: %s)"
                                       % (len(out), count, [r.sandbox.id for r in out if r.sandbox]))
        return out

    async def get(self, id: str, *, timeout: Optional[float] = None) -> Sandbox:
        """Return the sandbox with the given ID (NotFoundError if none)."""
        if not id:
            raise errors.InvalidArgumentError("get: empty sandbox ID")
        resp = await self._transport().unary(_SVC + "Get", {"id": id}, timeout=self._call_timeout(timeout),
                                             safe=True)
        return Sandbox._from_json(self, resp.get("sandbox") or {})

    def sandbox(self, id: str) -> Sandbox:
        """Return a handle to the sandbox with the given ID without asking the
        server (e.g. one created by an earlier process); its other fields
        are empty until refresh()."""
        if not id:
            raise errors.InvalidArgumentError("sandbox: empty sandbox ID")
        return Sandbox(self, id)

    async def list_sandboxes(self, selector: Selector = None, *, timeout: Optional[float] = None) -> List[Sandbox]:
        """Return the sandboxes whose labels match every k=v of selector (a
        mapping, "k=v" or a list of "k=v"); None lists every sandbox the key
        may see."""
        resp = await self._transport().unary(_SVC + "List", {"selector": selector_of(selector)},
                                             timeout=self._call_timeout(timeout), safe=True)
        return [Sandbox._from_json(self, s) for s in resp.get("sandboxes") or []]

    async def delete(self, id: str, *, timeout: Optional[float] = None) -> None:
        """Stop and remove a sandbox; one already gone raises NotFoundError."""
        if not id:
            raise errors.InvalidArgumentError("delete: empty sandbox ID")
        await self._transport().unary(_SVC + "Delete", {"id": id}, timeout=self._call_timeout(timeout),
                                      safe=False)

    # --- rollouts -------------------------------------------------------------

    async def create_rollout(self, spec: Mapping[str, Any], *, idempotency_key: Optional[str] = None,
                             timeout: Optional[float] = 120) -> Rollout:
        """Make a rollout and every member, all or none, on one node, and
        return it once every member runs (:class:`Rollout`).

        spec is the API's rollout.v1.Spec as JSON (the file ``dsec rollout
        create -f`` reads): ``labels``, ``ttl``/``idleTtl``/``pausedTtl``
        (seconds or "Ns"), ``idleAction``, and ``members``, each
        ``{"name", "role", "sandbox": {...}}`` (:func:`libdsec.rollout.member`
        builds one from create's arguments). With idempotency_key a retry
        of the same spec returns the same rollout (kept 24 h)."""
        req: Dict[str, Any] = {"spec": _spec(spec)}
        if idempotency_key:
            req["idempotencyKey"] = idempotency_key
        t = self._transport()
        keyed = bool(idempotency_key)

        async def once(remaining: Optional[float]) -> Dict[str, Any]:
            try:
                return await t.unary(_RO + "Create", req, timeout=remaining, safe=False)
            except errors.UnavailableError as e:
                if keyed:
                    raise
                raise NoRetry(e) from None

        resp = await t.call(once, timeout=timeout, safe=True, what="create rollout")
        return Rollout._from_json(self, resp.get("rollout") or {})

    async def rollout(self, id: str, *, timeout: Optional[float] = None) -> Rollout:
        """Return the rollout with the given ID: how a trainer reconnects to
        its rollouts after a restart (NotFoundError if it is gone)."""
        if not id:
            raise errors.InvalidArgumentError("rollout: empty rollout ID (list_rollouts lists them)")
        resp = await self._transport().unary(_RO + "Get", {"id": id}, timeout=self._call_timeout(timeout), safe=True)
        return Rollout._from_json(self, resp.get("rollout") or {})

    async def list_rollouts(self, selector: Selector = None, *, timeout: Optional[float] = None) -> List[Rollout]:
        """Return the rollouts whose labels match every k=v of selector, in
        ID order."""
        resp = await self._transport().unary(_RO + "List", {"selector": selector_of(selector)},
                                             timeout=self._call_timeout(timeout), safe=True)
        return [Rollout._from_json(self, r) for r in resp.get("rollouts") or []]

    async def delete_rollout(self, id: str, *, timeout: Optional[float] = None) -> None:
        """Delete a rollout and every member."""
        if not id:
            raise errors.InvalidArgumentError("delete_rollout: empty rollout ID")
        await self._transport().unary(_RO + "Delete", {"id": id}, timeout=self._call_timeout(timeout), safe=False)

    async def delete_by_labels(self, selector: Selector, *, timeout: Optional[float] = None) -> List[str]:
        """Stop and remove every sandbox whose labels match every k=v of
        selector; return their IDs. The selector must not be empty."""
        sel = selector_of(selector)
        if not sel:
            raise errors.InvalidArgumentError("delete: empty label selector; give at least one label (example: "
                                              "{\"job\": \"run-42\"}), or delete sandboxes by ID")
        resp = await self._transport().unary(_SVC + "Delete", {"selector": sel},
                                             timeout=self._call_timeout(timeout), safe=False)
        return list(resp.get("deleted") or [])

    async def update_network_by_labels(self, selector: Selector, network: Network = None, *,
                                       network_rules: Optional[Mapping[str, bool]] = None, merge: bool = False,
                                       timeout: Optional[float] = None) -> List[NetworkResult]:
        """Replace the network policy of every sandbox whose labels match
        every k=v of selector (or with merge add the rules to each one's),
        as :meth:`Sandbox.update_network` does; one result per sandbox, in
        ID order. A bad policy raises; what fails for one sandbox is in its
        result's error."""
        sel = selector_of(selector)
        if not sel:
            raise errors.InvalidArgumentError("update network: empty label selector; give at least one label, or "
                                              "update a sandbox by ID")
        msg: Dict[str, Any] = {"selector": sel, "policy": network_request(network_rules, network) or {"mode": "none"}}
        if merge:
            msg["merge"] = True
        resp = await self._transport().unary(_SVC + "UpdateNetwork", msg, timeout=self._call_timeout(timeout),
                                             safe=not merge)
        return results_of(resp)

    async def pause(self, labels: Selector = None, *, timeout: Optional[float] = None) -> List[PauseResult]:
        """Pause every sandbox whose labels match every k=v of labels (a
        job), as :meth:`Sandbox.pause` does; one result per sandbox, in ID
        order. What fails for one sandbox is in its result's error. The
        selector must not be empty; pause one sandbox with
        ``sandbox.pause()``."""
        return await self._pause_or_resume("Pause", "pause", labels, timeout)

    async def resume(self, labels: Selector = None, *, timeout: Optional[float] = None) -> List[PauseResult]:
        """Resume every sandbox whose labels match every k=v of labels, as
        :meth:`Sandbox.resume` does; one result per sandbox, in ID order
        (ResourceExhaustedError with retry_after in the result of one the
        node has no room for)."""
        return await self._pause_or_resume("Resume", "resume", labels, timeout)

    async def _pause_or_resume(self, method: str, what: str, labels: Selector,
                               timeout: Optional[float]) -> List[PauseResult]:
        sel = selector_of(labels)
        if not sel:
            raise errors.InvalidArgumentError("%s: empty label selector; give at least one label (example: "
                                              "labels={\"job\": \"run-42\"}), or %s one sandbox with "
                                              "sandbox.%s()" % (what, what, what))
        resp = await pause_call(self._transport(), method, {"selector": sel}, self._call_timeout(timeout))
        return pause_results_of(resp)

    async def watch(self, selector: Selector = None, *, initial: bool = False) -> "WatchStream":
        """Watch the sandboxes selector selects: return once the server
        accepted the watch, as an async iterator of :class:`Event` in the
        order the server sends them. With initial, first a "created" event
        for every matching sandbox that exists. The server ending the
        stream raises UnavailableError (watch again, with initial to catch
        up). Close it with ``await w.close()`` or ``async with``."""
        stream = await self._transport().server_stream(
            _SVC + "Watch", {"selector": selector_of(selector), "initial": bool(initial)})
        return WatchStream(self, stream)

    # --- images -----------------------------------------------------------

    async def list_images(self, *, timeout: Optional[float] = None) -> List[Image]:
        """Return every image the key may run: its project's and the public
        ones (all for an admin key)."""
        resp = await self._transport().unary(_IMG + "ListImages", {}, timeout=self._call_timeout(timeout), safe=True)
        return [Image._from_json(i) for i in resp.get("images") or []]

    async def get_image(self, name: str, *, timeout: Optional[float] = None) -> Image:
        """Return the image called name (NAME[:TAG])."""
        resp = await self._transport().unary(_IMG + "GetImage", {"name": name}, timeout=self._call_timeout(timeout),
                                             safe=True)
        return Image._from_json(resp.get("image") or {})

    async def create_image(self, name: str, layer_digests: Iterable[str], config: Optional[ImageConfig] = None, *,
                           force: bool = False, public: Optional[bool] = None,
                           timeout: Optional[float] = None) -> Image:
        """Register name (NAME[:TAG]) as the given stored layers, lowest
        first, run as config says, owned by the key's project.

        Onto an existing NAME:TAG only its project (or an admin key) may
        write (PermissionDeniedError); other layers or config need
        ``force=True`` (FailedPreconditionError otherwise), the same ones
        again change nothing. ``public`` makes the image public (True) or
        private (False); None keeps an existing image's visibility and makes
        a new one private."""
        msg: Dict[str, Any] = {"name": name, "layerDigests": _wire.string_list(layer_digests, "layer_digests"),
                               "config": (config or ImageConfig())._to_json(), "force": bool(force)}
        if public is not None:
            msg["public"] = bool(public)
        resp = await self._transport().unary(_IMG + "CreateImage", msg, timeout=self._call_timeout(timeout),
                                             safe=True)
        return Image._from_json(resp.get("image") or {})

    async def upload_layer(self, source: Source, digest: str, size: int, *,
                           timeout: Optional[float] = None) -> Layer:
        """Store the EROFS layer source yields (bytes, a binary file or an
        iterable of bytes) of the given digest (sha256:<hex>) and size.
        Uploading a layer the server already has is cheap and returns it."""
        if not digest or size < 0:
            raise errors.InvalidArgumentError("upload layer: need its digest (sha256:<hex>) and a size >= 0, got "
                                              "%r and %r" % (digest, size))
        chunks = _chunks(source)

        async def messages() -> AsyncIterator[Dict[str, Any]]:
            yield {"header": {"digest": digest, "size": str(size)}}
            async for c in chunks:
                yield {"data": _wire.b64(c)}

        resp = await self._transport().client_stream(_IMG + "UploadLayer", messages(), timeout=timeout)
        lay = resp.get("layer") or {}
        return Layer(digest=lay.get("digest", ""), size=_wire.to_int(lay.get("size")),
                     media_type=lay.get("mediaType", ""))

    async def set_image_public(self, name: str, public: bool = True, *, timeout: Optional[float] = None) -> Image:
        """Make the image called name public (every project may run it) or
        private (only its own); only its project or an admin key may."""
        resp = await self._transport().unary(_IMG + "SetImagePublic", {"name": name, "public": bool(public)},
                                             timeout=self._call_timeout(timeout), safe=True)
        return Image._from_json(resp.get("image") or {})

    async def delete_image(self, name: str, *, timeout: Optional[float] = None) -> Image:
        """Remove the image called name (NAME[:TAG]) and return it as it
        was. Its layers stay until garbage_collect finds them unused. Only
        its project or an admin key may (PermissionDeniedError; NotFoundError
        for another project's private image)."""
        resp = await self._transport().unary(_IMG + "DeleteImage", {"name": name},
                                             timeout=self._call_timeout(timeout), safe=False)
        return Image._from_json(resp.get("image") or {})

    async def inspect_image(self, name: str, *, timeout: Optional[float] = None) -> ImageDetails:
        """Return the image called name with, per layer, the images that
        share it and the sandboxes that use it."""
        resp = await self._transport().unary(_IMG + "InspectImage", {"name": name},
                                             timeout=self._call_timeout(timeout), safe=True)
        return ImageDetails(image=Image._from_json(resp.get("image") or {}),
                            layers=[LayerUsage._from_json(u) for u in resp.get("layers") or []])

    async def disk_usage(self, *, timeout: Optional[float] = None) -> DiskUsage:
        """Describe the layer store: every layer, and sums of shared,
        unique, unreferenced-but-used and reclaimable layers."""
        resp = await self._transport().unary(_IMG + "DiskUsage", {}, timeout=self._call_timeout(timeout), safe=True)
        return DiskUsage._from_json(resp)

    async def garbage_collect(self, *, dry_run: bool = False, grace_seconds: Optional[float] = None,
                              timeout: Optional[float] = None) -> GCResult:
        """Remove the layers no image references and no sandbox uses
        (admin keys only). Layers created or released by an image less
        than grace_seconds ago (default: the server's, 10 minutes) are
        kept. With dry_run, report what would go and remove nothing."""
        msg: Dict[str, Any] = {"dryRun": bool(dry_run)}
        if grace_seconds is not None:
            if grace_seconds < 0:
                raise errors.InvalidArgumentError("garbage_collect: grace_seconds %r is negative" % (grace_seconds,))
            msg["graceSeconds"] = str(int(grace_seconds))
        resp = await self._transport().unary(_IMG + "GarbageCollect", msg, timeout=self._call_timeout(timeout),
                                             safe=bool(dry_run))
        return GCResult._from_json(resp)

    # --- keys -------------------------------------------------------------

    async def whoami(self, *, timeout: Optional[float] = None) -> Key:
        """Describe the key the client calls with."""
        resp = await self._transport().unary(_ADM + "WhoAmI", {}, timeout=self._call_timeout(timeout), safe=True)
        return Key._from_json(resp.get("key"))

    async def create_key(self, name: str = "", project: str = "", admin: bool = False, *,
                         expires_in: Optional[_wire.Seconds] = None,
                         timeout: Optional[float] = None) -> Tuple[str, Key]:
        """Make a new API key; return its secret (shown only this once) and
        its description. Only admin keys may call it. With ``expires_in``
        (seconds or a timedelta) the key stops working that long from now
        (UnauthenticatedError saying it expired)."""
        msg: Dict[str, Any] = {"name": name, "project": project, "admin": admin}
        if expires_in is not None:
            secs = _wire.seconds_of(expires_in, "expires_in") or 0.0
            if secs <= 0:
                raise errors.InvalidArgumentError("create_key: expires_in %r is not positive" % (expires_in,))
            msg["expiresIn"] = _wire.duration(secs)
        resp = await self._transport().unary(_ADM + "CreateKey", msg, timeout=self._call_timeout(timeout), safe=False)
        return resp.get("secret", ""), Key._from_json(resp.get("key"))

    async def list_keys(self, *, timeout: Optional[float] = None) -> List[Key]:
        """Describe every API key, by ID (never a secret). Admin keys only."""
        resp = await self._transport().unary(_ADM + "ListKeys", {}, timeout=self._call_timeout(timeout), safe=True)
        return [Key._from_json(k) for k in resp.get("keys") or []]

    async def revoke_key(self, id: str, *, timeout: Optional[float] = None) -> Key:
        """Delete the API key with this ID and return it as it was; every
        server refuses it within a second. Admin keys only."""
        resp = await self._transport().unary(_ADM + "RevokeKey", {"id": id}, timeout=self._call_timeout(timeout),
                                             safe=False)
        return Key._from_json(resp.get("key"))

    # --- projects ---------------------------------------------------------

    async def get_project(self, name: str = "", *, timeout: Optional[float] = None) -> Project:
        """Return a project's limits and usage ("" for the key's own; other
        projects need an admin key)."""
        resp = await self._transport().unary(_ADM + "GetProject", {"name": name},
                                             timeout=self._call_timeout(timeout), safe=True)
        return Project._from_json(resp.get("project"))

    async def set_project_limits(self, name: str, *, memory_bytes: Optional[int] = None,
                                 sandboxes: Optional[int] = None, max_ttl: Optional[_wire.Seconds] = None,
                                 timeout: Optional[float] = None) -> Project:
        """Change a project's limits (admin keys only); None keeps a limit,
        0 removes a memory or sandbox limit. max_ttl is seconds or a
        timedelta. Creates beyond the limits are ResourceExhaustedError, TTLs
        above max_ttl InvalidArgumentError."""
        msg: Dict[str, Any] = {"name": name}
        if memory_bytes is not None:
            msg["memoryBytes"] = str(int(memory_bytes))
        if sandboxes is not None:
            msg["sandboxes"] = str(int(sandboxes))
        if max_ttl is not None:
            msg["maxTtl"] = _wire.duration(_wire.seconds_of(max_ttl, "max_ttl") or 0.0)
        resp = await self._transport().unary(_ADM + "SetProjectLimits", msg, timeout=self._call_timeout(timeout),
                                             safe=True)
        return Project._from_json(resp.get("project"))

    async def list_projects(self, *, timeout: Optional[float] = None) -> List[Project]:
        """The projects that have keys or limits, by name (admin keys only)."""
        resp = await self._transport().unary(_ADM + "ListProjects", {}, timeout=self._call_timeout(timeout),
                                             safe=True)
        return [Project._from_json(p) for p in resp.get("projects") or []]


class WatchStream:
    """Events of a watch: ``async for event in stream``. See
    :meth:`DSecClient.watch`."""

    def __init__(self, client: DSecClient, stream: ServerStream) -> None:
        self._client = client
        self._stream: Optional[ServerStream] = stream

    def __aiter__(self) -> "WatchStream":
        return self

    async def __anext__(self) -> Event:
        while True:
            stream = self._stream
            if stream is None:
                raise StopAsyncIteration
            try:
                msg = await stream.recv()
            except BaseException:
                await self.close()
                raise
            if msg is None:
                await self.close()
                raise errors.UnavailableError("the server ended the watch stream; watch again (with initial=True "
                                              "to catch up)")
            ev = msg.get("event")
            if not isinstance(ev, dict):
                continue  # a keepalive, or a message this version does not know
            sb = Sandbox._from_json(self._client, ev["sandbox"]) if ev.get("sandbox") else None
            return Event(type=_wire.enum_name(ev.get("type"), "EVENT_TYPE_", _EVENTS), sandbox=sb,
                         reason=ev.get("reason", ""), time=_wire.parse_timestamp(ev.get("time")))

    async def close(self) -> None:
        """Stop watching. Idempotent; iteration then ends."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    async def __aenter__(self) -> "WatchStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


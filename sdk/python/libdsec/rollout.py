"""Rollouts: the sandboxes of one agent rollout, made and ended together.

A rollout groups a worker (the sandbox that runs the agent loop), the
agent's sandbox and any helpers: one ID, shared labels, one lifetime, and a
small key/value status that the worker writes and the trainer reads. A
trainer that lost its GPU job reconnects to its rollouts by ID
(``await client.rollout(id)``); their sandboxes, paused by label meanwhile,
resume on the next request. docs/rollouts.md in the repository has the
whole story; the spec is the API's ``rollout.v1.Spec`` in JSON, the same
file ``dsec rollout create -f`` reads::

    spec = {
        "labels": {"job": "ppo-7"},
        "ttl": 7200,                      # seconds, or "7200s"
        "members": [
            member("worker", "rollout/python", role="worker", network={"text": "allow=dsec-api,policy"}),
            member("agent", "busybox", memory="512M"),
        ],
    }
    ro = await client.create_rollout(spec, idempotency_key="ppo-7/3")
    ...
    ro = await client.rollout(ro.id)      # after a restart
    print(ro.status, [m.sandbox_id for m in ro.members])
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional

from . import _wire, errors

if TYPE_CHECKING:  # pragma: no cover
    from .client import DSecClient
    from .sandbox import Sandbox

__all__ = ["Rollout", "RolloutMember", "member", "ROLLOUT_LABEL", "MAX_STEP_KEY"]

_RO = "dsec.rollout.v1.RolloutService/"

# The label every member of a rollout carries, whose value is the
# rollout's ID: only the server sets it.
ROLLOUT_LABEL = "dsec.rollout"

# The longest exec step key, in bytes.
MAX_STEP_KEY = 256

_STATES = {1: "creating", 2: "running", 3: "paused", 4: "exited", 5: "failed", 6: "deleted"}


def member(name: str, image: str = "", *, role: str = "sandbox", **create: Any) -> Dict[str, Any]:
    """Return one member of a rollout's spec: its name (1-32 of [a-z0-9-],
    starting with a letter), its role ("worker" for the one that runs the
    loop, else "sandbox"), and its sandbox as :meth:`DSecClient.create`
    takes it (image, memory, cpus, labels, env, network_rules, network,
    ...). Its TTLs are the rollout's."""
    from .client import create_request

    for k in ("ttl", "idle_ttl", "idempotency_key"):
        if create.get(k) is not None:
            raise errors.InvalidArgumentError("rollout member %s: its %s is the rollout's: set it on the rollout's "
                                              "spec" % (name, k))
    return {"name": name, "role": role, "sandbox": create_request(image, **create)}


def _spec(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """The spec on the wire: durations given as seconds become "Ns"."""
    if not isinstance(spec, Mapping):
        raise errors.InvalidArgumentError("create_rollout takes the spec as a mapping (rollout.v1.Spec's JSON), "
                                          "not %s" % type(spec).__name__)
    out = dict(spec)
    for k in ("ttl", "idleTtl", "pausedTtl"):
        v = out.get(k)
        if v is not None and not isinstance(v, str):
            secs = _wire.seconds_of(v, k)
            if secs is None or secs <= 0:
                raise errors.InvalidArgumentError("rollout %s must be positive, not %r" % (k, v))
            out[k] = _wire.duration(secs)
    members = out.get("members")
    if not members:
        raise errors.InvalidArgumentError("rollout: no members: give at least one (member(\"agent\", \"busybox\"))")
    return out


@dataclasses.dataclass
class RolloutMember:
    """One member of a rollout.

    Attributes:
        name: its name in the spec.
        role: "worker" or "sandbox".
        sandbox_id: its sandbox's ID.
        state: its sandbox's state ("running", ..., "deleted" once gone).
    """

    name: str
    role: str
    sandbox_id: str
    state: str


class Rollout:
    """A rollout as the server last described it, and a handle to act on it.

    Attributes:
        id: its ID (it names its node, as a sandbox ID does).
        project, node: whose it is and where it (and every member) runs.
        labels: its labels, which every member has too.
        members: its members (:class:`RolloutMember`), in the spec's order.
        status: what its members and its owner set (:meth:`set_status`).
        created_at: when it was made.
        expires_at: when it ends (when its first member's hard TTL does).
    """

    def __init__(self, client: "DSecClient", id: str) -> None:
        self._client = client
        self.id = id
        self.project = ""
        self.node = ""
        self.labels: Dict[str, str] = {}
        self.members: List[RolloutMember] = []
        self.status: Dict[str, str] = {}
        self.created_at: Optional[datetime.datetime] = None
        self.expires_at: Optional[datetime.datetime] = None

    @classmethod
    def _from_json(cls, client: "DSecClient", m: Mapping[str, Any]) -> "Rollout":
        ro = cls(client, m.get("id", ""))
        ro._update(m)
        return ro

    def _update(self, m: Optional[Mapping[str, Any]]) -> None:
        if not m:
            return
        self.id = m.get("id", self.id)
        self.project = m.get("project", "")
        self.node = m.get("node", "")
        self.labels = dict(m.get("labels") or {})
        self.status = dict(m.get("status") or {})
        self.created_at = _wire.parse_timestamp(m.get("createdAt"))
        self.expires_at = _wire.parse_timestamp(m.get("expiresAt"))
        self.members = [RolloutMember(name=x.get("name", ""), role=x.get("role", ""),
                                      sandbox_id=x.get("sandboxId", ""),
                                      state=_wire.enum_name(x.get("state"), "STATE_", _STATES))
                        for x in m.get("members") or []]

    def __repr__(self) -> str:
        return "Rollout(id=%r, members=%r)" % (self.id, [x.name for x in self.members])

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self._client._call_timeout(timeout)

    def member(self, name: str) -> "Sandbox":
        """Return a handle to the sandbox of the member called name
        (KeyError if the rollout has none)."""
        for x in self.members:
            if x.name == name:
                return self._client.sandbox(x.sandbox_id)
        raise KeyError("rollout %s has no member %r (it has %s)" % (self.id, name, [x.name for x in self.members]))

    def worker(self) -> Optional["Sandbox"]:
        """Return a handle to the worker member's sandbox, or None."""
        for x in self.members:
            if x.role == "worker":
                return self._client.sandbox(x.sandbox_id)
        return None

    async def refresh(self, *, timeout: Optional[float] = None) -> "Rollout":
        """Read the rollout again from the server; return self."""
        resp = await self._client._transport().unary(_RO + "Get", {"id": self.id}, timeout=self._timeout(timeout),
                                                     safe=True)
        self._update(resp.get("rollout"))
        return self

    async def set_status(self, set: Optional[Mapping[str, str]] = None, remove: Iterable[str] = (), *,
                         timeout: Optional[float] = None) -> "Rollout":
        """Set the keys of set and remove those of remove in the rollout's
        status (at most 64 keys of 1-128 of [A-Za-z0-9_.:/-], values up to
        4 KiB, 64 KiB in all); return self as it now is."""
        msg: Dict[str, Any] = {"id": self.id}
        if set:
            msg["set"] = _wire.string_map(set, "status")
        rm = _wire.string_list(remove, "remove")
        if rm:
            msg["remove"] = rm
        # Setting the same keys again gives the same status: safe to retry.
        resp = await self._client._transport().unary(_RO + "SetStatus", msg, timeout=self._timeout(timeout),
                                                     safe=True)
        self._update(resp.get("rollout"))
        return self

    async def delete(self, *, timeout: Optional[float] = None) -> None:
        """Delete the rollout and every member."""
        await self._client._transport().unary(_RO + "Delete", {"id": self.id}, timeout=self._timeout(timeout),
                                              safe=False)

"""Network policies by intent (docs/network.md): what a sandbox may reach.

The default is no network (loopback only). A policy is given one of three
ways, and the server parses and validates it (a bad rule raises
InvalidArgumentError naming the rule; mode open where the operator forbids
it raises FailedPreconditionError):

- ``network_rules={"pypi": True, "npm": False}``: targets (normally service
  names of the catalogue) allowed when True and denied when False, in the
  order written; ``{}`` is no network.
- ``network="allow=pypi,github,deny=npm"``: the CLI's ``--network`` syntax
  (``none``, ``open``, ``open,deny=...``, ``policy=FILE.json``, which is
  read here).
- ``network={"mode": "rules", "rules": [{"action": "allow", "service":
  "pypi"}, ...]}``: the JSON policy document.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _wire, errors

Network = Union[str, Mapping[str, Any], None]

_RULE_KEYS = ("action", "service", "domain", "cidr", "ports", "protocol")


def network_request(network_rules: Optional[Mapping[str, bool]] = None,
                    network: Network = None) -> Optional[Dict[str, Any]]:
    """The API's NetworkPolicy message for these arguments, or None for no
    network."""
    if network_rules is not None and network is not None:
        raise errors.InvalidArgumentError("give network_rules or network, not both")
    if network_rules is not None:
        return _from_rules(network_rules)
    if network is None:
        return None
    if isinstance(network, str):
        if network.startswith("policy="):
            return _from_document(_read_policy(network[len("policy="):]))
        if network == "none":
            return None
        return {"text": network}
    if isinstance(network, Mapping):
        return _from_document(network)
    raise errors.InvalidArgumentError("network must be a --network string (\"allow=pypi,deny=npm\") or a policy "
                                      "document (a dict), not %s" % type(network).__name__)


def _from_rules(rules: Mapping[str, bool]) -> Optional[Dict[str, Any]]:
    if not isinstance(rules, Mapping):
        raise errors.InvalidArgumentError("network_rules must be a mapping of names to booleans, e.g. "
                                          "{\"pypi\": True, \"npm\": False}, not %s" % type(rules).__name__)
    parts = []
    for k, v in rules.items():
        if not isinstance(k, str) or not k or "," in k or "=" in k:
            raise errors.InvalidArgumentError("network_rules: %r is not a service, domain or CIDR "
                                              "(example: {\"pypi\": True})" % (k,))
        if not isinstance(v, bool):
            raise errors.InvalidArgumentError("network_rules[%r]: want True (allow) or False (deny), not %r" % (k, v))
        parts.append(("allow=" if v else "deny=") + k)
    if not parts:
        return None
    return {"text": ",".join(parts)}


def _read_policy(path: str) -> Mapping[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read((1 << 20) + 1)
    except OSError as e:
        raise errors.InvalidArgumentError("network policy=%s: %s" % (path, e.strerror or e)) from None
    if len(data) > 1 << 20:
        raise errors.InvalidArgumentError("network policy=%s: the file is larger than 1 MiB" % path)
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise errors.InvalidArgumentError("network policy=%s is not JSON: %s" % (path, e)) from None
    if not isinstance(doc, Mapping):
        raise errors.InvalidArgumentError("network policy=%s: want a JSON object with \"rules\"" % path)
    return doc


def _from_document(doc: Mapping[str, Any]) -> Dict[str, Any]:
    for k in doc:
        if k not in ("version", "mode", "rules"):
            raise errors.InvalidArgumentError("network policy: unknown field %r (want version, mode, rules)" % (k,))
    if doc.get("version", 1) != 1:
        raise errors.InvalidArgumentError("network policy version %r: this libdsec writes version 1"
                                          % (doc.get("version"),))
    out: Dict[str, Any] = {}
    if doc.get("mode"):
        out["mode"] = str(doc["mode"])
    rules = doc.get("rules") or []
    if not isinstance(rules, list):
        raise errors.InvalidArgumentError("network policy: rules must be a list")
    wire = []
    for i, r in enumerate(rules, 1):
        if not isinstance(r, Mapping):
            raise errors.InvalidArgumentError("network rule %d: want an object with action and a target" % i)
        for k in r:
            if k not in _RULE_KEYS:
                raise errors.InvalidArgumentError("network rule %d: unknown field %r (want %s)"
                                                  % (i, k, ", ".join(_RULE_KEYS)))
        w = {k: str(r[k]) for k in ("action", "service", "domain", "cidr", "protocol") if r.get(k) not in (None, "")}
        ports = r.get("ports") or []
        if not isinstance(ports, list):
            raise errors.InvalidArgumentError("network rule %d: ports must be a list such as [443, \"8000-8100\"]" % i)
        if ports:
            w["ports"] = [str(p) for p in ports if not isinstance(p, bool)]
            if len(w["ports"]) != len(ports):
                raise errors.InvalidArgumentError("network rule %d: a port is a number or \"LOW-HIGH\"" % i)
        wire.append(w)
    if wire:
        out["rules"] = wire
    if not out:
        out["mode"] = "none"
    return out


def policy_of(m: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """A policy the server sent, as a policy document (mode and rules)."""
    m = m or {}
    rules = []
    for r in m.get("rules") or []:
        d: Dict[str, Any] = {"action": r.get("action", "")}
        for k in ("service", "domain", "cidr"):
            if r.get(k):
                d[k] = r[k]
        if r.get("ports"):
            d["ports"] = list(r["ports"])
        if r.get("protocol"):
            d["protocol"] = r["protocol"]
        rules.append(d)
    out: Dict[str, Any] = {"mode": m.get("mode") or "none"}
    if rules:
        out["rules"] = rules
    return out


@dataclasses.dataclass
class NetworkDenial:
    """One denied connection or name lookup.

    Attributes:
        time: when.
        destination: "ADDR:PORT/tcp", "ADDR:PORT/udp" or the name looked up.
        name: the TLS SNI or HTTP Host the connection named, if any.
        reason: which rule denied it ("denied by rule 2 (deny npm)").
    """

    time: Optional[datetime.datetime] = None
    destination: str = ""
    name: str = ""
    reason: str = ""


@dataclasses.dataclass
class NetworkInfo:
    """A sandbox's network as its node enforces it.

    Attributes:
        policy: the policy document in force ({"mode": "none"} without
            network).
        address, gateway: the sandbox's own address and its router (and
            resolver); empty without network.
        bytes_out, bytes_in, connections_out, connections_active: counters.
        denied: connections and lookups refused; dns_queries, dns_denied:
            lookups.
        denials: the most recent denials, oldest first.
    """

    policy: Dict[str, Any] = dataclasses.field(default_factory=lambda: {"mode": "none"})
    address: str = ""
    gateway: str = ""
    bytes_out: int = 0
    bytes_in: int = 0
    connections_out: int = 0
    connections_active: int = 0
    denied: int = 0
    dns_queries: int = 0
    dns_denied: int = 0
    denials: List[NetworkDenial] = dataclasses.field(default_factory=list)

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "NetworkInfo":
        i = _wire.to_int
        return cls(policy=policy_of(m.get("policy")), address=m.get("address", ""), gateway=m.get("gateway", ""),
                   bytes_out=i(m.get("bytesOut")), bytes_in=i(m.get("bytesIn")),
                   connections_out=i(m.get("connectionsOut")), connections_active=i(m.get("connectionsActive")),
                   denied=i(m.get("denied")), dns_queries=i(m.get("dnsQueries")), dns_denied=i(m.get("dnsDenied")),
                   denials=[NetworkDenial(time=_wire.parse_timestamp(d.get("time")),
                                          destination=d.get("destination", ""), name=d.get("name", ""),
                                          reason=d.get("reason", "")) for d in m.get("denials") or []])


@dataclasses.dataclass
class NetworkResult:
    """The outcome of a network update of one sandbox: the policy now in
    force, or the error."""

    id: str = ""
    policy: Optional[Dict[str, Any]] = None
    error: Optional[errors.DSecError] = None


def results_of(resp: Mapping[str, Any]) -> List[NetworkResult]:
    out = []
    for r in resp.get("results") or []:
        res = NetworkResult(id=r.get("id", ""))
        if r.get("error"):
            e = r["error"]
            ra = _wire.parse_duration(e.get("retryAfter")) or None
            res.error = errors.error_from_code(e.get("code", ""), e.get("message", ""), ra)
        else:
            res.policy = policy_of(r.get("policy"))
        out.append(res)
    return out

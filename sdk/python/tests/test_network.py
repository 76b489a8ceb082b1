"""Network policies: the three forms of a policy on the wire (DSec's
network_rules, --network text, the JSON document), and update_network,
network() and update_network_by_labels against a scripted fake server,
async and sync."""

import json
import os
import tempfile
import unittest

import support  # noqa: F401  (the libdsec under test)
from support import FakeServer, unary_ok

import libdsec
from libdsec import sync
from libdsec.client import create_request
from libdsec.network import network_request

SANDBOX = {"id": "node-abc", "image": "busybox:latest", "state": "STATE_RUNNING", "resources": {},
           "network": {"mode": "rules", "rules": [{"action": "allow", "service": "pypi", "protocol": "tcp"},
                                                  {"action": "deny", "service": "npm", "protocol": "tcp"}]}}
PYPI = {"mode": "rules", "rules": [{"action": "allow", "service": "pypi", "protocol": "tcp"},
                                   {"action": "deny", "service": "npm", "protocol": "tcp"}]}


class WireTest(unittest.TestCase):
    def test_network_rules(self):
        # DSec's listing, as written: allowed and denied in the order given.
        self.assertEqual(network_request({"pypi": True, "npm": False}), {"text": "allow=pypi,deny=npm"})
        self.assertEqual(network_request({"npm": False, "pypi": True}), {"text": "deny=npm,allow=pypi"})
        self.assertIsNone(network_request({}))
        self.assertIsNone(network_request(None))
        for bad in [["pypi"], {"pypi": 1}, {"pypi": "yes"}, {"pypi,npm": True}, {"allow=npm": True}, {"": True},
                    {3: True}]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(bad)):
                network_request(bad)

    def test_network_text_and_document(self):
        self.assertEqual(network_request(network="allow=pypi,github,deny=npm"),
                         {"text": "allow=pypi,github,deny=npm"})
        self.assertIsNone(network_request(network="none"))
        doc = {"version": 1, "mode": "rules", "rules": [
            {"action": "allow", "service": "pypi"},
            {"action": "deny", "domain": "*.example.com", "ports": [443, "8000-8100"]},
            {"action": "allow", "cidr": "192.0.2.0/24", "ports": [5000], "protocol": "udp"}]}
        want = {"mode": "rules", "rules": [
            {"action": "allow", "service": "pypi"},
            {"action": "deny", "domain": "*.example.com", "ports": ["443", "8000-8100"]},
            {"action": "allow", "cidr": "192.0.2.0/24", "ports": ["5000"], "protocol": "udp"}]}
        self.assertEqual(network_request(network=doc), want)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(doc, f)
        self.addCleanup(os.unlink, f.name)
        self.assertEqual(network_request(network="policy=" + f.name), want)
        for bad in [{"rules": [{"action": "allow", "service": "pypi", "port": 443}]}, {"version": 2},
                    {"rulez": []}, {"rules": "pypi"}, {"rules": [{"action": "allow", "ports": [True]}]}, 42,
                    "policy=/nonexistent/policy.json"]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=repr(bad)):
                network_request(network=bad)
        with self.assertRaises(libdsec.InvalidArgumentError):
            network_request({"pypi": True}, "allow=pypi")

    def test_create_request(self):
        req = libdsec.DSecContainerRunArgs(container_image="busybox", network_rules={"pypi": True, "npm": False})._request()
        self.assertEqual(req["network"], {"text": "allow=pypi,deny=npm"})
        self.assertNotIn("network", libdsec.DSecContainerRunArgs(container_image="busybox", network_rules={})._request())
        self.assertEqual(create_request("busybox", network="open")["network"], {"text": "open"})


class FakeNetworkTest(unittest.IsolatedAsyncioTestCase):
    def serve(self):
        self.calls = []

        def handle(path, headers, body):
            msg = json.loads(body)
            if path.endswith("/WhoAmI"):
                return unary_ok({"key": {"id": "k1", "admin": True}})
            self.calls.append((path.rsplit("/", 1)[1], msg))
            if path.endswith("/Create"):
                return unary_ok({"sandbox": SANDBOX})
            if path.endswith("/UpdateNetwork"):
                if msg.get("selector"):
                    return unary_ok({"results": [
                        {"id": "node-a", "policy": PYPI},
                        {"id": "node-b", "error": {"code": "failed_precondition", "message": "sandbox node-b is exited"}}]})
                return unary_ok({"results": [{"id": msg["id"], "policy": PYPI}]})
            if path.endswith("/GetNetwork"):
                return unary_ok({"policy": PYPI, "address": "100.64.0.1", "gateway": "100.64.0.0",
                                 "bytesOut": "12", "connectionsOut": "3", "denied": "1",
                                 "denials": [{"time": "2026-01-02T03:04:05Z", "destination": "registry.npmjs.org",
                                              "reason": "denied by rule 2 (deny npm)"}]})
            raise AssertionError("unexpected call " + path)

        srv = FakeServer(handle)
        self.addCleanup(srv.close)
        return srv

    async def test_listing_update_and_show(self):
        srv = self.serve()
        async with libdsec.DSecClient(srv.addr, "test-key") as client:
            args = libdsec.DSecContainerRunArgs(container_image="busybox", memory_limit_mb=256, cpu_cores_limit=1,
                                                ttl_running_stop=300, network_rules={"pypi": True, "npm": False},
                                                init_user="root")
            sb = await client.run_container(args, timeout=10)
            self.assertEqual(self.calls[-1][1]["network"], {"text": "allow=pypi,deny=npm"})
            self.assertEqual(sb.network_policy, PYPI)
            pol = await sb.update_network("allow=github", merge=True)
            self.assertEqual(pol, PYPI)
            self.assertEqual(self.calls[-1], ("UpdateNetwork", {"id": "node-abc", "policy": {"text": "allow=github"},
                                                                "merge": True}))
            await sb.update_network()
            self.assertEqual(self.calls[-1][1], {"id": "node-abc", "policy": {"mode": "none"}})
            info = await sb.network()
            self.assertEqual((info.address, info.gateway, info.bytes_out, info.connections_out, info.denied),
                             ("100.64.0.1", "100.64.0.0", 12, 3, 1))
            self.assertEqual(info.policy, PYPI)
            self.assertEqual(info.denials[0].reason, "denied by rule 2 (deny npm)")
            self.assertEqual(info.denials[0].time.year, 2026)
            st = libdsec.Stats._from_json({"netBytesOut": "5", "netBytesIn": "6", "netConnectionsOut": "2",
                                           "netDenied": "1"})
            self.assertEqual((st.net_out, st.net_in, st.net_connections, st.net_denied), (5, 6, 2, 1))
            res = await client.update_network_by_labels({"stage": "solve"}, network_rules={"pypi": False})
            self.assertEqual(self.calls[-1][1], {"selector": {"stage": "solve"}, "policy": {"text": "deny=pypi"}})
            self.assertEqual([r.id for r in res], ["node-a", "node-b"])
            self.assertEqual(res[0].policy, PYPI)
            self.assertIsInstance(res[1].error, libdsec.FailedPreconditionError)
            with self.assertRaises(libdsec.InvalidArgumentError):
                await client.update_network_by_labels({}, "open")

    def test_sync(self):
        srv = self.serve()
        with sync.DSecClient(srv.addr, "test-key") as client:
            sb = client.create("busybox", network_rules={"pypi": True, "npm": False})
            self.assertEqual(self.calls[-1][1]["network"], {"text": "allow=pypi,deny=npm"})
            self.assertEqual(sb.update_network({"rules": [{"action": "allow", "service": "pypi"}]}), PYPI)
            self.assertEqual(sb.network().address, "100.64.0.1")


if __name__ == "__main__":
    unittest.main()

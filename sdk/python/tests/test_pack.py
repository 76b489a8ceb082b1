"""pack_diff and branching against a real `dsec up` (see support.py)."""

import asyncio
import unittest

import support
from support import IMAGE, LiveTestCase

import libdsec
from libdsec import sync


class PackTest(LiveTestCase):
    async def test_pack_and_branch(self):
        sb = await self.new_sandbox()
        r = await sb.run_shell("set -e; mkdir /task; echo step1 > /task/state; chown 1000:1000 /task/state; "
                               "rm /etc/hostname; mkdir -p /tmp/scratch; echo junk > /tmp/scratch/x")
        self.assertEqual(r.exit_code, 0, r.stderr)
        name = support.unique("pypack") + ":1"
        pk = await sb.pack_diff(name, scrub="/tmp/scratch")
        self.assertIsInstance(pk, libdsec.Pack)
        self.assertEqual(pk.image, name)
        self.assertTrue(pk.layer_digest.startswith("sha256:"))
        self.assertEqual(pk.layers[-1], pk.layer_digest)
        self.assertGreater(pk.layer_size, 0)
        self.assertGreater(pk.files, 0)
        self.assertGreaterEqual(pk.duration, pk.frozen)
        base = await self.client.get_image(IMAGE)
        self.assertEqual(pk.layers[:-1], [lay.digest for lay in base.layers])
        # The packed sandbox runs on.
        self.assertEqual((await sb.run_shell("cat /task/state")).stdout, "step1\n")

        want = "step1 1000\nno hostname\nno scratch\n"
        check = ("echo $(cat /task/state) $(stat -c %u /task/state); "
                 "test -e /etc/hostname && echo hostname || echo no hostname; "
                 "test -e /tmp/scratch && echo scratch || echo no scratch")
        branches = await asyncio.gather(*[self.client.create(name, labels={"job": self.job}, memory="64M")
                                          for _ in range(3)])
        outs = await asyncio.gather(*[b.run_shell(check) for b in branches])
        self.assertEqual([o.stdout for o in outs], [want] * 3)
        await asyncio.gather(*[b.run_shell("echo %d > /task/mine" % i) for i, b in enumerate(branches)])
        outs = await asyncio.gather(*[b.run_shell("cat /task/mine") for b in branches])
        self.assertEqual([o.stdout for o in outs], ["0\n", "1\n", "2\n"])

        # The same environment from its list of layers.
        from_layers = await self.client.create(layers=pk.layers, labels={"job": self.job}, memory="64M",
                                               layer_config=libdsec.ImageConfig(env=["FROM_LAYERS=1"]))
        self.assertEqual((await from_layers.run_shell(check + "; echo $FROM_LAYERS")).stdout, want + "1\n")
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.create(layers=["sha256:" + "0" * 64], labels={"job": self.job})
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.create(IMAGE, layers=pk.layers)

        with self.assertRaises(libdsec.InvalidArgumentError):
            await sb.pack_diff("bad name!")
        with self.assertRaises(libdsec.InvalidArgumentError):
            await sb.pack_diff(name, scrub=["relative"])
        await sb.stop()
        with self.assertRaises(libdsec.NotFoundError):
            await sb.pack_diff(name)


class SyncPackTest(unittest.TestCase):
    def test_pack_diff_through_the_wrapper(self):
        addr, key = support.live_settings()
        job = support.unique("syncpack")
        with sync.DSecClient(addr, key) as client:
            with client.create(IMAGE, labels={"job": job}, memory="64M") as sb:
                sb.run_shell("echo synced > /root/f")
                name = support.unique("pysyncpack") + ":1"
                pk = sb.pack_diff(name)
                self.assertIsInstance(pk, libdsec.Pack)
                self.assertEqual(pk.image, name)
            with client.create(name, labels={"job": job}, memory="64M") as branch:
                self.assertEqual(branch.run_shell("cat /root/f").stdout, "synced\n")


if __name__ == "__main__":
    unittest.main()

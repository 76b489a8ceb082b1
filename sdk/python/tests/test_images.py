"""Image housekeeping (delete, inspect, disk usage, garbage collection)
against the live server, async and through libdsec.sync."""

import hashlib
import os
import unittest

import support
from support import IMAGE, LiveTestCase

import libdsec
from libdsec import sync


class ImageHousekeepingTest(LiveTestCase):
    async def upload(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        await self.client.upload_layer(data, digest, len(data))
        return digest

    async def test_delete_inspect_df_gc(self):
        base = await self.client.get_image(IMAGE)
        extra = await self.upload(os.urandom(4096))
        name = support.unique("pyhk") + ":3"
        await self.client.create_image(name, [lay.digest for lay in base.layers] + [extra])

        details = await self.client.inspect_image(name)
        self.assertEqual(details.image.name, name)
        self.assertEqual([u.layer.digest for u in details.layers], [lay.digest for lay in base.layers] + [extra])
        self.assertEqual(details.layers[-1].images, [name])
        # The base layers are shared with IMAGE.
        self.assertIn(base.name, details.layers[0].images)

        du = await self.client.disk_usage()
        self.assertIn(extra, [u.layer.digest for u in du.layers])
        self.assertEqual(du.layer_count, len(du.layers))
        self.assertEqual(du.total_bytes, sum(u.layer.size for u in du.layers))
        self.assertEqual(du.shared_bytes + du.unique_bytes + du.unreferenced_in_use_bytes + du.reclaimable_bytes,
                         du.total_bytes)

        removed = await self.client.delete_image(name)
        self.assertEqual(removed.name, name)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get_image(name)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.delete_image(name)
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.inspect_image("Not/Valid:")

        # The default grace period keeps the just-released layer; a dry run
        # with none reports it and removes nothing.
        kept = await self.client.garbage_collect(dry_run=True)
        self.assertNotIn(extra, [lay.digest for lay in kept.removed])
        self.assertIn(extra, [k.layer.digest for k in kept.kept])
        dry = await self.client.garbage_collect(dry_run=True, grace_seconds=0)
        self.assertIn(extra, [lay.digest for lay in dry.removed])
        self.assertIn(extra, [u.layer.digest for u in (await self.client.disk_usage()).layers])
        # IMAGE's layers are referenced: never candidates.
        self.assertFalse({lay.digest for lay in base.layers} & {lay.digest for lay in dry.removed})
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.garbage_collect(grace_seconds=-1)

        done = await self.client.garbage_collect(grace_seconds=0)
        self.assertIn(extra, [lay.digest for lay in done.removed])
        self.assertGreaterEqual(done.removed_bytes, 4096)
        self.assertNotIn(extra, [u.layer.digest for u in (await self.client.disk_usage()).layers])
        # The image the other tests use still runs.
        sb = await self.client.create(IMAGE, labels={"job": self.job}, memory="32M")
        self.assertEqual((await sb.run_shell("echo ok")).stdout, "ok\n")


class SyncImageHousekeepingTest(unittest.TestCase):
    def test_sync(self):
        addr, key = support.live_settings()
        with sync.DSecClient(addr, key) as c:
            du = c.disk_usage()
            self.assertIsInstance(du, libdsec.DiskUsage)
            self.assertGreaterEqual(du.layer_count, 1)
            details = c.inspect_image(IMAGE)
            self.assertEqual(len(details.layers), len(c.get_image(IMAGE).layers))
            self.assertIsInstance(c.garbage_collect(dry_run=True), libdsec.GCResult)
            with self.assertRaises(sync.NotFoundError):
                c.delete_image(support.unique("nosuch") + ":1")


if __name__ == "__main__":
    unittest.main()

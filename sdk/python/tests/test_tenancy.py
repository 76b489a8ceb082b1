"""Projects, keys and image ownership against the live server (needs an
admin key): key expiry, list and revoke; private and public images; limits
and the maximum TTL."""

import asyncio
import datetime
import hashlib
import os
import unittest

import support
from support import LiveTestCase

import libdsec
from libdsec import sync


class TenancyTest(LiveTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        if not (await self.client.whoami()).admin:
            raise unittest.SkipTest("needs an admin key")
        self.others = []

    async def asyncTearDown(self):
        for c in self.others:
            await c.close()
        await super().asyncTearDown()

    async def project_client(self, project: str, **kwargs) -> libdsec.DSecClient:
        secret, _ = await self.client.create_key(name=project, project=project, **kwargs)
        c = libdsec.DSecClient(self.addr, secret)
        self.others.append(c)
        return c

    async def test_keys(self):
        project = support.unique("pykeys")
        secret, key = await self.client.create_key(name="ci", project=project, expires_in=1.5)
        self.assertIsNotNone(key.expires_at)
        self.assertAlmostEqual((key.expires_at - key.created_at).total_seconds(), 1.5, delta=0.01)
        listed = {k.id: k for k in await self.client.list_keys()}
        self.assertEqual(listed[key.id].project, project)
        self.assertEqual(listed[key.id].expires_at, key.expires_at)
        user = libdsec.DSecClient(self.addr, secret)
        self.others.append(user)
        self.assertEqual((await user.whoami()).id, key.id)
        with self.assertRaises(libdsec.PermissionDeniedError):
            await user.list_keys()
        await asyncio.sleep((key.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds() + 0.05)
        with self.assertRaisesRegex(libdsec.UnauthenticatedError, "expired"):
            await user.whoami()

        other = await self.project_client(project)
        me = await other.whoami()
        self.assertEqual((await self.client.revoke_key(me.id)).id, me.id)
        with self.assertRaises(libdsec.UnauthenticatedError):
            await other.whoami()
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.revoke_key(me.id)

    async def test_image_ownership(self):
        owner = await self.project_client(support.unique("pyowner"))
        intruder = await self.project_client(support.unique("pyintruder"))
        data = os.urandom(4096)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        await owner.upload_layer(data, digest, len(data))
        base = await self.client.get_image(support.IMAGE)
        layers = [lay.digest for lay in base.layers]
        name = support.unique("pyowned") + ":1"
        img = await owner.create_image(name, layers + [digest])
        self.assertFalse(img.public)
        with self.assertRaises(libdsec.NotFoundError):
            await intruder.get_image(name)
        with self.assertRaises(libdsec.PermissionDeniedError):
            await intruder.create_image(name, layers, force=True)
        # The same content again: no force needed; other content: force.
        await owner.create_image(name, layers + [digest])
        with self.assertRaises(libdsec.FailedPreconditionError):
            await owner.create_image(name, layers)
        img = await owner.set_image_public(name, True)
        self.assertTrue(img.public)
        self.assertEqual((await intruder.get_image(name)).project, img.project)
        with self.assertRaises(libdsec.PermissionDeniedError):
            await intruder.delete_image(name)
        img = await owner.create_image(name, layers, force=True, public=False)
        self.assertFalse(img.public)
        self.assertEqual(len(img.layers), len(layers))
        await owner.delete_image(name)

    async def test_limits_and_ttl(self):
        project = support.unique("pylimits")
        p = await self.client.set_project_limits(project, sandboxes=1, max_ttl=datetime.timedelta(hours=2))
        self.assertEqual((p.limits.sandboxes, p.limits.max_ttl_s), (1, 7200))
        c = await self.project_client(project)
        self.assertEqual((await c.get_project()).name, project)
        with self.assertRaisesRegex(libdsec.InvalidArgumentError, "2h"):
            await c.create(support.IMAGE, labels={"job": self.job}, memory="32M", ttl=3 * 3600)
        sb = await c.create(support.IMAGE, labels={"job": self.job}, memory="32M", ttl=3600)
        try:
            with self.assertRaisesRegex(libdsec.ResourceExhaustedError, project):
                # A refusal is retried until the call's timeout.
                await c.create(support.IMAGE, labels={"job": self.job}, memory="32M", timeout=2)
        finally:
            await sb.stop()
        names = [p.name for p in await self.client.list_projects()]
        self.assertIn(project, names)


class SyncTenancyTest(unittest.TestCase):
    def test_sync(self):
        addr, key = support.live_settings()
        with sync.DSecClient(addr, key) as c:
            if not c.whoami().admin:
                self.skipTest("needs an admin key")
            self.assertIsInstance(c.list_keys(), list)
            self.assertIsInstance(c.get_project(""), libdsec.Project)


if __name__ == "__main__":
    unittest.main()

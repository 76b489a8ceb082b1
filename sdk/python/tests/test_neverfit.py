"""Creates no node could ever run fail at once with InvalidArgumentError,
naming the limit, without a retry hint or retries (against a live server)."""

import time
import unittest

from support import IMAGE, LiveTestCase

import libdsec


class NeverFitsTest(LiveTestCase):
    async def check(self, what, **kwargs):
        start = time.monotonic()
        with self.assertRaises(libdsec.InvalidArgumentError) as cm:
            await self.client.create(IMAGE, labels={"job": self.job}, **kwargs)
        took = time.monotonic() - start
        self.assertLess(took, 1.0, "create(%s) took %.1fs: retried, or waited" % (kwargs, took))
        self.assertIsNone(cm.exception.retry_after)
        for s in what:
            self.assertIn(s, str(cm.exception))
        self.assertNotIn("/sys/fs/cgroup", str(cm.exception))

    async def test_memory_1t(self):
        await self.check(("memory 1 TiB", "--memory"), memory="1T")

    async def test_pids_1e9(self):
        await self.check(("pids 1000000000", "--pids"), pids=10**9)

    async def test_disk_10t(self):
        await self.check(("disk 10 TiB", "--disk"), disk="10T")


if __name__ == "__main__":
    unittest.main()

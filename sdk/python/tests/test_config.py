"""Where the client finds the server and its key (CONTRACT.md's order)."""

import os
import tempfile
import unittest
from unittest import mock

import support  # noqa: F401

import libdsec
from libdsec import config


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.home = os.path.join(self.tmp.name, "home")
        self.state = os.path.join(self.tmp.name, "state")
        os.makedirs(self.home)
        os.makedirs(self.state)
        env = {"HOME": self.home}
        patcher = mock.patch.dict(os.environ, env)
        patcher.start()
        self.addCleanup(patcher.stop)
        for k in ("DSEC_ADDR", "DSEC_API_KEY", "DSEC_STATE_DIR", "XDG_CONFIG_HOME"):
            os.environ.pop(k, None)

    def write_config(self, text, base=None):
        d = os.path.join(base or os.path.join(self.home, ".config"), "dsec")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.toml"), "w") as f:
            f.write(text)

    def write_admin_key(self, key):
        with open(os.path.join(self.state, "admin.key"), "w") as f:
            f.write(key + "\n")

    def test_defaults(self):
        cfg = config.load_config(state_dir=self.state)
        self.assertEqual(cfg.addr, "http://127.0.0.1:7420")
        self.assertEqual(cfg.api_key, "")

    def test_key_order(self):
        self.write_admin_key("from-admin-key")
        os.environ["DSEC_STATE_DIR"] = self.state
        self.assertEqual(config.load_config().api_key, "from-admin-key")
        self.write_config('version = 1\napi_key = "from-file"\n')
        self.assertEqual(config.load_config().api_key, "from-file")
        os.environ["DSEC_API_KEY"] = "from-env"
        self.assertEqual(config.load_config().api_key, "from-env")
        self.assertEqual(config.load_config(api_key="from-arg").api_key, "from-arg")

    def test_state_dir_order(self):
        other = os.path.join(self.tmp.name, "other")
        os.makedirs(other)
        with open(os.path.join(other, "admin.key"), "w") as f:
            f.write("other-key")
        self.write_admin_key("state-key")
        os.environ["DSEC_STATE_DIR"] = self.state
        self.assertEqual(config.load_config().api_key, "state-key")
        self.assertEqual(config.load_config(state_dir=other).api_key, "other-key")

    def test_addr_order(self):
        self.write_config('addr = "http://10.0.0.1:7420/"\n')
        self.assertEqual(config.load_config().addr, "http://10.0.0.1:7420")
        os.environ["DSEC_ADDR"] = "http://127.0.0.2:1"
        self.assertEqual(config.load_config().addr, "http://127.0.0.2:1")
        self.assertEqual(config.load_config(addr="https://dsec.example").addr, "https://dsec.example")
        for bad in ["127.0.0.1:7420", "ftp://x", "http://", "http://x:99999", "http://x/?a=b"]:
            with self.assertRaises(libdsec.InvalidArgumentError, msg=bad) as cm:
                config.load_config(addr=bad)
            self.assertIn("http://127.0.0.1:7420", str(cm.exception))

    def test_xdg_config_home(self):
        xdg = os.path.join(self.tmp.name, "xdg")
        self.write_config('api_key = "xdg-key"\n', base=xdg)
        os.environ["XDG_CONFIG_HOME"] = xdg
        self.assertEqual(config.config_path(), os.path.join(xdg, "dsec", "config.toml"))
        self.assertEqual(config.load_config(state_dir=self.state).api_key, "xdg-key")

    def test_file_forms(self):
        text = "\n".join([
            "# dsec client settings",
            "version = 1",
            "addr = 'http://127.0.0.9:7420'  # literal string",
            'api_key = "k\\u0041y"',
            "other = [1, 2]",
            "[section]",
            'api_key = "not-top-level"',
        ])
        for parse in (config.parse_config, lambda t: config._parse_subset(t)):
            got = parse(text)
            self.assertEqual(got.get("addr"), "http://127.0.0.9:7420")
            self.assertEqual(got.get("api_key"), "kAy")

    def test_bad_files(self):
        for text, want in [("version = 2\n", "version = 2 is not supported"),
                           ('addr = "unterminated\n', "addr"),
                           ("api_key = 5\n", "api_key must be a string")]:
            self.write_config(text)
            with self.assertRaises(libdsec.InvalidArgumentError, msg=text) as cm:
                config.load_config(state_dir=self.state)
            self.assertIn(want if want != "addr" else "config.toml", str(cm.exception))

    def test_unreadable_admin_key_hint(self):
        os.makedirs(os.path.join(self.state, "admin.key"))  # a directory: cannot be read
        cfg = config.load_config(state_dir=self.state)
        self.assertEqual(cfg.api_key, "")
        self.assertIn("admin.key", cfg.key_hint)

    def test_bad_key(self):
        with self.assertRaises(libdsec.InvalidArgumentError):
            config.load_config(api_key="has space")

    def test_missing_key_fails_without_network(self):
        import asyncio

        client = libdsec.DSecClient(support.closed_port_addr(), state_dir=self.state)

        async def call():
            try:
                await client.get("x")
            finally:
                await client.close()

        with self.assertRaises(libdsec.UnauthenticatedError) as cm:
            asyncio.run(call())
        msg = str(cm.exception)
        for want in ("DSEC_API_KEY", "config.toml", "admin.key", "dsec key create"):
            self.assertIn(want, msg)


if __name__ == "__main__":
    unittest.main()

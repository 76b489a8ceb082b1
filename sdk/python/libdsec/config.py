"""Where the client finds the server and its API key, the way every dsec
client does (CONTRACT.md).

- Address: the ``addr`` argument, ``$DSEC_ADDR``, ``addr`` in the config
  file, then ``http://127.0.0.1:7420``.
- API key: the ``api_key`` argument, ``$DSEC_API_KEY``, ``api_key`` in the
  config file, then ``<state-dir>/admin.key``.
- State dir: the ``state_dir`` argument, ``$DSEC_STATE_DIR``, then
  ``/var/lib/dsec``.

The config file is ``$XDG_CONFIG_HOME/dsec/config.toml``, else
``~/.config/dsec/config.toml``::

    version = 1
    addr = "http://127.0.0.1:7420"
    api_key = "..."
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import urllib.parse
from typing import Any, Dict, Optional

from . import errors

__all__ = ["DEFAULT_ADDR", "DEFAULT_STATE_DIR", "Config", "load_config", "config_path", "parse_config"]

DEFAULT_ADDR = "http://127.0.0.1:7420"
DEFAULT_STATE_DIR = "/var/lib/dsec"

# The only version of the config file this client reads.
CONFIG_VERSION = 1


@dataclasses.dataclass
class Config:
    """How to reach and authenticate to a dsec API server.

    Attributes:
        addr: the API's URL, without a trailing slash.
        api_key: the bearer key; empty when none was found.
        state_dir: where admin.key was looked for.
        key_hint: why admin.key was there but not usable, if it was.
    """

    addr: str = DEFAULT_ADDR
    api_key: str = ""
    state_dir: str = DEFAULT_STATE_DIR
    key_hint: str = ""


def config_path() -> str:
    """Return the user config file's path, or "" when there is no home."""
    x = os.environ.get("XDG_CONFIG_HOME", "")
    if x and os.path.isabs(x):
        return os.path.join(x, "dsec", "config.toml")
    home = os.path.expanduser("~")
    if not home or home == "~":
        return ""
    return os.path.join(home, ".config", "dsec", "config.toml")


def display_config_path() -> str:
    return config_path() or "~/.config/dsec/config.toml"


def load_config(addr: Optional[str] = None, api_key: Optional[str] = None,
                state_dir: Optional[str] = None) -> Config:
    """Complete the given settings from the environment and files.

    A missing config file or admin key is not an error (calls then fail
    with UnauthenticatedError naming the places looked at); a config file
    that cannot be read or parsed, or an address that is not an http(s)
    URL, raises InvalidArgumentError.
    """
    file: Dict[str, Any] = {}
    path = config_path()
    if path:
        file = _read_config_file(path)
    cfg = Config()
    cfg.addr = normalize_addr(_first(addr, os.environ.get("DSEC_ADDR"), file.get("addr"), DEFAULT_ADDR))
    cfg.state_dir = _first(state_dir, os.environ.get("DSEC_STATE_DIR"), DEFAULT_STATE_DIR)
    cfg.api_key = _first(api_key, os.environ.get("DSEC_API_KEY"), str(file.get("api_key") or "").strip())
    if not cfg.api_key:
        cfg.api_key, cfg.key_hint = _read_admin_key(cfg.state_dir)
    check_key(cfg.api_key)
    return cfg


def _first(*vals: Optional[str]) -> str:
    for v in vals:
        if v:
            return v
    return ""


def check_key(key: str) -> None:
    for i, ch in enumerate(key):
        if ch <= " " or ch > "~":
            raise errors.InvalidArgumentError(
                "the API key contains a space, control or non-ASCII character at position %d: check where it "
                "came from (api_key, DSEC_API_KEY, the config file or admin.key)" % i)


def normalize_addr(addr: str) -> str:
    """Check that addr is an http(s) URL with a host; return it without a
    trailing slash."""
    try:
        u = urllib.parse.urlsplit(addr)
        port_ok = u.port is None or 0 < u.port < 65536
    except ValueError:
        u, port_ok = None, False
    if u is None or not port_ok or u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise errors.InvalidArgumentError(
            "API address %r is not an http:// or https:// URL (example: %s)" % (addr, DEFAULT_ADDR))
    return addr.rstrip("/")


def _read_config_file(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        if e.errno in (errno.ENOTDIR,):
            return {}
        raise errors.InvalidArgumentError("read config file: %s" % e) from None
    try:
        return parse_config(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.InvalidArgumentError("config file %s: %s" % (path, e)) from None


def parse_config(text: str) -> Dict[str, Any]:
    """Parse the config file's text; keys it does not know are ignored, a
    version it does not know is an error (ValueError).

    On Python 3.11+ the whole file is parsed with tomllib; before, the
    top-level ``key = value`` lines with string and integer values are read
    and anything else is skipped.
    """
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:
        tomllib = None
    if tomllib is not None:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError("%s (want TOML such as: version = 1, addr = %r, api_key = \"...\")"
                             % (e, DEFAULT_ADDR)) from None
    else:
        doc = _parse_subset(text)
    out: Dict[str, Any] = {}
    for key, typ in (("version", int), ("addr", str), ("api_key", str)):
        if key not in doc:
            continue
        v = doc[key]
        if not isinstance(v, typ) or isinstance(v, bool):
            raise ValueError("%s must be %s, not %r" % (key, "an integer" if typ is int else "a string", v))
        out[key] = v
    version = out.get("version", 0)
    if version not in (0, CONFIG_VERSION):
        raise ValueError("version = %d is not supported: this client reads version = %d" % (version, CONFIG_VERSION))
    return out


_KEY_LINE = re.compile(r"^\s*([A-Za-z0-9_-]+|\"[^\"]*\")\s*=\s*(.*)$")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def _parse_subset(text: str) -> Dict[str, Any]:
    """Read the top-level keys with string or integer values (what this
    client needs) from TOML text, without tomllib."""
    out: Dict[str, Any] = {}
    in_table = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            in_table = True
            continue
        m = _KEY_LINE.match(line)
        if m is None or in_table:
            continue
        key = m.group(1).strip('"')
        if key not in ("version", "addr", "api_key"):
            continue
        try:
            out[key] = _value(m.group(2))
        except ValueError as e:
            raise ValueError("line %d: %s (want TOML such as: version = 1, addr = %r, api_key = \"...\")"
                             % (lineno, e, DEFAULT_ADDR)) from None
    return out


def _value(s: str) -> Any:
    s = s.strip()
    if s.startswith('"'):
        val, rest = _basic_string(s)
    elif s.startswith("'"):
        end = s.find("'", 1)
        if end < 0:
            raise ValueError("unterminated string")
        val, rest = s[1:end], s[end + 1:]
    else:
        m = re.match(r"^([+-]?[0-9][0-9_]*)(.*)$", s)
        if m is None:
            raise ValueError("want a string or an integer, got %r" % s)
        val, rest = int(m.group(1).replace("_", "")), m.group(2)
    rest = rest.strip()
    if rest and not rest.startswith("#"):
        raise ValueError("unexpected %r after the value" % rest)
    return val


def _basic_string(s: str):
    out = []
    i = 1
    while i < len(s):
        ch = s[i]
        if ch == '"':
            return "".join(out), s[i + 1:]
        if ch == "\\":
            i += 1
            if i >= len(s):
                break
            e = s[i]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
            elif e in "uU":
                n = 4 if e == "u" else 8
                hexdigits = s[i + 1:i + 1 + n]
                if len(hexdigits) != n:
                    raise ValueError("bad \\%s escape" % e)
                out.append(chr(int(hexdigits, 16)))
                i += n
            else:
                raise ValueError("bad escape \\%s" % e)
        else:
            out.append(ch)
        i += 1
    raise ValueError("unterminated string")


def _read_admin_key(state_dir: str):
    path = os.path.join(state_dir, "admin.key")
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read().strip(), ""
    except (FileNotFoundError, NotADirectoryError):
        return "", ""
    except PermissionError:
        return "", "%s exists but this user may not read it: ask an admin for a key (`dsec key create`)" % path
    except OSError as e:
        return "", "read %s: %s" % (path, e)

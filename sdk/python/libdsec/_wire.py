"""The Connect protocol's wire forms: protojson values, streaming envelopes
and error bodies.

Messages are plain dicts in protojson form: lowerCamelCase field names,
64-bit integers as strings, bytes as base64, durations as ``"1.5s"``,
timestamps as RFC 3339 strings and enums by name.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import re
import struct
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import errors

# Envelope flags of Connect's streaming format.
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02

# The largest message this client accepts (the server sends at most 1 MiB
# of data per message).
MAX_MESSAGE = 64 << 20

Seconds = Union[int, float, datetime.timedelta]


def dumps(msg: Mapping[str, Any]) -> bytes:
    """Encode a message as compact JSON."""
    return json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes) -> Dict[str, Any]:
    """Decode a JSON message; a body that is not a JSON object is an error."""
    try:
        msg = json.loads(data.decode("utf-8")) if data else {}
    except (UnicodeDecodeError, ValueError) as e:
        raise errors.InternalError("the server sent a message that is not JSON: %s" % e) from None
    if not isinstance(msg, dict):
        raise errors.InternalError("the server sent JSON that is not an object")
    return msg


def envelope(payload: bytes, flags: int = 0) -> bytes:
    """Frame one message of a stream: flags, big-endian length, payload."""
    return struct.pack(">BI", flags, len(payload)) + payload


def parse_envelope_header(head: bytes) -> Tuple[int, int]:
    """Return the flags and length of a 5-byte envelope header."""
    flags, length = struct.unpack(">BI", head)
    if length > MAX_MESSAGE:
        raise errors.InternalError("the server sent a %d-byte message, more than this client takes (%d)"
                                   % (length, MAX_MESSAGE))
    return flags, length


def decompress(data: bytes, encoding: str) -> bytes:
    """Undo a message's compression (gzip or identity)."""
    if encoding in ("", "identity"):
        return data
    if encoding == "gzip":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise errors.InternalError("bad gzip data from the server: %s" % e) from None
    raise errors.InternalError("the server compressed with %r, which this client did not offer" % encoding)


# --- scalar values ---------------------------------------------------------


def b64(data: Union[bytes, bytearray, memoryview]) -> str:
    """Encode bytes the way protojson does."""
    return base64.b64encode(bytes(data)).decode("ascii")


def unb64(s: Optional[str]) -> bytes:
    """Decode protojson bytes: standard or URL-safe base64, padded or not."""
    if not s:
        return b""
    s = s.replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except ValueError as e:
        raise errors.InternalError("bad base64 from the server: %s" % e) from None


def to_int(v: Any) -> int:
    """Read an integer field (int64 come as strings)."""
    if v is None or v == "":
        return 0
    return int(v)


def to_float(v: Any) -> float:
    if v is None or v == "":
        return 0.0
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
        return float(v.lower().replace("infinity", "inf"))
    return float(v)


def seconds_of(v: Optional[Seconds], what: str) -> Optional[float]:
    """Return a duration given as seconds or a timedelta, in seconds."""
    if v is None:
        return None
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise errors.InvalidArgumentError("%s must be a number of seconds or a timedelta, not %r" % (what, v))
    return float(v)


def duration(seconds: float) -> str:
    """Encode a duration in seconds as protojson (``"1.5s"``)."""
    nanos = int(round(seconds * 1e9))
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    whole, frac = divmod(nanos, 1_000_000_000)
    if frac == 0:
        return "%s%ds" % (sign, whole)
    return ("%s%d.%09d" % (sign, whole, frac)).rstrip("0") + "s"


def parse_duration(v: Any) -> float:
    """Decode a protojson duration to seconds; unset is 0."""
    if not v:
        return 0.0
    if isinstance(v, (int, float)):
        return float(v)
    if not isinstance(v, str) or not v.endswith("s"):
        raise errors.InternalError("bad duration from the server: %r" % (v,))
    return float(v[:-1])


_TIMESTAMP = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))$")


def parse_timestamp(v: Any) -> Optional[datetime.datetime]:
    """Decode an RFC 3339 timestamp to an aware datetime (microseconds);
    unset is None."""
    if not v:
        return None
    m = _TIMESTAMP.match(v) if isinstance(v, str) else None
    if m is None:
        raise errors.InternalError("bad timestamp from the server: %r" % (v,))
    year, month, day, hour, minute, sec = (int(x) for x in m.group(1, 2, 3, 4, 5, 6))
    micro = int((m.group(7) or "0").ljust(9, "0")[:6])
    if m.group(8):
        tz = datetime.timezone.utc
    else:
        off = datetime.timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = datetime.timezone(off if m.group(9) == "+" else -off)
    return datetime.datetime(year, month, day, hour, minute, sec, micro, tzinfo=tz)


def enum_name(v: Any, prefix: str, names: Mapping[int, str]) -> str:
    """Return an enum's short name: ``"STATE_RUNNING"`` (or 2) with prefix
    ``"STATE_"`` is ``"running"``; unset or unknown values are
    ``"unknown"``."""
    if isinstance(v, int):
        return names.get(v, "unknown")
    if isinstance(v, str) and v.startswith(prefix):
        name = v[len(prefix):].lower()
        if name in names.values():
            return name
    return "unknown"


def string_map(m: Optional[Mapping[str, Any]], what: str) -> Dict[str, str]:
    """Check a map of strings (labels, environment) for the wire."""
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise errors.InvalidArgumentError("%s must be a mapping of strings, not %s" % (what, type(m).__name__))
    out = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise errors.InvalidArgumentError("%s must map strings to strings; %r: %r is not" % (what, k, v))
        out[k] = v
    return out


def string_list(v: Iterable[str], what: str) -> List[str]:
    out = list(v)
    for x in out:
        if not isinstance(x, str):
            raise errors.InvalidArgumentError("%s must be strings; %r is not" % (what, x))
    return out


# --- errors ----------------------------------------------------------------


def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of a protobuf message; values
    of length-delimited fields are bytes, of varints ints."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        yield num, wt, v


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def decode_retry_info(value: bytes) -> Optional[float]:
    """Decode a google.rpc.RetryInfo message (its retry_delay, a
    google.protobuf.Duration) to seconds."""
    try:
        for num, wt, v in _fields(value):
            if num == 1 and wt == 2:
                secs = nanos = 0
                for dnum, dwt, dv in _fields(v):
                    if dnum == 1 and dwt == 0:
                        secs = _signed(dv)
                    elif dnum == 2 and dwt == 0:
                        nanos = _signed(dv)
                return secs + nanos / 1e9
    except ValueError:
        return None
    return None


def retry_after_of(details: Any) -> Optional[float]:
    """Return the retry hint among an error's details, in seconds."""
    if not isinstance(details, list):
        return None
    for d in details:
        if not isinstance(d, dict) or not str(d.get("type", "")).endswith("google.rpc.RetryInfo"):
            continue
        delay = None
        if d.get("value"):
            try:
                delay = decode_retry_info(unb64(d["value"]))
            except errors.DSecError:
                delay = None
        if delay is None and isinstance(d.get("debug"), dict):
            try:
                delay = parse_duration(d["debug"].get("retryDelay"))
            except (errors.DSecError, ValueError):
                delay = None
        if delay and delay > 0:
            return delay
    return None


def error_from_json(body: Any) -> errors.DSecError:
    """Convert a Connect error object ({code, message, details}) to an
    exception."""
    if not isinstance(body, dict):
        return errors.InternalError("the server sent a malformed error")
    code = str(body.get("code") or "unknown")
    return errors.error_from_code(code, str(body.get("message") or ""), retry_after_of(body.get("details")))


# Connect's mapping of HTTP statuses to codes, for answers without a
# Connect error body (a proxy, a server that is not dsec).
_HTTP_CODES = {
    400: "internal",
    401: "unauthenticated",
    403: "permission_denied",
    404: "unimplemented",
    429: "unavailable",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def error_from_http(status: int, reason: str, body: bytes, content_type: str) -> errors.DSecError:
    """Convert a non-200 unary answer to an exception."""
    if content_type.split(";")[0].strip() == "application/json":
        try:
            obj = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            obj = None
        if isinstance(obj, dict) and "code" in obj:
            return error_from_json(obj)
    code = _HTTP_CODES.get(status, "unknown")
    text = body[:200].decode("utf-8", "replace").strip()
    msg = "HTTP %d %s from the server" % (status, reason)
    if text:
        msg += ": " + text
    if status == 404:
        msg += " (is this address a dsec API server? check DSEC_ADDR)"
    return errors.error_from_code(code, msg)

"""Connect calls over the HTTP/1.1 pool: unary, server-streaming and
client-streaming, with deadlines, retries and the concurrency limit.

Unary: POST /<package>.<Service>/<Method>, ``Content-Type:
application/json``, the message as protojson; errors are a JSON object
``{code, message, details}`` with a non-200 status.

Streams: ``Content-Type: application/connect+json``; both bodies are
sequences of envelopes (1 byte of flags, 4 bytes of big-endian length, the
JSON message). The answer ends with an end-of-stream envelope (flag 0x02)
holding ``{"error": …, "metadata": …}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import urllib.parse
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, Union

from . import _wire, errors
from ._http import ConnectionFailed, Pool, Response

T = TypeVar("T")

# Each retry is logged here at DEBUG: the attempt, the wait and the server's
# message (logging.getLogger("libdsec").setLevel(logging.DEBUG) shows them).
_log = logging.getLogger("libdsec")

_MAX_UNARY = 64 << 20

# Give a call's server-side deadline (Connect-Timeout-Ms) a head start on the
# client's, so that the server's error (with its message) comes first.
_GRACE = 0.5


class NoRetry(Exception):
    """Raised by an attempt to stop retries after it made progress (data
    already handed to the caller); wraps the real error."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


# What a forked child inherited (transports and streams of the parent's
# connections): kept referenced, never closed there. The sockets, and the
# epoll instance of the loop they are registered with, are shared with the
# parent: closing them in the child would unregister the parent's sockets
# (its calls would hang) or interleave bytes on them.
_forked_leftovers: List[Any] = []


class Transport:
    """Calls one dsec API server. Not thread-safe: use it from one event
    loop, in the process that made it (see DSecClient._transport for what
    a forked child does)."""

    def __init__(self, addr: str, api_key: str, key_hint: str, user_agent: str, *,
                 max_concurrency: Optional[int], max_retries: int, max_idle: int,
                 connect_timeout: float, stream_idle_timeout: Optional[float]) -> None:
        u = urllib.parse.urlsplit(addr)
        tls: Optional[ssl.SSLContext] = None
        if u.scheme == "https":
            tls = ssl.create_default_context()
        self.addr = addr
        self._base = u.path.rstrip("/")
        self._key = api_key
        self._key_hint = key_hint
        self._ua = user_agent
        self._gzip = tls is not None
        self._pool = Pool(u.hostname or "", u.port or (443 if tls else 80), tls,
                          max_idle=max_idle, connect_timeout=connect_timeout)
        self._max_concurrency = max_concurrency
        self._sem: Optional[asyncio.Semaphore] = None
        self.max_retries = max_retries
        self.stream_idle_timeout = stream_idle_timeout
        self.closed = False
        self.pid = os.getpid()
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def forked(self) -> bool:
        """Whether this process is a fork() child of the one that made it."""
        return self.pid != os.getpid()

    @property
    def stale(self) -> bool:
        """Whether the connections cannot serve this process's calls: it is a
        fork() child, or the loop they were made in is closed (a second
        asyncio.run, as a pool worker does for each task)."""
        return self.forked or (self._loop is not None and self._loop.is_closed())

    @property
    def connections_made(self) -> int:
        """How many TCP connections were opened (for tests of reuse)."""
        return self._pool.connections_made

    async def close(self) -> None:
        self.closed = True
        if self.forked:
            _forked_leftovers.append(self)
            return
        await self._pool.close()

    # --- plumbing ---------------------------------------------------------

    def _check(self) -> None:
        if self.closed:
            raise errors.FailedPreconditionError("the client is closed: make a new DSecClient")
        if not self._key:
            raise errors.UnauthenticatedError(missing_key_message(self._key_hint))

    async def _slot(self) -> None:
        if self._max_concurrency is None:
            return
        if self._sem is None:
            # Made here, in the loop, for Python 3.9's loop-bound primitives.
            self._sem = asyncio.Semaphore(self._max_concurrency)
        await self._sem.acquire()

    def _unslot(self) -> None:
        if self._sem is not None:
            self._sem.release()

    def _headers(self, content_type: str, timeout: Optional[float], streaming: bool) -> List[Tuple[str, str]]:
        h = [
            ("Content-Type", content_type),
            ("Authorization", "Bearer " + self._key),
            ("User-Agent", self._ua),
            ("Connect-Protocol-Version", "1"),
        ]
        accept = "gzip" if self._gzip else "identity"
        h.append(("Connect-Accept-Encoding" if streaming else "Accept-Encoding", accept))
        if timeout is not None:
            h.append(("Connect-Timeout-Ms", str(max(1, int(timeout * 1000)))))
        return h

    def connection_error(self, e: ConnectionFailed) -> errors.UnavailableError:
        """Say what to do about a failed connection."""
        if e.refused:
            msg = ("no dsec server at %s: start it with `dsec up -d` (or set DSEC_ADDR to the server's URL)"
                   % self.addr)
        elif e.unresolved:
            msg = "cannot reach the dsec API at %s: %s (check DSEC_ADDR)" % (self.addr, e)
        elif e.answered:
            msg = "lost the connection to the dsec API at %s: %s" % (self.addr, e)
        else:
            msg = ("cannot reach the dsec API at %s: %s (is the server running? `dsec up -d` starts one; "
                   "DSEC_ADDR selects another)" % (self.addr, e))
        return errors.UnavailableError(msg)

    async def _post(self, method: str, content_type: str, body: Any, timeout: Optional[float],
                    streaming: bool, replayable: bool = False) -> Response:
        try:
            return await self._pool.request("POST", self._base + "/" + method,
                                            self._headers(content_type, timeout, streaming), body,
                                            replayable=replayable)
        except ConnectionFailed as e:
            raise self.connection_error(e) from None

    # --- retries ----------------------------------------------------------

    def _retry_delay(self, err: errors.DSecError, attempt: int, deadline: Optional[float]) -> Optional[float]:
        if attempt >= self.max_retries:
            return None
        if isinstance(err, errors.ResourceExhaustedError):
            delay = err.retry_after * (1 + 0.2 * random.random()) if err.retry_after else _backoff(attempt)
        elif isinstance(err, errors.UnavailableError):
            delay = _backoff(attempt)
        else:
            return None
        if deadline is not None and _now() + delay >= deadline:
            return None
        return delay

    async def call(self, attempt_fn: Callable[[Optional[float]], Awaitable[T]], *, timeout: Optional[float],
                   safe: bool, what: str = "call") -> T:
        """Run attempt_fn(remaining seconds) within timeout, retrying it when
        safe and the error's kind is retryable (ResourceExhausted after its
        hint, Unavailable with backoff; never InvalidArgument). A wait that
        would end after the timeout is not started: the server's last error
        is raised at once. Each retry is logged at DEBUG."""
        self._check()
        deadline = None if timeout is None else _now() + timeout
        attempt = 0
        while True:
            remaining = None if deadline is None else deadline - _now()
            try:
                if remaining is None:
                    return await attempt_fn(None)
                try:
                    if remaining <= 0:
                        raise asyncio.TimeoutError
                    # Not rounded up: a call must not outlive its timeout.
                    return await asyncio.wait_for(attempt_fn(max(remaining - _GRACE, remaining / 2)), remaining)
                except asyncio.TimeoutError:
                    raise errors.DeadlineExceededError(
                        "deadline exceeded: no answer within the call's timeout of %gs (pass a larger timeout)"
                        % timeout) from None
            except NoRetry as e:
                raise e.err from None
            except errors.DSecError as e:
                delay = self._retry_delay(e, attempt, deadline) if safe else None
                if delay is None:
                    raise
                attempt += 1
                _log.debug("%s refused (%s); retry %d of %d in %.3fs: %s", what, type(e).__name__, attempt,
                           self.max_retries, delay, e)
                await asyncio.sleep(delay)

    # --- unary ------------------------------------------------------------

    async def unary(self, method: str, msg: Dict[str, Any], *, timeout: Optional[float],
                    safe: bool) -> Dict[str, Any]:
        """Call a unary method; method is "package.Service/Method"."""
        body = _wire.dumps(msg)

        async def attempt(remaining: Optional[float]) -> Dict[str, Any]:
            await self._slot()
            try:
                resp = await self._post(method, "application/json", body, remaining, False, replayable=safe)
                try:
                    try:
                        data = await resp.read_all(_MAX_UNARY)
                    except ConnectionFailed as e:
                        raise self.connection_error(e) from None
                    data = _wire.decompress(data, resp.headers.get("content-encoding", ""))
                    if resp.status != 200:
                        raise _wire.error_from_http(resp.status, resp.reason, data,
                                                    resp.headers.get("content-type", ""))
                    return _wire.loads(data)
                finally:
                    resp.close()
            finally:
                self._unslot()

        return await self.call(attempt, timeout=timeout, safe=safe, what=method.rsplit("/", 1)[-1])

    # --- streams ----------------------------------------------------------

    async def open_stream(self, method: str, body: Union[bytes, AsyncIterator[bytes]],
                          timeout: Optional[float]) -> "ServerStream":
        """Send a streaming request and return the answer's stream once its
        head arrived. The stream holds a concurrency slot until closed."""
        self._check()
        await self._slot()
        try:
            resp = await self._post(method, "application/connect+json", body, timeout, True)
        except BaseException:
            self._unslot()
            raise
        stream = ServerStream(self, resp)
        if resp.status != 200:
            try:
                data = await resp.read_all(1 << 20)
            except ConnectionFailed:
                data = b""
            err = _wire.error_from_http(resp.status, resp.reason, data, resp.headers.get("content-type", ""))
            stream.close()
            raise err
        return stream

    async def server_stream(self, method: str, msg: Dict[str, Any], *,
                            timeout: Optional[float] = None) -> "ServerStream":
        """Open a server-streaming call (one request message)."""
        return await self.open_stream(method, _wire.envelope(_wire.dumps(msg)), timeout)

    async def client_stream(self, method: str, messages: AsyncIterator[Dict[str, Any]], *,
                            timeout: Optional[float]) -> Dict[str, Any]:
        """Call a client-streaming method: send the messages (chunked), then
        read the one answer."""

        async def body() -> AsyncIterator[bytes]:
            async for m in messages:
                yield _wire.envelope(_wire.dumps(m))

        async def attempt(remaining: Optional[float]) -> Dict[str, Any]:
            stream = await self.open_stream(method, body(), remaining)
            try:
                answer = await stream.recv()
                if answer is None:
                    raise errors.InternalError("the server ended %s without an answer" % method)
                # Read the end of the stream: its error, if any, counts.
                while await stream.recv() is not None:
                    pass
                return answer
            finally:
                stream.close()

        return await self.call(attempt, timeout=timeout, safe=False)


class ServerStream:
    """The messages of a streaming answer. recv() returns each message as a
    dict, then None at a clean end; an error at the end is raised."""

    def __init__(self, transport: Transport, resp: Response) -> None:
        self._t = transport
        self._resp: Optional[Response] = resp
        self._buf = bytearray()
        self._encoding = resp.headers.get("connect-content-encoding", "")
        self._ended = False
        self.metadata: Dict[str, Any] = {}

    async def _fill(self, n: int) -> bool:
        resp = self._resp
        if resp is None:
            raise errors.FailedPreconditionError("the stream is closed")
        if self._t.forked:
            self.close()
            raise errors.FailedPreconditionError(
                "this stream was opened before fork(), in the parent process: open it again in the child")
        while len(self._buf) < n:
            try:
                if self._t.stream_idle_timeout is None:
                    data = await resp.read_some()
                else:
                    data = await asyncio.wait_for(resp.read_some(), self._t.stream_idle_timeout)
            except asyncio.TimeoutError:
                self.close()
                raise errors.UnavailableError(
                    "nothing from the dsec API at %s for %gs on a stream (keepalives included): the connection "
                    "is probably dead" % (self._t.addr, self._t.stream_idle_timeout)) from None
            except ConnectionFailed as e:
                self.close()
                raise self._t.connection_error(e) from None
            if not data:
                return False
            self._buf += data
        return True

    async def recv(self) -> Optional[Dict[str, Any]]:
        """Return the next message, or None once the stream ended cleanly."""
        if self._ended:
            return None
        if not await self._fill(5):
            self._ended = True
            if self._buf:
                raise errors.UnavailableError("the stream from %s broke in the middle of a message" % self._t.addr)
            raise errors.UnavailableError("the stream from %s ended without its end-of-stream message"
                                          % self._t.addr)
        flags, length = _wire.parse_envelope_header(bytes(self._buf[:5]))
        if not await self._fill(5 + length):
            self._ended = True
            raise errors.UnavailableError("the stream from %s broke in the middle of a message" % self._t.addr)
        payload = bytes(self._buf[5:5 + length])
        del self._buf[:5 + length]
        if flags & _wire.FLAG_COMPRESSED:
            payload = _wire.decompress(payload, self._encoding or "gzip")
        msg = _wire.loads(payload)
        if flags & _wire.FLAG_END_STREAM:
            self._ended = True
            md = msg.get("metadata")
            if isinstance(md, dict):
                self.metadata = md
            await self._drain()
            if msg.get("error") is not None:
                raise _wire.error_from_json(msg["error"])
            return None
        return msg

    async def _drain(self) -> None:
        """Read the end of the body so the connection can be reused."""
        resp = self._resp
        if resp is None:
            return
        try:
            while not resp.done:
                if not await asyncio.wait_for(resp.read_some(), 5):
                    break
        except (asyncio.TimeoutError, ConnectionFailed):
            pass
        self.close()

    def close(self) -> None:
        """Stop reading: the connection is closed unless the stream was read
        to its end. Idempotent."""
        resp, self._resp = self._resp, None
        if resp is not None:
            if self._t.forked:
                _forked_leftovers.append(resp)  # the parent's connection
                return
            resp.close()
            self._t._unslot()


def _now() -> float:
    return asyncio.get_running_loop().time()


def _backoff(attempt: int) -> float:
    """Exponential backoff with jitter: about 0.25s, 0.5s, 1s, … up to 5s."""
    base = min(0.25 * (2 ** attempt), 5.0)
    return base * (0.5 + random.random() / 2)


def missing_key_message(hint: str = "") -> str:
    from .config import display_config_path

    msg = ("no API key: pass one (DSecClient(api_key=...)), set DSEC_API_KEY, put api_key in %s, or run as a "
           "user who can read <state-dir>/admin.key (state dir: DSEC_STATE_DIR, default /var/lib/dsec); "
           "`dsec key create` makes a key" % display_config_path())
    if hint:
        msg += "; " + hint
    return msg


def iter_async(items: Iterable[T]) -> AsyncIterator[T]:
    """Turn an iterable into an async iterator."""

    async def gen() -> AsyncIterator[T]:
        for x in items:
            yield x

    return gen()

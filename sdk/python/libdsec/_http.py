"""A small HTTP/1.1 client over asyncio streams, with a pool of keep-alive
connections to one server.

It does what the Connect protocol needs and nothing more: POST requests
whose body is bytes (Content-Length) or an async iterator of bytes (chunked
transfer encoding, sent while the answer is read), and answers whose body is
read incrementally (Content-Length, chunked, or until the connection
closes). A connection goes back to the pool only when its exchange ended
cleanly: request sent, answer read to its end, no "Connection: close".
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import AsyncIterator, Dict, List, Optional, Tuple, Union

_MAX_HEAD = 64 << 10
_MAX_HEADERS = 100

Body = Union[bytes, AsyncIterator[bytes], None]


class ConnectionFailed(Exception):
    """The exchange failed below HTTP: no connection, or it broke.

    Attributes:
        refused: nothing listens at the address.
        unresolved: the host name does not resolve.
        reused: the connection came from the pool (it may have been closed
            by the server while idle).
        answered: some of the answer was read.
    """

    def __init__(self, message: str, *, refused: bool = False, unresolved: bool = False,
                 reused: bool = False, answered: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.unresolved = unresolved
        self.reused = reused
        self.answered = answered


class _BodyFailed(Exception):
    """The caller's request body raised err."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


class _Conn:
    __slots__ = ("reader", "writer", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    def usable(self) -> bool:
        # An idle connection the server closed has seen EOF (the loop ran
        # while it sat in the pool); one with unread bytes is out of step.
        return not self.writer.is_closing() and not self.reader.at_eof() and not _buffered(self.reader)

    def close(self) -> None:
        transport = self.writer.transport
        if transport is not None and not transport.is_closing():
            transport.abort()


def _buffered(reader: asyncio.StreamReader) -> int:
    buf = getattr(reader, "_buffer", None)
    return len(buf) if buf is not None else 0


class Response:
    """An HTTP answer whose body is read as it arrives."""

    def __init__(self, pool: "Pool", conn: _Conn, status: int, reason: str,
                 headers: Dict[str, str], keep_alive: bool) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._pool = pool
        self._conn: Optional[_Conn] = conn
        self._keep_alive = keep_alive
        self._sender: Optional["asyncio.Task[None]"] = None
        self._done = False
        self._busy = False
        te = headers.get("transfer-encoding", "").lower()
        cl = headers.get("content-length")
        if "chunked" in te:
            self._mode = "chunked"
        elif cl is not None:
            self._mode = "length"
            try:
                self._left = int(cl)
            except ValueError:
                raise ConnectionFailed("bad Content-Length %r from the server" % cl, answered=True) from None
            if self._left < 0:
                raise ConnectionFailed("bad Content-Length %r from the server" % cl, answered=True)
        else:
            self._mode = "close"
            self._keep_alive = False
        self._chunk_left = 0
        self._need_crlf = False
        if status in (204, 304) or (self._mode == "length" and self._left == 0):
            self._done = True

    @property
    def done(self) -> bool:
        """Whether the whole body has been read."""
        return self._done

    async def read_some(self, n: int = 1 << 16) -> bytes:
        """Return the next bytes of the body, b"" at its end."""
        if self._done:
            return b""
        conn = self._conn
        if conn is None or self._busy:
            raise ConnectionFailed("the answer was closed", answered=True)
        # A read interrupted (cancelled, timed out) leaves the connection
        # in an unknown state: _busy stays set and close() drops it.
        self._busy = True
        try:
            data = await self._read(conn.reader, n)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise ConnectionFailed("the connection broke while reading the answer: %s" % (e or type(e).__name__),
                                   answered=True) from None
        self._busy = False
        if self._done:
            await self._finish()
        return data

    async def _read(self, reader: asyncio.StreamReader, n: int) -> bytes:
        if self._mode == "length":
            data = await reader.read(min(n, self._left))
            if not data:
                raise ConnectionFailed("the server closed the connection %d bytes before the end of the answer"
                                       % self._left, answered=True)
            self._left -= len(data)
            if self._left == 0:
                self._done = True
            return data
        if self._mode == "close":
            data = await reader.read(n)
            if not data:
                self._done = True
            return data
        while self._chunk_left == 0:
            if self._need_crlf:
                if await reader.readexactly(2) != b"\r\n":
                    raise ValueError("bad chunk end")
                self._need_crlf = False
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise ValueError("the connection closed in a chunk header")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size < 0:
                raise ValueError("bad chunk size")
            if size == 0:
                # Trailers, then the blank line that ends the body.
                for _ in range(_MAX_HEADERS + 1):
                    t = await reader.readline()
                    if not t.endswith(b"\n"):
                        raise ValueError("the connection closed in the trailers")
                    if t in (b"\r\n", b"\n"):
                        break
                self._done = True
                return b""
            self._chunk_left = size
        data = await reader.read(min(n, self._chunk_left))
        if not data:
            raise ValueError("the connection closed in a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            self._need_crlf = True
        return data

    async def read_all(self, limit: int) -> bytes:
        """Return the rest of the body; more than limit bytes is an error."""
        parts: List[bytes] = []
        size = 0
        while True:
            data = await self.read_some()
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                self.close()
                raise ConnectionFailed("the answer is larger than %d bytes" % limit, answered=True)
            parts.append(data)

    async def _finish(self) -> None:
        """Return the connection to the pool once body and request are done."""
        sender = self._sender
        if sender is not None and not sender.done():
            return  # close() drops it: the request is still being sent
        if sender is not None and (sender.cancelled() or sender.exception() is not None):
            self._keep_alive = False
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep_alive and not self._busy:
            self._pool._release(conn)
        else:
            conn.close()

    def close(self) -> None:
        """End the exchange: the connection is reused if the body was read
        to its end and the request fully sent, else it is closed."""
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()
            self._keep_alive = False
        elif sender is not None and not sender.cancelled() and sender.exception() is not None:
            self._keep_alive = False
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep_alive and not self._busy:
            self._pool._release(conn)
        else:
            conn.close()


class Pool:
    """Keep-alive connections to one HTTP server.

    Args:
        host, port: the server.
        tls: an SSL context for https, None for plain HTTP.
        max_idle: how many idle connections are kept.
        connect_timeout: seconds to connect.
    """

    def __init__(self, host: str, port: int, tls: Optional[ssl.SSLContext], *,
                 max_idle: int = 32, connect_timeout: float = 10.0) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._idle: List[_Conn] = []
        self._closed = False
        # Connections being closed gently (see _abandon).
        self._background: "set[asyncio.Task[None]]" = set()
        default_port = 443 if tls else 80
        h = "[%s]" % host if ":" in host else host
        self._host_header = h if port == default_port else "%s:%d" % (h, port)
        self.connections_made = 0

    def _release(self, conn: _Conn) -> None:
        if self._closed or len(self._idle) >= self._max_idle or not conn.usable():
            conn.close()
            return
        self._idle.append(conn)

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._tls, limit=_MAX_HEAD),
                self._connect_timeout)
        except ConnectionRefusedError:
            raise ConnectionFailed("connection refused", refused=True) from None
        except socket.gaierror as e:
            raise ConnectionFailed("cannot resolve %s: %s" % (self.host, e.strerror or e), unresolved=True) from None
        except asyncio.TimeoutError:
            raise ConnectionFailed("no connection within %gs" % self._connect_timeout) from None
        except ssl.SSLError as e:
            raise ConnectionFailed("TLS handshake failed: %s" % e) from None
        except OSError as e:
            raise ConnectionFailed(str(e) or type(e).__name__, refused=isinstance(e, ConnectionRefusedError)) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.connections_made += 1
        return _Conn(reader, writer)

    async def _acquire(self) -> _Conn:
        if self._closed:
            raise ConnectionFailed("the client is closed")
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        return await self._connect()

    async def request(self, method: str, target: str, headers: List[Tuple[str, str]], body: Body, *,
                      replayable: bool = False) -> Response:
        """Send a request and return its answer once the head is read.

        A replayable request (safe to send twice) whose reused connection
        turns out to be dead before any of the answer arrived is sent again
        once on a new connection: the server most likely closed the idle
        connection as the request went out. A streamed body (async
        iterator) cannot be replayed.
        """
        conn = await self._acquire()
        try:
            return await self._exchange(conn, method, target, headers, body)
        except ConnectionFailed as e:
            if not (replayable and e.reused and not e.answered and not hasattr(body, "__aiter__")):
                raise
        conn = await self._connect()
        return await self._exchange(conn, method, target, headers, body)

    async def _exchange(self, conn: _Conn, method: str, target: str,
                        headers: List[Tuple[str, str]], body: Body) -> Response:
        lines = ["%s %s HTTP/1.1" % (method, target), "Host: " + self._host_header]
        lines += ["%s: %s" % kv for kv in headers]
        streamed = body is not None and not isinstance(body, (bytes, bytearray, memoryview))
        if streamed:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append("Content-Length: %d" % (len(body) if body is not None else 0))
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        sender: Optional["asyncio.Task[None]"] = None
        ok = False
        try:
            try:
                if streamed:
                    conn.writer.write(head)
                    sender = asyncio.ensure_future(_send_chunks(conn.writer, body))  # type: ignore[arg-type]
                else:
                    conn.writer.write(head + bytes(body or b""))
                    await conn.writer.drain()
            except OSError as e:
                raise ConnectionFailed("the connection broke while sending: %s" % e, reused=conn.reused) from None
            try:
                status, reason, hdrs, keep_alive = await _read_head(conn.reader, sender)
            except _BodyFailed as e:
                raise e.err from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                if sender is not None and sender.done() and not sender.cancelled() and sender.exception():
                    exc = sender.exception()
                    if not isinstance(exc, (OSError, ConnectionFailed)):
                        raise exc from None  # the caller's body failed
                raise ConnectionFailed("the connection broke before the answer: %s" % (e or type(e).__name__),
                                       reused=conn.reused) from None
            resp = Response(self, conn, status, reason, hdrs, keep_alive)
            resp._sender = sender
            ok = True
            return resp
        finally:
            if not ok:
                if sender is not None:
                    self._abandon(conn, sender)
                else:
                    conn.close()

    def _abandon(self, conn: _Conn, sender: "asyncio.Task[None]") -> None:
        """Drop a connection whose streamed request did not complete: let the
        sender break the body (see _send_chunks), then read what the server
        answers before closing, in the background."""

        async def gently() -> None:
            if not sender.done():
                sender.cancel()
            try:
                await sender
            except BaseException:
                pass
            await _linger(conn)

        task = asyncio.ensure_future(gently())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Close the idle connections; answers in flight close theirs."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


async def _send_chunks(writer: asyncio.StreamWriter, body: AsyncIterator[bytes]) -> None:
    try:
        async for data in body:
            if data:
                writer.write(b"%x\r\n" % len(data))
                writer.write(bytes(data))
                writer.write(b"\r\n")
                await writer.drain()
    except BaseException:
        # The caller's body failed, or the send was cancelled: break the
        # body so that the server sees an error, never the clean end of a
        # partial upload. "x" is not a chunk size.
        try:
            writer.write(b"x\r\n")
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass
        raise
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _linger(conn: _Conn, seconds: float = 2.0) -> None:
    """Read (and drop) what the server still sends until it closes, so
    that it reads the end of a broken request before the connection goes."""
    try:
        await asyncio.wait_for(_drain_reader(conn.reader), seconds)
    except (asyncio.TimeoutError, OSError):
        pass
    finally:
        conn.close()


async def _drain_reader(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


async def _read_head(reader: asyncio.StreamReader, sender: Optional["asyncio.Task[None]"]):
    """Read the answer's status line and headers, skipping 1xx answers. If
    the request body's sender fails first with the caller's error, that
    error is raised."""
    while True:
        line = await _readline(reader, sender)
        if not line:
            raise ValueError("the server closed the connection without answering")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError("not an HTTP/1.x answer: %r" % line[:80])
        version, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers: Dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            h = await reader.readline()
            if not h.endswith(b"\n"):
                raise ValueError("the connection closed in the answer's headers")
            if h in (b"\r\n", b"\n"):
                break
            name, sep, value = h.decode("latin-1").partition(":")
            if not sep:
                raise ValueError("bad header line %r" % h[:80])
            key = name.strip().lower()
            value = value.strip()
            headers[key] = headers[key] + ", " + value if key in headers else value
        else:
            raise ValueError("too many headers")
        if 100 <= status < 200:
            continue
        conn_hdr = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in conn_hdr
        else:
            keep_alive = "close" not in conn_hdr
        return status, reason, headers, keep_alive


async def _readline(reader: asyncio.StreamReader, sender: Optional["asyncio.Task[None]"]) -> bytes:
    """reader.readline(), but if the request body's sender fails with an
    error of the caller's (not of the connection), raise that at once."""
    if sender is None:
        return await reader.readline()
    read = asyncio.ensure_future(reader.readline())
    try:
        while True:
            done, _ = await asyncio.wait({read, sender} if not sender.done() else {read},
                                         return_when=asyncio.FIRST_COMPLETED)
            if read in done:
                return read.result()
            exc = None if sender.cancelled() else sender.exception()
            if exc is not None and not isinstance(exc, OSError):
                raise _BodyFailed(exc)
    finally:
        if not read.done():
            read.cancel()

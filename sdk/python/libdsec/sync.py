"""A synchronous client for scripts and notebooks.

The same API as the asyncio one, with plain calls::

    from libdsec.sync import DSecClient, DSecContainerRunArgs

    with DSecClient() as client:
        sandbox = client.run_container(DSecContainerRunArgs(container_image="busybox"))
        print(sandbox.run_shell("echo hello world").stdout)
        sandbox.stop()

Each client runs an asyncio event loop in a background thread and hands it
the calls, so it works where an event loop already runs in the calling
thread (Jupyter). Objects it returns (sandboxes, processes, watches) wrap
their asyncio counterparts the same way; iterating a process or a watch is
a plain ``for`` loop. A client is safe to use from several threads.

A client survives fork() (``multiprocessing`` with the fork start method,
a ``ProcessPoolExecutor`` of reward workers): the child's first call starts
a new loop thread and new connections; the parent's keep working. What the
parent had (its loop, its sockets, streams open at the fork) is left alone
in the child, never closed there: the sockets and the loop's epoll instance
are shared with the parent, and closing them in the child would break the
parent's calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import os
import threading
import weakref
from typing import Any, Awaitable, Callable, Iterator, Optional, TypeVar

from . import client as _client
from .client import DSecContainerRunArgs, parse_size
from . import errors as _errors
from .errors import *  # noqa: F401,F403  (the same exceptions)
from .rollout import Rollout as _ARollout
from .sandbox import Process as _AProcess, Sandbox as _ASandbox, Session as _ASession
from .types import BatchResult, Event

__all__ = ["DSecClient", "DSecContainerRunArgs", "Sandbox", "Process", "Session", "Rollout", "WatchStream",
           "parse_size"] + list(
    _errors.__all__)

T = TypeVar("T")


class _Loop:
    """An event loop running in a daemon thread; after fork() the child's
    first call starts a new one (a forked child has none of the parent's
    threads, so the old loop would never run a call)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._start()
        _loops.add(self)

    def _start(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(self.loop,), name="libdsec-loop", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def _check_fork(self) -> None:
        if self.pid == os.getpid():
            return
        with self._mu:
            if self.pid == os.getpid():
                return
            # The parent's loop: kept, never closed or stopped here (its
            # selector and wake-up pipe are the parent's too).
            _forked_leftovers.append((self.loop, self._thread))
            if not self.loop.is_closed():
                self._start()

    def _after_fork_in_child(self) -> None:
        # The lock may have been held by a thread that is not in the child.
        self._mu = threading.Lock()

    def run(self, aw: Awaitable[T]) -> T:
        self._check_fork()
        if self.loop.is_closed() or threading.current_thread() is self._thread:
            close = getattr(aw, "close", None)
            if close is not None:
                close()  # never awaited: say so quietly
            if self.loop.is_closed():
                raise _errors.FailedPreconditionError("the client is closed: make a new DSecClient")
            raise RuntimeError("a libdsec.sync call was made from its own event loop thread")
        fut = asyncio.run_coroutine_threadsafe(_as_coro(aw), self.loop)
        try:
            return fut.result()
        except BaseException:
            # KeyboardInterrupt and the like: do not leave the call running.
            if not fut.done():
                fut.cancel()
                try:
                    fut.result(timeout=5)
                except BaseException:
                    pass
            raise

    def stop(self) -> None:
        self._check_fork()
        if self.loop.is_closed():
            return

        async def shutdown() -> None:
            await self.loop.shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=5)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


# The live loops, for the fork hook; and what the parent had, kept
# referenced in a child so that nothing closes it there.
_loops: "weakref.WeakSet[_Loop]" = weakref.WeakSet()
_forked_leftovers: list = []


def _after_fork_in_child() -> None:
    for lp in list(_loops):
        lp._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw


class _Wrapper:
    """Forwards attribute reads to the asyncio object; its coroutine
    methods become plain calls run on the client's loop."""

    def __init__(self, loop: _Loop, target: Any) -> None:
        object.__setattr__(self, "_loop", loop)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):
            return _sync_method(self._loop, attr)
        return _wrap(self._loop, attr)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __dir__(self) -> Any:
        return sorted(set(dir(type(self))) | set(dir(self._target)))

    def __repr__(self) -> str:
        return repr(self._target)


def _sync_method(loop: _Loop, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _wrap(loop, loop.run(fn(*args, **kwargs)))

    return call


def _wrap(loop: _Loop, v: Any) -> Any:
    """Wrap what a call returned: sandboxes, processes and watches become
    their synchronous forms, also inside lists, tuples and results."""
    if isinstance(v, _ASandbox):
        return Sandbox(loop, v)
    if isinstance(v, _AProcess):
        return Process(loop, v)
    if isinstance(v, _ASession):
        return Session(loop, v)
    if isinstance(v, _ARollout):
        return Rollout(loop, v)
    if isinstance(v, _client.WatchStream):
        return WatchStream(loop, v)
    if isinstance(v, list):
        return [_wrap(loop, x) for x in v]
    if isinstance(v, tuple):
        return tuple(_wrap(loop, x) for x in v)
    if isinstance(v, (BatchResult, Event)) and v.sandbox is not None:
        return dataclasses.replace(v, sandbox=Sandbox(loop, v.sandbox))
    return v


class Sandbox(_Wrapper):
    """A sandbox; see :class:`libdsec.Sandbox` for its methods, which here
    are plain calls. ``with sandbox:`` stops it on exit."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(self._target.__aexit__(*exc))


class Session(_Wrapper):
    """A shell session of a sandbox (``sandbox.session("main")``); see
    :class:`libdsec.Session`: ``session.run("cd /tmp")``."""


class Rollout(_Wrapper):
    """A rollout; see :class:`libdsec.Rollout`: ``rollout.status``,
    ``rollout.set_status({...})``, ``rollout.member("agent")``."""

    def member(self, name: str) -> Sandbox:
        """Return a handle to the sandbox of the member called name."""
        return Sandbox(self._loop, self._target.member(name))

    def worker(self) -> Optional[Sandbox]:
        """Return a handle to the worker member's sandbox, or None."""
        sb = self._target.worker()
        return None if sb is None else Sandbox(self._loop, sb)


class Process(_Wrapper):
    """A running command; see :class:`libdsec.Process`. ``for chunk in
    proc`` yields its output as it arrives."""

    def __iter__(self) -> Iterator[Any]:
        while True:
            chunk = self._loop.run(self._target.read())
            if chunk is None:
                return
            yield chunk

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(self._target.close())


class WatchStream(_Wrapper):
    """Events of a watch: ``for event in stream``; close() ends it."""

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                ev = self._loop.run(self._target.__anext__())
            except StopAsyncIteration:
                return
            yield _wrap(self._loop, ev)

    def __enter__(self) -> "WatchStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(self._target.close())


class DSecClient(_Wrapper):
    """A synchronous dsec client; the arguments and methods are those of
    :class:`libdsec.DSecClient`, as plain calls. ``with DSecClient() as
    c:`` opens and closes it; calls made before open() open it without its
    check."""

    def __init__(self, addr: Optional[str] = None, api_key: Optional[str] = None, **kwargs: Any) -> None:
        target = _client.DSecClient(addr, api_key, **kwargs)
        super().__init__(_Loop(), target)

    def sandbox(self, id: str) -> Sandbox:
        """Return a handle to the sandbox with the given ID, without a call."""
        return Sandbox(self._loop, self._target.sandbox(id))

    def open(self) -> "DSecClient":
        """Check that the server answers and accepts the key; return self."""
        self._loop.run(self._target.open())
        return self

    def close(self) -> None:
        """Close the client and stop its event loop thread. Idempotent."""
        self._loop._check_fork()
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._target.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "DSecClient":
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            loop = object.__getattribute__(self, "_loop")
        except AttributeError:
            return
        if loop.pid == os.getpid() and not loop.loop.is_closed() and loop.loop.is_running():
            loop.loop.call_soon_threadsafe(loop.loop.stop)

"""Postgres LISTEN/NOTIFY: how the pipeline's processes hear of each other's writes without
polling. A job's writer wakes the dispatcher (jobs.NEW_JOBS); a batch that concludes a job's
first pass wakes the request waiting for it (jobs.FIRST_PASS). Notifications are a shortcut,
never the only path: whoever listens also looks at the rows now and then, so a notification
lost to a dropped connection costs latency, not correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from uuid import UUID

import asyncpg

from engram.store import jobs

log = logging.getLogger(__name__)


async def listen_forever(dsn: str, handlers: dict[str, Callable[[str], None]], *, retry_s: float = 1.0) -> None:
    """Hold one connection LISTENing on each channel of `handlers` (channel -> callback with the
    payload), reconnecting after `retry_s` whenever it drops. Runs until cancelled."""
    while True:
        conn = None
        try:
            conn = await asyncpg.connect(dsn)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            for channel, handler in handlers.items():
                await conn.add_listener(channel, lambda _c, _pid, _channel, payload, h=handler: h(payload))
            for handler in handlers.values():
                handler("")  # (re)connected: whatever was sent meanwhile is for the rows to tell
            await lost.wait()
        except (OSError, asyncpg.PostgresError) as err:
            log.warning("notification listener lost its connection; reconnecting", extra={"error": str(err)})
        finally:
            if conn is not None and not conn.is_closed():
                await conn.close()
        await asyncio.sleep(retry_s)


class NewJobs:
    """Wakes a loop that works through new jobs: NEW_JOBS sets it (`listen` holds the channel),
    and `wait` also returns after a poll interval without one, so a notification lost to a
    dropped connection costs latency, not work."""

    def __init__(self, dsn: str, channel: str = jobs.NEW_JOBS) -> None:
        self._dsn = dsn
        self._channel = channel
        self._event = asyncio.Event()

    def notified(self, _payload: str = "") -> None:
        self._event.set()

    def listen(self) -> asyncio.Task:
        """The listener, running until the caller cancels it."""
        return asyncio.create_task(listen_forever(self._dsn, {self._channel: self.notified}))

    async def wait(self, poll_s: float, *, gather_s: float = 0.0) -> None:
        """Until notified (then `gather_s` more, letting a burst gather) or `poll_s` has passed.

        asyncio.timeout, not wait_for: on 3.11, wait_for swallows a cancellation that arrives
        as the event is set, and the loop calling this then never stops (a shutdown hung in CI;
        tests/test_notifications.py makes it happen)."""
        try:
            async with asyncio.timeout(poll_s):
                await self._event.wait()
        except TimeoutError:
            pass
        else:
            await asyncio.sleep(gather_s)
        self._event.clear()


class FirstPassWaiter:
    """Waits for jobs' first-pass outcomes: notified by FIRST_PASS, checked in the row at the
    start and every `poll_s` after it."""

    def __init__(self, pool: asyncpg.Pool, poll_s: float = 1.0) -> None:
        self._pool = pool
        self._poll_s = poll_s
        self._waiting: dict[str, list[asyncio.Future]] = {}

    def notified(self, payload: str) -> None:
        """FIRST_PASS's handler: `<job id>:<outcome>` (or "" after a reconnect: wake everyone)."""
        if not payload:
            for waiters in self._waiting.values():
                for future in waiters:
                    if not future.done():
                        future.set_result(None)
            return
        job_id, _, outcome = payload.partition(":")
        for future in self._waiting.get(job_id, ()):
            if not future.done():
                future.set_result(outcome)

    async def wait_first_pass(self, job_id: UUID, timeout_s: float) -> str | None:
        """The job's first-pass outcome ("processed" or "raw_saved"), or None if it has none
        within `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = str(job_id)
        while True:
            future = loop.create_future()
            self._waiting.setdefault(key, []).append(future)
            try:
                job = await jobs.get(self._pool, job_id)
                if job is None or job.outcome is not None:
                    return job.outcome if job else None
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    async with asyncio.timeout(min(remaining, self._poll_s)):  # not wait_for: see NewJobs.wait
                        outcome = await future
                except TimeoutError:
                    continue
                if outcome:
                    return outcome
            finally:
                waiters = self._waiting.get(key, [])
                if future in waiters:
                    waiters.remove(future)
                if not waiters:
                    self._waiting.pop(key, None)


class Wakeups:
    """Wakes the one waiting on a key when a notification names it (import_batches.WRITTEN: a
    batch id); an empty payload (a reconnect) wakes everyone. Watch the key before doing what
    will notify it, and the notification cannot be missed; the watcher still looks at the row
    after every wake or timeout."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notified(self, payload: str) -> None:
        for key in [payload] if payload else list(self._events):
            if (event := self._events.get(key)) is not None:
                event.set()

    @contextlib.contextmanager
    def watch(self, key: UUID) -> Iterator[asyncio.Event]:
        event = self._events[str(key)] = asyncio.Event()
        try:
            yield event
        finally:
            self._events.pop(str(key), None)

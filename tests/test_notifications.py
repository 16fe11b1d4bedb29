"""The loops woken by Postgres notifications stop when cancelled, whenever the cancel lands:
on Python 3.11, asyncio.wait_for swallowed a cancel that arrived as the wake-up did, and the
outbox dispatcher then ran on through shutdown (a test run hung in its teardown)."""

from __future__ import annotations

import asyncio

from engram.store.notifications import NewJobs


async def test_a_loop_waiting_for_new_jobs_stops_when_cancelled_as_it_is_woken():
    new_jobs = NewJobs("postgresql://never-connected")

    async def dispatcher_like() -> None:
        while True:
            await new_jobs.wait(60, gather_s=0.001)

    for _ in range(50):
        task = asyncio.create_task(dispatcher_like())
        await asyncio.sleep(0.005)
        new_jobs.notified()  # the wake-up and the cancel in the same turn of the loop
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1)
        assert task in done and task.cancelled()


async def test_a_wait_returns_when_notified_or_after_its_poll_interval():
    new_jobs = NewJobs("postgresql://never-connected")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await new_jobs.wait(0.05)
    assert loop.time() - started >= 0.05
    waiting = asyncio.create_task(new_jobs.wait(60))
    await asyncio.sleep(0.01)
    new_jobs.notified()
    await asyncio.wait_for(waiting, 1)

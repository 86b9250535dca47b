"""Run `process_file` over many files: in-process for a few, a worker pool for many.

Workers are forked once and take files in chunks, so start-up is paid per worker, not per
file. Ctrl-C stops cleanly: workers finish the file in hand (a write is never cut), skip the
rest, and the caller still gets every result that was produced.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from typing import Callable, Iterator, List, Optional

from ampify.engine import FileTask, process_file
from ampify.findings import FileResult

#: below this many files a pool costs more than it saves
POOL_THRESHOLD = 8

_stop_event = None


def default_jobs() -> int:
    """All the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run_tasks(
    tasks: List[FileTask],
    jobs: int,
    on_result: Optional[Callable[[FileResult], None]] = None,
) -> Iterator[FileResult]:
    """Yield one FileResult per task, in completion order. KeyboardInterrupt propagates
    after the workers have stopped; results produced before it were already yielded."""
    if jobs <= 1 or len(tasks) < POOL_THRESHOLD:
        for task in tasks:
            result = process_file(task)
            if on_result:
                on_result(result)
            yield result
        return
    yield from _run_in_pool(tasks, jobs, on_result)


def _pool_context():
    # fork: workers inherit the imported modules (LibCST, the transforms) for free.
    if sys.platform != "win32" and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _init_worker(stop_event) -> None:
    global _stop_event
    _stop_event = stop_event
    # The parent handles Ctrl-C; a worker finishes its file and then sees the stop event.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _process_unless_stopped(task: FileTask) -> Optional[FileResult]:
    if _stop_event is not None and _stop_event.is_set():
        return None
    return process_file(task)


def _run_in_pool(tasks, jobs, on_result) -> Iterator[FileResult]:
    context = _pool_context()
    stop_event = context.Event()
    jobs = min(jobs, len(tasks))
    chunksize = max(1, min(32, len(tasks) // (jobs * 8)))
    pool = context.Pool(jobs, initializer=_init_worker, initargs=(stop_event,))
    interrupted = False
    finished = False
    try:
        results = pool.imap_unordered(_process_unless_stopped, tasks, chunksize=chunksize)
        while True:
            try:
                result = next(results)
            except StopIteration:
                break
            except KeyboardInterrupt:
                interrupted = True
                stop_event.set()
                continue  # drain: the files in hand finish, the rest come back as None
            if result is None:
                continue
            if on_result:
                on_result(result)
            yield result
        finished = True
    finally:
        if not finished:
            stop_event.set()  # the consumer went away (Ctrl-C while it handled a result)
        pool.close()
        pool.join()
    if interrupted:
        raise KeyboardInterrupt

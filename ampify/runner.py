"""Run `process_file` over many files: in-process for a few, a worker pool for many.

Workers are forked once and take files in batches (largest files first, see `_batches`), so
start-up is paid per worker, not per file. Ctrl-C stops cleanly: workers finish the file in hand (a write is never cut), skip the
rest, and the caller still gets every result that was produced.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import threading
from typing import Callable, Iterator, List, Optional

from ampify.engine import FileTask, process_file
from ampify.findings import FileResult

#: below this many files a pool costs more than it saves
POOL_THRESHOLD = 8

#: first-generation threshold of the cyclic garbage collector while converting: parsing
#: allocates millions of nodes that hold no reference cycles, and the default (700) runs a
#: collection every few hundred of them; cycles are still collected, just less often
GC_THRESHOLD = 50_000

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
        with fewer_gc_passes():
            yield from _run_in_process(tasks, on_result)
    else:
        yield from _run_in_pool(tasks, jobs, on_result)


@contextlib.contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Convert with fewer cyclic-GC passes (see GC_THRESHOLD); the old settings come back after."""
    previous = _collect_garbage_less_often()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)


def _collect_garbage_less_often():
    previous = gc.get_threshold()
    gc.freeze()  # what is alive now (imported modules) is never garbage: stop re-scanning it
    gc.set_threshold(GC_THRESHOLD, previous[1], previous[2])
    return previous


def _run_in_process(tasks, on_result) -> Iterator[FileResult]:
    interrupted = False

    def stop_on_ctrl_c(signum, frame):
        # Finish the file in hand (its result is counted), then stop.
        nonlocal interrupted
        interrupted = True

    previous_handler = _install_sigint_handler(stop_on_ctrl_c)
    try:
        for task in tasks:
            if interrupted:
                break
            result = process_file(task)
            if on_result:
                on_result(result)
            yield result
    finally:
        _restore_sigint_handler(previous_handler)
    if interrupted:
        raise KeyboardInterrupt


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
    _collect_garbage_less_often()


def _process_batch(tasks: List[FileTask]) -> List[Optional[FileResult]]:
    """One worker's share of files; after a stop request the rest come back as None."""
    return [None if _stop_event is not None and _stop_event.is_set() else process_file(task) for task in tasks]


#: a batch closes at this many files or this many bytes, whichever comes first
BATCH_MAX_FILES = 32
BATCH_MAX_BYTES = 256 * 1024


def _file_size(task: FileTask) -> int:
    try:
        return os.stat(task.candidate.path).st_size
    except OSError:
        return 0  # the worker reports what is wrong with it


def _batches(tasks: List[FileTask], jobs: int) -> List[List[FileTask]]:
    """Batches of files, largest first, small files grouped, big files alone.

    Parse time grows with file size, and real trees keep their biggest files together (e.g.
    TensorFlow's generated `gen_*_ops.py`, 0.6 MB each). Fixed-size batches in tree order
    gave one worker all of them while the other sat idle; largest-first with a byte budget
    per batch leaves only small files for the end, so the workers finish together.
    """
    max_files = max(1, min(BATCH_MAX_FILES, len(tasks) // (jobs * 8)))
    sized = sorted(((_file_size(task), index, task) for index, task in enumerate(tasks)), key=lambda t: (-t[0], t[1]))
    batches: List[List[FileTask]] = []
    current: List[FileTask] = []
    current_bytes = 0
    for size, _, task in sized:
        if current and (len(current) >= max_files or current_bytes + size > BATCH_MAX_BYTES):
            batches.append(current)
            current, current_bytes = [], 0
        current.append(task)
        current_bytes += size
    if current:
        batches.append(current)
    return batches


def _run_in_pool(tasks, jobs, on_result) -> Iterator[FileResult]:
    context = _pool_context()
    stop_event = context.Event()
    jobs = min(jobs, len(tasks))
    pool = context.Pool(jobs, initializer=_init_worker, initargs=(stop_event,))
    interrupted = False

    def stop_on_ctrl_c(signum, frame):
        # No exception here: one raised inside the pool's iterator or inside this generator
        # would lose the results of files already written. Stop the workers, drain, then raise.
        nonlocal interrupted
        interrupted = True
        stop_event.set()

    previous_handler = _install_sigint_handler(stop_on_ctrl_c)
    finished = False
    try:
        # Batches rather than imap's chunksize: pool.imap_unordered with chunksize > 1 is a
        # generator that dies on the first exception, and its pending results with it.
        batches = pool.imap_unordered(_process_batch, _batches(tasks, jobs))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except KeyboardInterrupt:  # no handler of ours (not the main thread)
                interrupted = True
                stop_event.set()
                continue  # drain: the files in hand finish, the rest come back as None
            for result in batch:
                if result is None:
                    continue
                if on_result:
                    on_result(result)
                yield result
        finished = True
    finally:
        if not finished:
            stop_event.set()  # the consumer went away (or raised while it handled a result)
        pool.close()
        pool.join()
        _restore_sigint_handler(previous_handler)
    if interrupted:
        raise KeyboardInterrupt


def _install_sigint_handler(handler):
    """Route Ctrl-C to `handler` while the pool runs; None where signals cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGINT, handler)
    except (ValueError, OSError):
        return None


def _restore_sigint_handler(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)

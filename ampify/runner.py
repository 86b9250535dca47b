"""Run `process_file` over many files in supervised worker processes.

Every file is converted in a worker process, also with `-j 1`: LibCST's native parser can
crash the process that runs it (a segfault on very deeply nested code) or run for minutes on
a pathological file, and neither may take the run, its summary or its report down with it.
The parent hands out batches of files (largest first, see `_batches`), hears from the worker
when each file starts, when its write begins and when it is done, and so always knows which
file a worker holds:

- a worker that dies (a crash, the OOM killer, a stray kill) turns its file into a failed
  result naming the signal; the rest of its batch goes to a fresh worker;
- a file still converting after `file_timeout` seconds gets its worker killed and is reported
  failed; the write itself is never timed, so a kill never cuts one (and a write is atomic
  anyway: see source_io);
- SIGINT, SIGTERM and SIGHUP stop the run cleanly: workers finish the file in hand, skip the
  rest, and the caller gets every result produced, then `Interrupted` with the signal.
"""

from __future__ import annotations

import collections
import dataclasses
import contextlib
import faulthandler
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable, Deque, Dict, Iterator, List, Optional, Tuple

from ampify.engine import FileTask, process_file
from ampify.findings import FileResult, FileStatus

#: a file still converting after this many seconds is abandoned (its worker is killed)
DEFAULT_FILE_TIMEOUT = 120.0

#: first-generation threshold of the cyclic garbage collector while converting: parsing
#: allocates millions of nodes that hold no reference cycles, and the default (700) runs a
#: collection every few hundred of them; cycles are still collected, just less often
GC_THRESHOLD = 50_000

#: the signals that stop a run cleanly, as Ctrl-C does
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; every result produced before it was already yielded."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended (130, 143, 129)."""
        return 128 + self.signum


def default_jobs() -> int:
    """All the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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


# --- batches -------------------------------------------------------------------------------

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


# --- the worker side -----------------------------------------------------------------------

# Messages a worker sends: ("start", i), ("writing", i), ("done", i, result), ("skipped", i),
# ("idle",) once a batch is through. The parent sends a batch [(i, task), ...] or None to stop.


def _worker_main(conn, stop_event, parent_pid: int, parent_ends=()) -> None:
    # The parent's ends of the pipes (this worker's and the older workers'), inherited through
    # fork: closed here, so that a parent killed with SIGKILL gives this worker EOF instead of
    # leaving it blocked in recv() forever.
    for end in parent_ends:
        end.close()
    # The parent decides when to stop: a worker finishes its file and then sees the stop event.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    faulthandler.disable()  # a crash is the parent's to report, as a failed file
    _collect_garbage_less_often()
    try:
        while True:
            while not conn.poll(1.0):
                if os.getppid() != parent_pid:
                    return  # the parent is gone (and something still holds the pipe open)
            batch = conn.recv()
            if batch is None:
                return
            for index, task in batch:
                if stop_event.is_set() or os.getppid() != parent_pid:
                    conn.send(("skipped", index))
                    continue
                conn.send(("start", index))
                result = process_file(task, before_write=lambda index=index: conn.send(("writing", index)))
                conn.send(("done", index, result))
            conn.send(("idle",))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone: nothing to report to


# --- the parent side -----------------------------------------------------------------------


@dataclass
class _Worker:
    process: multiprocessing.Process
    conn: object
    #: the files of the batch in hand that have not come back yet, in order
    batch: Deque[int] = field(default_factory=collections.deque)
    #: the file being converted or written, when it started, and whether its write began
    in_hand: Optional[int] = None
    started_at: float = 0.0
    writing: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.batch)


def _pool_context():
    # fork: workers inherit the imported modules (LibCST, the transforms) for free.
    if sys.platform != "win32" and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _signal_name(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def crash_reason(exitcode: Optional[int], writing: bool) -> str:
    """Why a file failed when the worker converting it died."""
    how = _signal_name(exitcode)
    if writing:
        return (f"the worker process died ({how}) while writing it; the file is either untouched or "
                "fully converted (writes are atomic): run ampify again to see which")
    hint = ""
    if exitcode == -signal.SIGSEGV:
        hint = " (LibCST's native parser crashes on very deeply nested code)"
    elif exitcode == -signal.SIGKILL:
        hint = " (killed from outside, often by the out-of-memory killer)"
    return f"the parser crashed ({how}){hint}; file left untouched"


def timeout_reason(seconds: float) -> str:
    return (f"took longer than the {seconds:g} s per-file limit to convert (--file-timeout); "
            "file left untouched")


class _Pool:
    """Workers, the batches not handed out yet, and the bookkeeping to survive a dead worker."""

    def __init__(self, tasks: List[FileTask], jobs: int, file_timeout: Optional[float]) -> None:
        self.tasks = tasks
        self.file_timeout = file_timeout
        self.context = _pool_context()
        self.stop_event = self.context.Event()
        index_of = {id(task): index for index, task in enumerate(tasks)}
        self.pending: Deque[List[int]] = collections.deque(
            [index_of[id(task)] for task in batch] for batch in _batches(tasks, jobs)
        )
        self.workers: List[_Worker] = []
        self.size = max(1, min(jobs, len(self.pending)))

    def start_worker(self) -> _Worker:
        parent_end, child_end = self.context.Pipe(duplex=True)
        process = self.context.Process(
            target=_worker_main,
            args=(child_end, self.stop_event, os.getpid(), [parent_end, *(w.conn for w in self.workers)]),
            daemon=True,
        )
        process.start()
        child_end.close()
        worker = _Worker(process, parent_end)
        self.workers.append(worker)
        return worker

    def hand_out(self, stopping: bool) -> None:
        """Give each idle worker a batch; start workers (again) up to the pool size."""
        if stopping:
            return
        for worker in list(self.workers):
            if not worker.busy and self.pending:
                self._send(worker, self.pending.popleft())
        while self.pending and len(self.workers) < self.size:
            self._send(self.start_worker(), self.pending.popleft())

    def _send(self, worker: _Worker, batch: List[int]) -> None:
        try:
            worker.conn.send([(index, self.tasks[index]) for index in batch])
        except (BrokenPipeError, ConnectionResetError, OSError):
            # It died while idle (nothing of it is lost): the batch goes back, a fresh worker takes it.
            self.pending.appendleft(batch)
            self.bury(worker, "")
            return
        worker.batch.extend(batch)

    def receive(self, worker: _Worker) -> Iterator[FileResult]:
        """Read what `worker` has said so far; yield the results it finished."""
        while True:
            try:
                if not worker.conn.poll():
                    return
                message = worker.conn.recv()
            except (EOFError, OSError):
                return  # it died: `bury` reports its file
            kind = message[0]
            if kind == "start":
                worker.in_hand, worker.started_at, worker.writing = message[1], time.monotonic(), False
            elif kind == "writing":
                worker.writing = True
            elif kind in ("done", "skipped"):
                worker.batch.remove(message[1])
                worker.in_hand = None
                if kind == "done":
                    yield message[2]
            # "idle": the batch deque is already empty

    def bury(self, worker: _Worker, reason: str) -> Optional[FileResult]:
        """Take a dead (or killed) worker out; its file fails with `reason`, the rest of its
        batch goes back to the front of the queue."""
        self.workers.remove(worker)
        with contextlib.suppress(OSError):
            worker.conn.close()
        worker.process.join(timeout=5)
        result = None
        if worker.in_hand is not None:
            task = self.tasks[worker.in_hand]
            worker.batch.remove(worker.in_hand)
            result = FileResult(task.candidate.display, FileStatus.FAILED, reason)
        if worker.batch:
            self.pending.appendleft(list(worker.batch))
        return result

    def overdue(self, now: float) -> List[_Worker]:
        if self.file_timeout is None:
            return []
        return [w for w in self.workers
                if w.in_hand is not None and not w.writing and now - w.started_at > self.file_timeout]

    def next_deadline(self, now: float) -> Optional[float]:
        if self.file_timeout is None:
            return None
        waits = [w.started_at + self.file_timeout - now for w in self.workers if w.in_hand is not None and not w.writing]
        return max(0.0, min(waits)) + 0.01 if waits else None

    def shut_down(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        for worker in self.workers:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            with contextlib.suppress(OSError):
                worker.conn.close()
        self.workers.clear()


def run_tasks(
    tasks: List[FileTask],
    jobs: int,
    on_result: Optional[Callable[[FileResult], None]] = None,
    file_timeout: Optional[float] = DEFAULT_FILE_TIMEOUT,
    retry_conflicts: bool = True,
) -> Iterator[FileResult]:
    """Yield one FileResult per task, in completion order.

    With several workers, a file whose change set spans several files is held back, and so is
    one whose change set found another of its files changed meanwhile (two change sets of this
    run editing one driver: `engine_a.py` and `engine_b.py` both pass the GradScaler `main.py`
    creates): they are converted again after all the others, one at a time, against what is on
    disk then; so several workers write what one would.

    After SIGINT, SIGTERM or SIGHUP the workers finish the file in hand and the rest are
    skipped; `Interrupted` (a KeyboardInterrupt) is raised once they stopped, after every result
    produced was yielded.
    """
    if not tasks:
        return
    if retry_conflicts and jobs > 1:
        tasks = [dataclasses.replace(task, hold_change_sets=True) for task in tasks]
    # held-back files run again in the order one worker takes them (largest first, see
    # _batches): the same files, in the same order, give the same result whatever -j says
    one_worker_order = {task.candidate.display: (-_file_size(task), index) for index, task in enumerate(tasks)}
    pool = _Pool(tasks, jobs, file_timeout)
    stop_signal: List[int] = []

    def stop_cleanly(signum, frame):
        # No exception here: one raised inside this generator would lose the results of files
        # already written. Stop the workers, drain, then raise.
        if not stop_signal:
            stop_signal.append(signum)
        pool.stop_event.set()

    previous_handlers = _install_stop_handlers(stop_cleanly)
    finished = False
    held_back: List[FileResult] = []
    try:
        pool.hand_out(stopping=False)
        while any(worker.busy for worker in pool.workers):
            busy = [w for w in pool.workers if w.busy]
            by_handle: Dict[object, Tuple[_Worker, bool]] = {}
            for worker in busy:
                by_handle[worker.conn] = (worker, False)
                by_handle[worker.process.sentinel] = (worker, True)
            ready = wait(list(by_handle), timeout=pool.next_deadline(time.monotonic()))
            dead = []
            for handle in ready:
                worker, is_sentinel = by_handle[handle]
                if is_sentinel:
                    dead.append(worker)
            # Read the pipes first: a worker that finished a file and then died reported the file.
            for worker in busy:
                for result in pool.receive(worker):
                    if retry_conflicts and result.run_again_alone:
                        held_back.append(result)
                        continue
                    yield _delivered(result, on_result)
            for worker in dead:
                worker.process.join(timeout=5)  # sets exitcode
                if worker.busy and worker in pool.workers:
                    failed = pool.bury(worker, crash_reason(worker.process.exitcode, worker.writing))
                    if failed is not None:
                        yield _delivered(failed, on_result)
                elif worker in pool.workers:
                    pool.bury(worker, "")
            for worker in pool.overdue(time.monotonic()):
                worker.process.kill()
                failed = pool.bury(worker, timeout_reason(pool.file_timeout))
                if failed is not None:
                    yield _delivered(failed, on_result)
            pool.hand_out(stopping=bool(stop_signal))
        finished = True
    finally:
        if not finished:
            pool.stop_event.set()  # the consumer went away (or raised while it handled a result)
        pool.shut_down()
        _restore_handlers(previous_handlers)
    by_display = {task.candidate.display: task for task in tasks}
    again = [dataclasses.replace(by_display[result.path], hold_change_sets=False)
             for result in sorted(held_back, key=lambda result: one_worker_order.get(result.path, (0, 0)))
             if result.path in by_display]
    if stop_signal or not finished:
        for result in held_back:
            if result.reason.startswith("held back"):
                result.status, result.reason = FileStatus.SKIPPED, "not converted: the run was stopped"
            yield _delivered(result, on_result)
        if stop_signal:
            raise Interrupted(stop_signal[0])
        return
    if again:
        yield from run_tasks(again, 1, on_result, file_timeout, retry_conflicts=False)


def _delivered(result: FileResult, on_result) -> FileResult:
    if on_result:
        on_result(result)
    return result


def _install_stop_handlers(handler) -> Dict[int, object]:
    """Route the stop signals to `handler` while the run goes on; nothing where signals cannot
    be set (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in STOP_SIGNALS:
        try:
            previous[signum] = signal.signal(signum, handler)
        except (ValueError, OSError):
            pass
    return previous


def _restore_handlers(previous: Dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)

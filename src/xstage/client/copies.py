"""The client's large copies on several CPUs: into a region slot and out of one.

A copy of at least ``MIN_BYTES`` is split into contiguous byte ranges (page-aligned where the
itemsize allows) that a small persistent pool of threads and the calling thread copy at once.
``np.copyto`` of a non-object dtype releases the GIL while it copies, so the ranges run in
parallel; a fresh output array's first touch (its page faults) is spread the same way, each
thread faulting in the pages it writes. Ranges are taken from a shared counter, so a helper that
wakes late takes fewer of them and the caller never waits for a thread that has not started.

Only where it pays: by default ``min(4, cpus // 2)`` helpers where this process may run on at
least 4 CPUs, none below (on 2 CPUs the worker, which has just been woken or is about to be,
needs the other one). ``XSTAGE_COPY_THREADS`` sets the helpers (0: off). A copy wakes only as
many helpers as the machine has CPUs nobody runs on (``/proc/loadavg``'s running tasks, sampled
at most every 10 ms): a helper woken onto a busy CPU would hold its range for a scheduler slice.
The pool starts on its first large copy and ends with its ``WorkerClient``.

Why ``MIN_BYTES`` is 2 MiB: a range costs ~5-10 µs of Python around its ``np.copyto`` (slices,
the counter, the GIL), and a helper's wake-up ~5-30 µs (an idle CPU is halted); a single-thread
copy moves ~5-10 GB/s. Alone, a split 1 MiB copy pays on the 16-core H200 host (``benchmarks/
copies.py``: 0.60x with two helpers), but inside a call it did not: ``transport.py``'s 1 MiB + 1
MiB overhead was 1.09x the TCP echo's with the split from 1 MiB against 0.82x without it, while
4.8 + 4.0 MB went 0.64x -> 0.46x (both copies split). Measured: ``docs/performance.md#copies``.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from typing import Any

import numpy as np

from xstage_remote import shm

__all__ = ["COPY_THREADS", "MIN_BYTES", "CopyPool", "copy_threads_default"]

#: Copies of at least this many bytes are split (see the module's docstring for why).
MIN_BYTES = 2 << 20
#: The smallest range one participant copies (a range is page-aligned where it can be).
MIN_RANGE = 256 << 10
#: Ranges per participant, and at least ``MIN_RANGES`` in all: a helper that wakes late takes
#: fewer, and the last range the caller may wait for is short (on the 2-vCPU VM an 8.8 MB copy
#: with one helper took 637 µs in 4 ranges, 603 µs in 8, 496 µs in 16; one thread 718 µs).
RANGES_EACH = 4
MIN_RANGES = 16
#: The most helpers ``XSTAGE_COPY_THREADS`` may ask for.
MAX_THREADS = 64
#: How often a pool re-reads the machine's runnable tasks (``_read_load``; ~4 µs a read).
LOAD_SAMPLE_SECONDS = 0.01
_PAGE = 4096


def allowed_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def copy_threads_default(environ: Any = None) -> tuple[int, str | None]:
    """(helper threads, the problem with ``XSTAGE_COPY_THREADS`` or None).

    ``XSTAGE_COPY_THREADS=N`` asks for N helpers (0: off); unset, ``min(4, cpus // 2)`` where
    this process may run on at least 4 CPUs, else 0. A malformed value is a problem (the client
    refuses to start a worker, as for the other ``XSTAGE_*`` numbers) and the default is used.
    """
    env = os.environ if environ is None else environ
    raw = env.get("XSTAGE_COPY_THREADS")
    cpus = allowed_cpus()
    default = min(4, cpus // 2) if cpus >= 4 else 0
    if raw is None:
        return default, None
    try:
        value = int(raw.strip())
        if not 0 <= value <= MAX_THREADS:
            raise ValueError
    except ValueError:
        return default, (f"XSTAGE_COPY_THREADS={raw!r} is not a whole number from 0 to "
                         f"{MAX_THREADS}: unset it for the default ({default} here) or set e.g. "
                         "XSTAGE_COPY_THREADS=0 (off)")
    return value, None


#: This process's default helpers, where the client's tuning leaves them unset
#: (``TransportTuning.copy_threads`` is None: ``XSTAGE_COPY_THREADS`` unset). The client reads
#: ``XSTAGE_COPY_THREADS`` through its tuning, which names a malformed value.
COPY_THREADS = copy_threads_default({})[0]


def _read_load() -> tuple[int, int] | None:
    """(tasks running or runnable now, this one included; the machine's CPUs), or None.

    The doorbell's reader (``shm.read_load``); None where ``/proc/loadavg`` cannot be read.
    """
    return shm.read_load()


def free_helpers(threads: int, load: tuple[int, int] | None, allowed: int) -> int:
    """How many of ``threads`` helpers a copy may wake now: as many CPUs as nobody runs on.

    ``load`` is ``_read_load()``'s (running, CPUs); a helper woken onto a CPU that another task
    holds waits for it, and a range it holds meanwhile keeps the caller waiting (beside busy
    neighbours, a scheduler slice: milliseconds). None (unknown): every helper.
    """
    if load is None:
        return threads
    running, cpus = load
    return max(0, min(threads, min(cpus, allowed) - running))


class _Job:
    """One split copy: its ranges, who takes the next, who finished, the first error.

    NOTE: no helper keeps a reference to a range (or to the job, whose ranges the caller drops
    once it is done) after its last one: a view kept alive in a helper keeps the caller's output
    array alive, and the array freed later, from the helper, after the caller's next one was
    allocated, made glibc grow and trim its heap on every call (page faults, ~2x the copy).
    """

    __slots__ = ("done", "error", "finished", "n", "parts", "take")

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]] | None, done: Any) -> None:
        self.parts = parts
        self.n = len(parts or ())
        self.take = itertools.count().__next__  # atomic under the GIL
        self.finished = itertools.count(1).__next__
        self.done = done  # the pool's, held: released by whoever finishes the last range
        self.error: BaseException | None = None

    def work(self) -> None:
        n = self.n
        while True:
            i = self.take()
            if i >= n:
                return
            try:
                # The whole copy's casting was checked; a range taken is not done, so the
                # caller has not dropped the ranges yet.
                np.copyto(*self.parts[i], casting="unsafe")  # type: ignore[index]
            except BaseException as exc:  # kept for the caller, who raises it
                if self.error is None:
                    self.error = exc
            if self.finished() == n:
                self.done.release()


class CopyPool:
    """A client's helper threads for large copies (``threads`` of them; 0: every copy inline).

    ``copyto(dst, src)`` is ``np.copyto(dst, src, casting=...)`` with the same result, bit for
    bit; it is split only when ``dst`` holds at least ``min_bytes``, the shapes are equal, the
    dtype holds no objects, no other thread is splitting a copy on this pool, the pool is open,
    and some CPU is free (``free_helpers``: the machine's running tasks, sampled at most every
    ``LOAD_SAMPLE_SECONDS``; as many helpers wake as CPUs are free). Thread-safe; ``close`` ends
    the helpers (a later large copy runs inline).
    """

    def __init__(self, threads: int | None = None, min_bytes: int | None = None) -> None:
        self.threads = max(0, int(COPY_THREADS if threads is None else threads))
        wanted = MIN_BYTES if min_bytes is None else int(min_bytes)
        self.min_bytes = max(2 * MIN_RANGE, wanted) if self.threads else 1 << 62
        self.split = 0  # copies split so far (tests, benchmarks)
        self._busy = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []
        self._pid = 0
        self._closed = False
        self._allowed = allowed_cpus()
        # Held between copies; one lock for every copy (a lock is malloc'd: a new one per copy
        # lands above the last output array on the heap and made glibc trim and re-fault it).
        self._done = threading.Lock()
        self._done.acquire()
        self._free = self.threads  # helpers free to wake, as last sampled
        self._sampled = -1.0

    @property
    def started(self) -> bool:
        """True while helper threads of this process are running."""
        return bool(self._helpers) and self._pid == os.getpid()

    def copyto(self, dst: np.ndarray, src: np.ndarray, casting: Any = "same_kind") -> None:
        """``np.copyto(dst, src, casting=casting)``, on several CPUs when it is large."""
        if dst.nbytes < self.min_bytes or dst.shape != src.shape or dst.dtype.hasobject \
                or src.dtype.hasobject or not np.can_cast(src.dtype, dst.dtype, casting) \
                or not self._busy.acquire(blocking=False):
            np.copyto(dst, src, casting=casting)
            return
        try:
            now = time.monotonic()
            if now - self._sampled > LOAD_SAMPLE_SECONDS:
                self._sampled = now
                self._free = free_helpers(self.threads, _read_load(), self._allowed)
            helpers = self._free
            parts = _ranges(dst, src, max(MIN_RANGES, (helpers + 1) * RANGES_EACH)) \
                if helpers else []
            if len(parts) < 2 or not self._start():
                np.copyto(dst, src, casting=casting)
                return
            job = _Job(parts, self._done)
            put = self._jobs.put
            for _ in range(min(helpers, len(parts) - 1)):
                put(job)
            job.work()
            job.done.acquire()
            job.parts = None  # the views go here, in the caller (see _Job)
            self.split += 1
            if job.error is not None:
                raise job.error
        finally:
            self._busy.release()

    def empty_copy(self, value: np.ndarray) -> np.ndarray:
        """A new C-ordered array equal to ``value``: ``np.array(value, copy=True, order="C")``.

        A large one's pages are first touched by the threads that copy into them.
        """
        if value.nbytes < self.min_bytes:
            return np.array(value, copy=True, order="C")
        out = np.empty(value.shape, dtype=value.dtype)
        self.copyto(out, value, casting="no")
        return out

    def close(self) -> None:
        """End the helper threads (idempotent); later copies run in the calling thread."""
        with self._busy:
            self._closed = True
            helpers, self._helpers = self._helpers, []
            if self._pid == os.getpid():
                for _ in helpers:
                    self._jobs.put(None)
                for t in helpers:
                    t.join(timeout=5)

    def _start(self) -> bool:
        if self._closed:
            return False
        if self._helpers and self._pid == os.getpid():
            return True
        # First large copy (or the first in a forked child, which has none of the threads).
        self._jobs = queue.SimpleQueue()
        self._pid = os.getpid()
        self._helpers = [threading.Thread(target=_serve, args=(self._jobs,), daemon=True,
                                          name=f"xstage-copy-{i}") for i in range(self.threads)]
        for t in self._helpers:
            t.start()
        return True


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.work()
        job = None  # not kept while this thread waits for the next (see _Job)


def _ranges(dst: np.ndarray, src: np.ndarray, most: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """At most ``most`` pairs of (dst part, src part) that cover both once.

    Where both are C-contiguous each part is one contiguous byte range of at least about
    ``MIN_RANGE`` bytes, starting on a page (the first excepted); else the first axis longer
    than 1 is split (each part of a C-contiguous ``dst`` is still one byte range).
    """
    n = min(most, dst.nbytes // MIN_RANGE)
    if n < 2:
        return []
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        d, s = dst.reshape(-1), src.reshape(-1)  # views: both are contiguous
        count, item = d.size, dst.dtype.itemsize
        step = -(-count // n)
        first = 0
        if item and _PAGE % item == 0:  # ranges start on pages: one thread faults each page
            per_page = _PAGE // item
            step = -(-step // per_page) * per_page
            first = (-d.__array_interface__["data"][0] % _PAGE) // item
        cuts = [0, *range(first + step if first else step, count, step), count]
        return [(d[a:b], s[a:b]) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    # A strided side (a transposed input, a sliced view): split the first axis longer than 1.
    while dst.ndim > 1 and dst.shape[0] == 1:
        dst, src = dst[0], src[0]
    rows = dst.shape[0] if dst.ndim else 0
    n = min(n, rows)
    if n < 2:
        return []
    step = -(-rows // n)
    return [(dst[i:i + step], src[i:i + step]) for i in range(0, rows, step)]

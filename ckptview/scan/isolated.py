"""Listing files in worker processes with resource limits: a parser that crashes (a signal)
or blows up its memory takes down a worker, never the process that asked (a long-running
dashboard). Pass :class:`IsolatedExecutor` as ``ckptview.open(..., executor=...)``.

A worker that dies breaks the pool: the jobs it held are run again one at a time, each in a
fresh single-worker pool, so the file that kills its worker is found and becomes an error row
(the others are listed); the pool is replaced for the next scan.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

MEMORY_LIMIT = 4 << 30  # address space per worker
CPU_SECONDS = 600  # CPU time per worker (a parser spinning forever is killed)


def _limit(memory: int | None, cpu: int | None, fault_log: str | None = None) -> None:
    import resource

    if fault_log:  # a fatal signal is written here before it kills the worker
        import faulthandler

        faulthandler.enable(open(fault_log, "a"), all_threads=False)  # noqa: SIM115 - kept open

    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if cpu:
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, hard))


class IsolatedExecutor(Executor):
    """A process pool whose workers run with ``memory`` bytes of address space and ``cpu``
    seconds of CPU, replaced when one dies; :meth:`rerun` runs one job in a fresh worker."""

    isolates = True  # run_listings sends every job here, even a single one
    #: stats and diffs read values in threads of the caller (each job here would carry the
    #: whole scan across the process boundary)
    lists_only = True

    def __init__(self, max_workers: int = 2, memory: int | None = MEMORY_LIMIT,
                 cpu: int | None = CPU_SECONDS, context: str = "forkserver"):  # fmt: skip
        self.max_workers = max_workers
        self.memory = memory
        self.cpu = cpu
        self.context = multiprocessing.get_context(context)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.restarts = 0  # pools replaced after a worker died

    def _new_pool(self, workers: int, fault_log: str | None = None) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=self.context, initializer=_limit,
                                   initargs=(self.memory, self.cpu, fault_log))  # fmt: skip

    def pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None or getattr(self._pool, "_broken", False):
                if self._pool is not None:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self.restarts += 1
                self._pool = self._new_pool(self.max_workers)
            return self._pool

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        try:
            return self.pool().submit(fn, *args, **kwargs)
        except BrokenProcessPool:  # broken between the check and the submit
            return self.pool().submit(fn, *args, **kwargs)

    def rerun(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)`` alone in a fresh worker; raises :class:`WorkerDied` if it dies."""
        fd, fault_log = tempfile.mkstemp(prefix="ckptview-worker-", suffix=".log")
        os.close(fd)
        pool = self._new_pool(1, fault_log)
        try:
            future = pool.submit(fn, *args, **kwargs)
            workers = list((getattr(pool, "_processes", None) or {}).values())
            try:
                return future.result()
            except BrokenProcessPool:
                raise WorkerDied(_cause(workers, fault_log)) from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            os.unlink(fault_log)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
                self._pool = None


class WorkerDied(RuntimeError):
    """A worker process died while listing a file (a signal or a resource limit)."""


#: what faulthandler writes for a fatal signal -> the signal
FAULTS = {"Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT",
          "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}  # fmt: skip


def _cause(workers: list, fault_log: str | None = None) -> str:
    for w in workers:
        w.join(5)
    # the worker's own last words first: its exit status can be lost to a race (the pool's
    # manager thread joins the same process; under forkserver the loser reads 255)
    text = open(fault_log, errors="replace").read() if fault_log else ""  # noqa: SIM115
    name = next((sig for words, sig in FAULTS.items() if words in text), None)
    if name:
        return f"the worker process listing it was killed by {name}"
    code = next((w.exitcode for w in workers if w.exitcode not in (None, 0)), None)
    if code is None:
        return "the worker process listing it died"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the worker process listing it was killed by {name}"
    return f"the worker process listing it exited with code {code}"

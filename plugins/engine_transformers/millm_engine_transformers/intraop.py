"""One OpenMP team in the process: the model's thread computes on every core, other threads on one.

torch's CPU kernels (and MKL inside them) run on GNU OpenMP, which gives each thread
that starts a parallel region a team of its own. When the threads of all teams
outnumber the CPUs, libgomp throttles every team: its idle threads spin about 100
times instead of about 300,000 before they sleep, so each of the hundreds of
parallel regions in a forward pass pays a futex wake-up. Measured on 2 cores, the
batch decoded 22% slower once one other thread had run a parallel copy. In a server
that happens on its own: a plugin loads an SAE on an executor thread, a request with
penalties allocates a vocabulary-sized tensor on its reader's thread, the engine
thread scores.

So, on a CPU device, the engine makes one thread per model the only one with a full
team: threads default to one OpenMP thread and one MKL thread (``confine``), and
the thread that runs the model takes the full count for itself (``IntraOp.enter``).
That thread is the batch scheduler's when batching is on (the engine's other model
work runs there too), else the engine thread.
"""

from __future__ import annotations

import contextvars
import ctypes
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

import torch

log = logging.getLogger("millm.intraop")
T = TypeVar("T")

#: The intra-op thread count before ``confine`` first lowered the default (a reload must not read 1).
_FULL: int | None = None


class IntraOp:
    """The intra-op thread count of the model's thread, and how to take it on the current thread."""

    def __init__(self, threads: int, libgomp: ctypes.CDLL, libtorch: ctypes.CDLL | None) -> None:
        self.threads = threads
        self._libgomp = libgomp
        self._libtorch = libtorch
        self._local = threading.local()

    @classmethod
    def confine(cls, device: torch.device) -> IntraOp | None:
        """Threads now default to one intra-op thread; the count they had is kept for the model's thread.

        None on a GPU (its kernels do not run on OpenMP) or where torch's OpenMP or MKL
        cannot be reached (another build): nothing is changed then.
        """
        if device.type != "cpu" or not torch.backends.openmp.is_available():
            return None
        global _FULL
        if _FULL is None:  # what this process would use: OMP_NUM_THREADS, or the cores
            _FULL = torch.get_num_threads()
        threads = _FULL
        if threads <= 1:
            return None
        torch.set_num_threads(1)  # the default of threads yet to start torch work (and this one's)
        mapped = _mapped()
        libgomp = _torchs_openmp(threads, _opened(mapped, "libgomp"))
        if libgomp is None:
            torch.set_num_threads(threads)
            log.info("torch's OpenMP runtime not found among those loaded: intra-op threads left as they were")
            return None
        return cls(threads, libgomp, next(iter(_opened(mapped, "libtorch_cpu.so")), None))

    def enter(self) -> None:
        """Give the current thread the full count (once per thread): call it where model work starts."""
        if getattr(self._local, "entered", False):
            return
        torch.get_num_threads()  # torch's per-thread start-up first, or it would undo what follows
        self._libgomp.omp_set_num_threads(self.threads)
        if self._libtorch is not None and hasattr(self._libtorch, "mkl_set_num_threads_local"):
            count = ctypes.c_int(self.threads)
            self._libtorch.mkl_set_num_threads_local(ctypes.byref(count))
        self._local.entered = True


def in_passing_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own that then ends: the OpenMP team it starts (loading, converting
    weights) ends with it instead of staying beside the model's."""
    result: list[T] = []
    failure: list[BaseException] = []
    context = contextvars.copy_context()

    def body() -> None:
        try:
            result.append(context.run(fn))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name="millm-load")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _torchs_openmp(threads: int, copies: list[ctypes.CDLL]) -> ctypes.CDLL | None:
    """The OpenMP runtime torch's kernels use, among the copies of libgomp in this process.

    Usually torch's own (``torch/lib``), but a process that loaded another libgomp first
    (llama.cpp's) binds torch to that one. The right copy is the one whose setting torch
    sees; the current thread's count is left at 1 either way.
    """
    for library in copies:
        if not hasattr(library, "omp_set_num_threads"):
            continue
        library.omp_set_num_threads(threads)
        seen = torch.get_num_threads()
        library.omp_set_num_threads(1)
        if seen == threads:
            return library
    return None


def _mapped() -> set[str]:
    """The files this process maps (empty where there is no ``/proc``: not Linux, nothing to tune)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return set()


def _opened(mapped: set[str], name: str) -> list[ctypes.CDLL]:
    """Every mapped shared library whose file name starts with ``name``, opened again (no new copy)."""
    libraries = []
    for path in sorted(p for p in mapped if os.path.basename(p).startswith(name)):
        try:
            libraries.append(ctypes.CDLL(path))
        except OSError as exc:
            log.info("cannot open %s (%s)", path, exc)
    return libraries

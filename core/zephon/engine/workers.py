"""Document operators in worker processes: ``options(workers=N)``.

A dataset source hands each read-ahead batch of raw rows (text, a few fields) to one of ``N``
processes, which runs the pipeline's document operators (decode, map, filter, tokenize, ...)
over it, exactly as :func:`~zephon.engine.transform.transform_documents` does in the caller's
thread with ``workers=0``. A source keeps up to ``N`` batches in flight and takes the results in
submission order, so what a lane sees, its state and every resume are the same for every
``N``: the operators are pure and each document is transformed alone.

Transport: the batch goes out pickled (rows of text are small next to their tokens); the
result comes back through one shared-memory block per batch. The worker pickles the result
with protocol 5, which leaves every NumPy buffer (token ids, loss masks) out of band, copies
those buffers back to back into a ``multiprocessing.shared_memory`` block and returns only the
pickle's skeleton and the buffer sizes. The caller copies the block once and rebuilds the
arrays as views of that copy: no token array is pickled, and a batch costs one extra copy of
its tokens.

Each worker's tokenizer uses the process's cores divided among the workers (its Rust thread
pool, ``RAYON_NUM_THREADS`` unless the environment sets it), so N workers do not start N pools
as wide as the machine: 2 workers with one thread each spend less CPU per token than with two
threads each (measured: docs/measurements.md).

Trade-offs (``benchmarks/throughput.py``; measured: docs/measurements.md): workers pay off
where per-document Python work or tokenization dominates and cores are free; each worker loads
the operators (the tokenizer) once, a start-up cost, and holds its own copy of them, its
memory growing from the start to its peak mostly by the tokenizer's working memory for one
read-ahead batch (``CHUNK_CHARS`` in :mod:`zephon.engine.dataset_source`). Operators and their
functions must pickle (module-level functions, not lambdas); :class:`DocumentWorkers` checks
that when it is built and names the operator.

The processes are spawned, so each imports the program's main module the way Python's spawn
start method does (that is what lets a ``map`` function defined in the training script reach
them; keep the script's work under ``if __name__ == "__main__":``). Its imports are paid per
worker: a main module that imports torch delays the first batch several times over and
multiplies each worker's memory (measured: docs/measurements.md).

Results nobody takes (a run that stops mid-stream, a state load, a collected pipeline) are
freed when the workers stop, at the latest at interpreter exit, before modules are torn down.

Ended from outside. A worker watches its parent (:func:`_exit_with_parent`: a thread blocked on
a pidfd of the parent, Linux 5.3+, else polling ``getppid`` every 0.2 s) and exits as soon as
the parent is gone, killed by SIGKILL included; multiprocessing's resource tracker, whose pipe
the parent and the workers hold, then sees it close and unlinks the shared memory and
semaphores they registered, so nothing stays in ``/dev/shm`` (a process the trainer forks
after the workers start holds that pipe too, and delays this until it exits). A parent-death
signal, ``PR_SET_PDEATHSIG``, would fire when the *thread* that started the workers ends, and
the producer thread that starts them ends with every iterator; a pipe whose end of file the
workers watch closes only when no process holds its other end, which any process the trainer
forks meanwhile would; a pidfd needs nothing inherited. SIGTERM, which Slurm and torchrun
send, unwinds the main thread as SIGINT does (:func:`_unwind_on_sigterm`), so the pipeline
closes and stops its workers itself; a handler the trainer installed is left alone.
A worker that dies (the out-of-memory killer's SIGKILL, a crash in native code, a script that
starts the loader outside its main guard) breaks the pool: the next batch raises
:class:`~zephon.errors.WorkerError` naming its pid and how it ended. Operators a worker cannot
unpickle are named in a ``ConfigError`` with the first batch. The operators travel to the
workers through shared memory rather than the start-up pipe, so a worker that dies at once
cannot leave the caller blocked writing to it.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import secrets
import select
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import shared_memory
from typing import Any

from zephon.engine.transform import transform_documents
from zephon.errors import ConfigError, WorkerError
from zephon.ops.base import DocumentOperator

Rows = list[tuple[list[Any], list[str]]]
_OPS: dict[int, tuple[DocumentOperator, ...]] = {}
_LOAD_ERRORS: list[str] = []
_OWNER = os.getpid()
"""The process whose pipeline the shared memory blocks serve: this one, or in a worker the
process that started it. Blocks are named ``zephon-<owner>-<random>``, so a leak is traced to
its process (and tests look for their own blocks only)."""


def block_prefix(owner: int | None = None) -> str:
    """The name prefix of the shared memory blocks serving process ``owner`` (default:
    this process's pipeline)."""
    return f"zephon-{_OWNER if owner is None else owner}-"


def _new_block(size: int) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=block_prefix() + secrets.token_hex(8), create=True,
                                      size=size)


def _start_worker(payload_name: str, payload_size: int, tokenizer_threads: int,
                  parent: int | None = None) -> None:
    global _OWNER
    _OWNER = os.getppid()
    if parent is not None:
        _exit_with_parent(parent)
    # Before the first encode builds the tokenizer's thread pool; the caller's own setting wins.
    os.environ.setdefault("RAYON_NUM_THREADS", str(tokenizer_threads))
    try:
        block = shared_memory.SharedMemory(name=payload_name)
        try:
            payload = bytes(block.buf[:payload_size])
        finally:
            block.close()
        _OPS.update(pickle.loads(payload))
    except Exception as exc:  # an initializer that raises leaves only "terminated abruptly"
        _LOAD_ERRORS.append(f"{type(exc).__name__}: {exc}")


def _exit_with_parent(parent: int) -> None:
    """End this process as soon as process ``parent`` is gone (see the module docstring).

    A daemon thread waits on a pidfd of the parent (Linux 5.3+; readable once it has exited,
    so the exit takes well under a second), else polls ``getppid`` every 0.2 s, which changes
    when the parent dies and this process is handed to init or a subreaper (Linux, macOS).
    ``getppid`` is checked again once the pidfd is open, so a parent that died before it
    (its pid then possibly reused) is not missed. The thread needs the GIL to exit, so a
    worker inside native code that holds the GIL exits when that call returns. On Windows
    ``getppid`` keeps the dead parent's pid and the worker is not ended."""
    if os.getppid() != parent:  # gone already, before this could watch it
        os._exit(1)

    def watch() -> None:
        try:
            handle = os.pidfd_open(parent)
        except (AttributeError, OSError):
            handle = None
        if handle is not None:
            if os.getppid() == parent:
                select.select([handle], [], [])  # readable once the parent has exited
        else:
            while os.getppid() == parent:
                time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="zephon-parent-watch", daemon=True).start()


_USERS: set[int] = set()
"""The :class:`DocumentWorkers` (by id) for which SIGTERM unwinds."""


def _unwind_on_sigterm(user: int) -> None:
    """Make SIGTERM raise SystemExit(143) in the main thread, so that ``finally`` blocks and
    the pipeline's close run and the workers stop, as on SIGINT, while ``user`` (a
    :class:`DocumentWorkers`) exists. Only from the main thread (the only one that may set a
    handler), and only in place of the default action: a trainer's own handler is kept."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is not _raise_exit:
        if current is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _raise_exit)
    _USERS.add(user)


def _restore_sigterm(user: int) -> None:
    """The default action again once the last user is gone (when that happens off the main
    thread, the handler stays, still a clean exit)."""
    _USERS.discard(user)
    if not _USERS and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is _raise_exit:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _shared_copy(data: bytes) -> shared_memory.SharedMemory:
    block = _new_block(max(1, len(data)))
    block.buf[:len(data)] = data
    return block


def _tokenizer_threads(workers: int) -> int:
    """Threads each worker's tokenizer may use: this process's cores shared among the
    workers, so N workers do not each start a pool as wide as the machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // workers)


def _transform(dataset: int, docs: list[Any], labels: list[Any]
               ) -> tuple[bytes, str | None, list[int]]:

    if _LOAD_ERRORS:
        raise ConfigError(
            f"options(workers=...): a worker process cannot load the document operators "
            f"({_LOAD_ERRORS[0]}). Functions given to map/filter must be importable by name: "
            "defined at the top level of a module or of the training script (not under "
            "`if __name__ == '__main__':`, not in a notebook); or use workers=0")
    rows = transform_documents(_OPS[dataset], docs, labels)
    buffers: list[pickle.PickleBuffer] = []
    skeleton = pickle.dumps(rows, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    sizes = [view.nbytes for view in views]
    if not sum(sizes):
        return skeleton, None, sizes
    block = _new_block(sum(sizes))
    offset = 0
    for view, size in zip(views, sizes, strict=True):
        block.buf[offset:offset + size] = view
        offset += size
    name = block.name
    block.close()
    return skeleton, name, sizes


def _unpack(shipped: tuple[bytes, str | None, list[int]]) -> Rows:
    skeleton, name, sizes = shipped
    if name is None:
        return pickle.loads(skeleton, buffers=[b""] * len(sizes))
    block = shared_memory.SharedMemory(name=name)
    try:
        data = bytearray(block.buf[:sum(sizes)])
    finally:
        block.close()
        block.unlink()
    view = memoryview(data)
    buffers, offset = [], 0
    for size in sizes:
        buffers.append(view[offset:offset + size])
        offset += size
    return pickle.loads(skeleton, buffers=buffers)


def _release(shipped: tuple[bytes, str | None, list[int]]) -> None:
    """Free a result's shared memory without reading it."""
    name = shipped[1]
    if name is None:
        return
    try:
        block = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    block.close()
    block.unlink()


def _release_when_done(future: Future) -> None:
    if not future.cancelled() and future.exception() is None:
        _release(future.result())


def _stop(pool: ProcessPoolExecutor, unread: set[Future],
          payload: shared_memory.SharedMemory) -> None:
    """Stop the processes and free every result nobody took (on :meth:`close`, when the
    workers are collected, or at interpreter exit): nothing stays in ``/dev/shm``."""
    pool.shutdown(wait=True, cancel_futures=True)
    payload.close()
    payload.unlink()
    while True:
        try:
            future = unread.pop()
        except KeyError:  # empty (a source may discard concurrently)
            return
        _release_when_done(future)


class DocumentWorkers:
    """``workers`` processes running the document operators of every dataset.

    ``ops_by_dataset`` maps a dataset's index to its operators. The processes start on the
    first :meth:`submit` (spawned, so the caller's threads are never forked)."""

    def __init__(self, ops_by_dataset: dict[int, Sequence[DocumentOperator]], workers: int):
        self.workers = workers
        self._payload = self._pickle(ops_by_dataset)
        self._pool: ProcessPoolExecutor | None = None
        self._unread: set[Future] = set()
        self._finalizer: weakref.finalize | None = None
        _unwind_on_sigterm(id(self))
        weakref.finalize(self, _restore_sigterm, id(self))

    @staticmethod
    def _pickle(ops_by_dataset: dict[int, Sequence[DocumentOperator]]) -> bytes:
        for ops in ops_by_dataset.values():
            for op in ops:
                try:
                    pickle.dumps(op)
                except Exception as exc:
                    raise ConfigError(
                        f"options(workers=...) runs {op.spec.title} in worker processes, but "
                        f"it cannot be sent there ({type(exc).__name__}: {exc}); define its "
                        "functions at module level, or use workers=0") from None
        return pickle.dumps({i: tuple(ops) for i, ops in ops_by_dataset.items()})

    @property
    def in_flight(self) -> int:
        """Batches a source keeps submitted: one per process."""
        return self.workers

    @staticmethod
    def takes(ops: Sequence[DocumentOperator]) -> bool:
        """Whether a source with operators ``ops`` sends its batches here: whenever it has
        any, as every operator's work, Python or native, runs on the processes' cores."""
        return bool(ops)

    def submit(self, dataset: int, docs: list[Any], labels: list[Any]) -> Future:
        if self._pool is None:
            # The operators reach the workers through shared memory, not the start-up pipe:
            # a child that dies before reading (a script that starts the loader outside its
            # main guard) would leave the writer blocked on a full pipe forever.
            payload = _shared_copy(self._payload)
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(payload.name, len(self._payload), _tokenizer_threads(self.workers),
                          os.getpid()))
            self._finalizer = weakref.finalize(self, _stop, self._pool, self._unread, payload)
        try:
            future = self._pool.submit(_transform, dataset, docs, labels)
        except BrokenProcessPool:
            raise self._death() from None
        self._unread.add(future)
        return future

    def result(self, future: Future) -> Rows:
        try:
            shipped = future.result()
        except BrokenProcessPool:
            raise self._death() from None
        self._unread.discard(future)
        return _unpack(shipped)

    def _death(self) -> WorkerError:
        """What the trainer is told when a worker process dies (the pool is then unusable)."""
        processes = list((getattr(self._pool, "_processes", None) or {}).items())
        deadline = time.monotonic() + 1.0  # the pool may notice a death before it is reaped
        while not any(p.exitcode for _, p in processes) and time.monotonic() < deadline:
            time.sleep(0.01)
        exits = {pid: p.exitcode for pid, p in processes if p.exitcode}
        # The pool stops the survivors with SIGTERM once one has died.
        culprits = {pid: c for pid, c in exits.items() if c != -signal.SIGTERM} or exits
        deaths = []
        for pid, code in sorted(culprits.items()):
            if code == -signal.SIGKILL:
                deaths.append(f"pid {pid} was killed by SIGKILL, which the kernel's "
                              "out-of-memory killer sends (see dmesg): give the run more "
                              "memory or fewer workers")
            elif code < 0:
                name = signal.Signals(-code).name if -code in signal.valid_signals() \
                    else f"signal {-code}"
                deaths.append(f"pid {pid} was killed by {name}")
            else:
                deaths.append(f"pid {pid} exited with status {code} after printing its "
                              "error (a script that starts the loader outside `if __name__ "
                              "== '__main__':` makes each worker start it again, and fail)")
        return WorkerError(
            f"zephon: a document worker process died: {'; '.join(deaths) or 'no exit status'}. "
            f"options(workers={self.workers}) cannot go on. The loader state in your last "
            "checkpoint is not affected and resumes exactly with any number of workers.")

    def discard(self, future: Future) -> None:
        """Free ``future``'s result now, or when it is done; nothing if already freed."""
        if future in self._unread:
            self._unread.discard(future)
            if not future.cancel():
                future.add_done_callback(_release_when_done)

    def close(self) -> None:
        """Stop the processes (started again by the next :meth:`submit`)."""
        if self._finalizer is not None:
            self._finalizer()
        self._pool = self._finalizer = None

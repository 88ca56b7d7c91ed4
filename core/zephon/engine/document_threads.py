"""Document operators read ahead on threads of their own.

With ``workers=0`` and ``prefetch > 0`` every dataset source of a rank whose operators release
the GIL for their work (:attr:`~zephon.ops.base.DocumentOperator.releases_gil`: tokenizing)
hands its read-ahead batches to one or two threads (:func:`threads_for_this_rank`), which run
the document operators over them exactly as :func:`~zephon.engine.transform.transform_documents`
does in the caller's thread. Sources whose operators are Python-bound (pretokenized ids,
map/filter, chat rendered by prefixes) run them on the producer thread: on threads of
their own they would only take turns at the GIL with it, each turn a context switch: more
switches and fewer tokens/s than without the threads (``benchmarks/operator_threads.py``;
measured: docs/measurements.md).

A source keeps :attr:`DocumentThreads.in_flight` batches submitted and takes the results in
submission order, so its documents, its state and every resume are what they are without the
threads, with one thread or two (tested); only the timing changes.

Why: the tokenizer's Rust backend releases the GIL and keeps both cores of a 2-core machine
busy while it encodes, but everything around it (reading Parquet, turning ids into arrays,
packing, batching) is Python that holds the GIL. Done in turns, the cores idle for that
Python work; with the next batch already encoding, they do not. With one thread the encoder
still idles while that thread turns a batch's ids into arrays and frees the tokenizer's
encodings (the GIL held) and in the tail of each call, when one of its pool's threads has run
out of texts. A second thread has its batch ready meanwhile: its call takes the pool the
moment the first one's returns (:mod:`zephon.text.pool_turns`; two calls let into the pool at once
return together and leave it idle while both convert). Side by side
(``benchmarks/throughput.py``), two threads taking turns come closest to the bare tokenizer,
ahead of two calling at once and of one thread, and keep the cores busier than the bare loop,
which converts ids the same way (measured: docs/measurements.md). What is left is the
pipeline's other Python work (reading, packing, batching, tensors, printed by thread), which
runs on the cores the encoder would otherwise have. Where ranks share the cores, the other
ranks fill those gaps and a second thread only adds work: two ranks on 2 cores delivered fewer
microbatches with two threads each than with one (``benchmarks/trainer_wait``'s capacity;
measured: docs/measurements.md), hence one thread unless the rank has two cores to itself.

The threads serve every source of the rank in submission order, so the batch a source needs
now could wait behind other sources' read-ahead (with 4 lanes and two threads, up to 11
batches): a batch no thread has started when its source asks for it is taken back and run on
the asking thread instead. Operators must therefore be pure, as for worker processes: several
batches may be transformed at once, one on each thread (the Rust tokenizer encodes from
several threads safely).

Limits: at most two threads per rank, whatever the number of sources. A third thread on 2
cores kept them no busier and its extra call in flight cost the tokenizer more CPU a token,
for no more throughput than two (measured before calls took turns: docs/measurements.md;
with turns a third thread has nothing to do that the second does not). Memory: each source
holds up to ``in_flight`` batches of at most ``CHUNK_CHARS`` of text and their tokens, 3 x 1
MiB of text and about 3 MiB of tokens per source with two threads.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from zephon import background
from zephon.engine.transform import transform_documents
from zephon.ops.base import DocumentOperator

Rows = list[tuple[list[Any], list[str]]]
THREAD_NAME = "zephon-documents"
_STOP = None


def threads_for_this_rank() -> int:
    """2 when this process has at least 2 cores to itself, else 1: the cores it may run on,
    shared among the ranks of its node (``LOCAL_WORLD_SIZE``, which torchrun sets; 1 when
    unset). Two threads keep the tokenizer encoding one batch while the other thread turns the
    last one into arrays (GIL held); where ranks already share the cores, the other ranks fill
    that gap and a second thread only adds a second batch's encoding to the same cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return 2 if cores // local_ranks >= 2 else 1


def _serve(requests: queue.SimpleQueue) -> None:
    while True:
        request = requests.get()
        if request is _STOP:
            return
        if request.set_running_or_notify_cancel():
            try:
                request.set_result(request.run())
            except BaseException as exc:
                request.set_exception(exc)
        del request


def _stop(requests: queue.SimpleQueue, threads: tuple[threading.Thread, ...],
          registration: int, cancel_pending: bool = False) -> None:
    """Tell ``threads`` to stop once they have finished what they were given, or, with
    ``cancel_pending`` (at exit), once they finish the batch each is running: the batches no
    thread has started are cancelled. Each running batch is at most ``CHUNK_CHARS`` of text,
    well under a second.

    The registration stays (:mod:`zephon.background` forgets it once the threads have
    ended): a pipeline dropped as the process exits (a loop left by Ctrl-C or SIGTERM) stops
    its threads here without waiting, and the exit must still wait for a thread inside the
    tokenizer, or the interpreter's end of it aborts the process."""
    if cancel_pending:
        while True:
            try:
                pending = requests.get_nowait()
            except queue.Empty:
                break
            if pending is not _STOP:
                pending.cancel()
    for _ in threads:
        requests.put(_STOP)


class _Batch(Future):
    """A submitted batch: its result, and the work that makes it, run once by whichever
    thread gets to it (a document thread, or the source taking it back)."""

    def __init__(self, ops: tuple[DocumentOperator, ...], docs: list[Any], labels: list[Any]):
        super().__init__()
        self._work: tuple[Any, ...] | None = (ops, docs, labels)

    def run(self) -> Rows:

        work, self._work = self._work, None
        assert work is not None
        return transform_documents(*work, lazy=True)


class DocumentThreads:
    """The threads running the document operators of every dataset of a rank.

    ``ops_by_dataset`` maps a dataset's index to its operators; ``threads`` defaults to
    :func:`threads_for_this_rank`. The threads start on the first :meth:`submit` (again in a
    forked child, where the parent's threads do not exist) and stop when this object is
    collected or :meth:`close` is called."""

    def __init__(self, ops_by_dataset: dict[int, Sequence[DocumentOperator]],
                 threads: int | None = None):
        self._ops = {i: tuple(ops) for i, ops in ops_by_dataset.items()}
        self.threads = threads or threads_for_this_rank()
        self.in_flight = self.threads + 1
        """Batches a source keeps submitted: one more than there are threads, so that while
        the source waits for the oldest, every thread has one to go on with."""
        self._requests: queue.SimpleQueue | None = None
        self._pid = -1
        self._registration: int | None = None
        self._finalizer: weakref.finalize | None = None

    @staticmethod
    def takes(ops: Sequence[DocumentOperator]) -> bool:
        """Whether a source with operators ``ops`` sends its batches here: when one of them
        releases the GIL for its work (:attr:`DocumentOperator.releases_gil`). Python-bound
        operators stay on the source's own thread, where these threads could only take turns
        at the GIL with it."""
        return any(op.releases_gil for op in ops)

    def submit(self, dataset: int, docs: list[Any], labels: list[Any]) -> Future:
        if self._requests is None or self._pid != os.getpid():
            self._start()
        assert self._requests is not None
        batch = _Batch(self._ops[dataset], docs, labels)
        self._requests.put(batch)
        return batch

    def _start(self) -> None:
        requests: queue.SimpleQueue = queue.SimpleQueue()
        threads = tuple(threading.Thread(target=_serve, args=(requests,), name=THREAD_NAME,
                                         daemon=True) for _ in range(self.threads))
        for thread in threads:
            thread.start()
        # Stopped before the interpreter tears down (zephon.background): a daemon thread
        # still inside the Rust tokenizer then would abort the process.
        registration = background.register(
            lambda: _stop(requests, threads, registration, cancel_pending=True),
            lambda: threads)
        self._requests, self._pid, self._registration = requests, os.getpid(), registration
        self._finalizer = weakref.finalize(self, _stop, requests, threads, registration)

    @staticmethod
    def result(future: Future) -> Rows:
        """The batch's rows. One no thread has started is taken back and run here: the
        threads serve every source of the rank in turn, and the batch a source needs now must
        not wait behind other sources' read-ahead."""
        if isinstance(future, _Batch) and future.cancel():
            return future.run()
        return future.result()

    @staticmethod
    def discard(future: Future) -> None:
        """Forget a batch nobody will read: it is not run if it has not started."""
        future.cancel()

    def close(self) -> None:
        """Stop the threads once they have finished what they were given (started again by
        the next :meth:`submit`)."""
        if self._finalizer is not None:
            self._finalizer()
        self._requests = self._finalizer = None

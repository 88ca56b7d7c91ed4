"""Document operators one read-ahead batch ahead, on a thread of their own.

With ``workers=0`` and ``prefetch > 0`` every dataset source of a rank hands its read-ahead
batches to one thread, which runs the document operators over them exactly as
:func:`~zephon.engine.source.transform_documents` does in the caller's thread. A source keeps
:attr:`DocumentThread.in_flight` batches submitted and takes the results in submission order,
so its documents, its state and every resume are what they are without the thread (tested);
only the timing changes.

Why: the tokenizer's Rust backend releases the GIL and keeps both cores of a 2-core machine
busy while it encodes, but everything around it (reading Parquet, turning ids into arrays,
packing, batching) is Python that holds the GIL. Done in turns, the cores idle for that
Python work, some 10% of the time; with the next batch already encoding, they do not. On a
2-core machine (``benchmarks/throughput.py``) the pipeline runs at 0.93x the bare tokenizer
(which converts ids the same way), at 1.06x its CPU per token. What is left, per 12M tokens:
the encoder idles about 0.45 s while this thread turns a batch's ids into arrays and frees the
tokenizer's encodings (about 24 and 10 ns a token, the GIL held), and the pipeline's other
Python work (reading, packing, batching, tensors: about 0.9 s of CPU) takes its share of the
two cores the encoder would otherwise have. A second thread to fill the idle time, or leaving
the conversion to the source, measured no faster: running Python beside the encoder costs it
more CPU per token (two batches' encodings, about 550 bytes a token, alive at once).

The thread serves every source of the rank in submission order, so the batch a source needs
now could wait behind other sources' read-ahead (with 4 lanes, up to 7 batches, a second or
more): a batch the thread has not started when its source asks for it is taken back and run
on the asking thread instead. Operators must therefore be pure, as for worker processes: two
batches may be transformed at once, one on each thread (the Rust tokenizer encodes from
several threads safely).

Limits: one thread per rank, whatever the number of sources. Memory: each source holds up to
``in_flight`` batches of at most ``CHUNK_CHARS`` of text and their tokens, 2 x 1 MiB of text
and about 2 MiB of tokens per source with the defaults.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from zephon.ops.base import DocumentOperator

Rows = list[tuple[list[Any], list[str]]]
_STOP = None


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


class _Batch(Future):
    """A submitted batch: its result, and the work that makes it, run once by whichever
    thread gets to it (the document thread, or the source taking it back)."""

    def __init__(self, ops: tuple[DocumentOperator, ...], docs: list[Any], labels: list[Any]):
        super().__init__()
        self._work: tuple[Any, ...] | None = (ops, docs, labels)

    def run(self) -> Rows:
        from zephon.engine.source import transform_documents  # source imports this module

        work, self._work = self._work, None
        assert work is not None
        return transform_documents(*work, lazy=True)


class DocumentThread:
    """One thread running the document operators of every dataset of a rank.

    ``ops_by_dataset`` maps a dataset's index to its operators. The thread starts on the
    first :meth:`submit` (again in a forked child, where the parent's thread does not exist)
    and stops when this object is collected or :meth:`close` is called."""

    in_flight = 2
    """Batches a source keeps submitted: the one it waits for next and one more. Measured on
    2 cores with 1 MiB batches, 2 and 3 in flight gave the same throughput within noise
    (0.92-0.98x and 0.97-0.99x the bare tokenizer of the time, which converted ids with
    ``np.array``) and 4 no more (0.95x); 2 holds less."""

    def __init__(self, ops_by_dataset: dict[int, Sequence[DocumentOperator]]):
        self._ops = {i: tuple(ops) for i, ops in ops_by_dataset.items()}
        self._requests: queue.SimpleQueue | None = None
        self._pid = -1
        self._finalizer: weakref.finalize | None = None

    def submit(self, dataset: int, docs: list[Any], labels: list[Any]) -> Future:
        if self._requests is None or self._pid != os.getpid():
            self._start()
        assert self._requests is not None
        batch = _Batch(self._ops[dataset], docs, labels)
        self._requests.put(batch)
        return batch

    def _start(self) -> None:
        requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(requests,), name="zephon-documents",
                         daemon=True).start()
        self._requests, self._pid = requests, os.getpid()
        self._finalizer = weakref.finalize(self, requests.put, _STOP)

    @staticmethod
    def result(future: Future) -> Rows:
        """The batch's rows. One the thread has not started is taken back and run here: the
        thread serves every source of the rank in turn, and the batch a source needs now must
        not wait behind other sources' read-ahead."""
        if isinstance(future, _Batch) and future.cancel():
            return future.run()
        return future.result()

    @staticmethod
    def discard(future: Future) -> None:
        """Forget a batch nobody will read: it is not run if it has not started."""
        future.cancel()

    def close(self) -> None:
        """Stop the thread once it has finished what it was given (started again by the next
        :meth:`submit`)."""
        if self._finalizer is not None:
            self._finalizer()
        self._requests = self._finalizer = None

"""Exact mixing: each document from the dataset that keeps the lane closest to its target.

Amounts are tokens after tokenization (token mixing) or documents. After ``T`` of them, dataset
``c`` should have delivered ``w_c * T``.

- **By documents** every candidate adds one, so the mixer takes the dataset furthest below its
  target, ``argmax_c(w_c * T - delivered_c)`` (ties to the lowest index): every dataset stays
  within one document of its target at every point.
- **By tokens** documents differ in length (a 200-token web page beside a 2,000-token source
  file), and the dataset furthest below its target may be far above it once its next document
  is added: taken at the start of a lane, one long document makes the lane's first
  microbatches lean to its dataset, and every lane of a run leans the same way at once. So
  the mixer looks at the next document of every dataset still in the mixture (read ahead
  anyway) and takes the one after which the lane is closest to its targets:
  ``argmin_c sum_j |delivered_j + [j = c] s_c - w_j (T + s_c)|`` for next-document sizes
  ``s_c`` (ties to the lowest index). Each dataset then stays within about half of its
  longest document of its target, and lanes no longer lean alike at their start. Measured
  on two datasets mixed 0.7/0.3 (documents of about 200 and 2,000 tokens, 8 lanes, rows of
  2049, ``benchmarks/share_error.py``), the job's share error after 10, 100 and 1,000
  microbatches fell from 0.035 / 0.005 / 0.0003 to 0.014 / 0.0005 / 0.0000.

When a dataset runs out (its next document is None, seen when the mixer looks at it) the lane
stops (``on_exhausted="stop"``) or goes on without it (``"drain"``), the remaining weights
renormalized. Plain Python on purpose: with a handful of datasets a choice costs a few
microseconds, numpy's call overhead would be fifty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon.engine.dataset_source import DatasetSource
from zephon.ops.base import Node
from zephon.records import Doc
from zephon.state_checks import (
    StateFieldError,
    item,
    join,
    need_bool,
    need_counts,
    need_dict,
    need_fields,
    need_int,
    need_list,
    within,
)


class DeficitMixer:
    def __init__(self, weights: Sequence[float]):
        self.weights = [float(w) for w in weights]
        self.delivered = [0] * len(self.weights)
        self.active = [True] * len(self.weights)
        self._normalized = self._normalize()

    def _normalize(self) -> list[float]:
        live = [i for i, a in enumerate(self.active) if a]
        self._sole = live[0] if len(live) == 1 else None
        total = sum(w for w, a in zip(self.weights, self.active, strict=True) if a)
        return [w / total if a and total > 0 else 0.0
                for w, a in zip(self.weights, self.active, strict=True)]

    def snapshot(self) -> dict[str, Any]:
        return {"delivered": list(self.delivered), "active": list(self.active)}

    def restore(self, state: dict[str, Any]) -> None:
        state = need_fields(state, "", ("delivered", "active"))
        n = len(self.weights)
        delivered = need_list(state["delivered"], "delivered", n)
        active = need_list(state["active"], "active", n)
        self.delivered = [need_int(x, item("delivered", i)) for i, x in enumerate(delivered)]
        self.active = [need_bool(x, item("active", i)) for i, x in enumerate(active)]
        self._normalized = self._normalize()

    def choose(self) -> int | None:
        if self._sole is not None:  # one dataset left (or only one): no deficit to compare
            return self._sole
        total = float(sum(self.delivered))
        best, best_deficit = None, 0.0
        for index, (weight, delivered, active) in enumerate(
                zip(self._normalized, self.delivered, self.active, strict=True)):
            if not active:
                continue
            deficit = weight * total - delivered
            if best is None or deficit > best_deficit:
                best, best_deficit = index, deficit
        return best

    def closest(self, sizes: Sequence[int | None]) -> int:
        """The dataset whose next document, of ``sizes[c]`` (None: not a candidate), leaves
        the delivered amounts closest to their targets (see the module docstring)."""
        delivered, weights = self.delivered, self._normalized
        total = float(sum(delivered))
        best, best_error = -1, 0.0
        for index, size in enumerate(sizes):
            if size is None:
                continue
            after = total + size
            error = 0.0
            for j, (weight, amount) in enumerate(zip(weights, delivered, strict=True)):
                error += abs(amount + (size if j == index else 0) - weight * after)
            if best < 0 or error < best_error:
                best, best_error = index, error
        return best

    def record(self, index: int, amount: int) -> None:
        self.delivered[index] += amount

    def deactivate(self, index: int) -> None:
        self.active[index] = False
        self._normalized = self._normalize()


class MixNode(Node):
    """The lane's documents: the deficit mixer's choice among the dataset sources.

    ``on_exhausted="stop"`` ends the lane when the chosen dataset has run out; ``"drain"``
    drops that dataset from the mixture and goes on with the others. Counts per dataset the
    documents (first pieces) and tokens it hands on.
    """

    def __init__(self, sources: list[DatasetSource], weights: Sequence[float], by_tokens: bool,
                 on_exhausted: str):
        self.sources = sources
        self.mixer = DeficitMixer(weights)
        self.by_tokens = by_tokens
        self.stop_when_one_ends = on_exhausted == "stop"
        names = [s.name for s in sources]
        self.documents = dict.fromkeys(names, 0)
        self.tokens = dict.fromkeys(names, 0)
        self._ended = False

    def next(self) -> Doc | None:
        while not self._ended:
            index = self._token_choice() if self.by_tokens else self.mixer.choose()
            if index is None:
                break
            source = self.sources[index]
            doc = source.next()
            if doc is None:
                if self.stop_when_one_ends:
                    break
                self.mixer.deactivate(index)
                continue
            first = doc.doc_start == 0
            if doc.tokens is None:
                self.documents[source.name] += 1
                self.mixer.record(index, 1)
                return doc
            tokens = len(doc.tokens)
            self.tokens[source.name] += tokens
            self.documents[source.name] += first
            self.mixer.record(index, tokens if self.by_tokens else int(first))
            return doc
        self._ended = True
        return None

    def _token_choice(self) -> int | None:
        """By tokens: the dataset whose next document keeps the lane closest to its targets,
        each active dataset's next document looked at (read ahead). A dataset found without
        one is returned, for :meth:`next` to end the lane or drop it from the mixture."""
        mixer = self.mixer
        if mixer._sole is not None:
            return mixer._sole
        sizes: list[int | None] = []
        for index, (source, active) in enumerate(zip(self.sources, mixer.active, strict=True)):
            if not active:
                sizes.append(None)
                continue
            doc = source.peek()
            if doc is None:
                return index
            sizes.append(len(doc.tokens) if doc.tokens is not None else 1)
        return mixer.closest(sizes) if any(s is not None for s in sizes) else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "mixer": self.mixer.snapshot(),
            "sources": [s.snapshot() for s in self.sources],
            "ended": self._ended,
            "stats": {"documents": dict(self.documents), "tokens": dict(self.tokens),
                      "skipped": {s.name: dict(s.skipped) for s in self.sources}},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, refused unless it is one the mixer could have written:
        see :meth:`_check_counts` and :meth:`_check_active`."""
        state = need_fields(state, "", ("mixer", "sources", "ended", "stats"))
        saved = need_list(state["sources"], "sources", len(self.sources))
        for i, (source, part) in enumerate(zip(self.sources, saved, strict=True)):
            with within(item("sources", i)):
                source.restore(part)
        with within("mixer"):
            self.mixer.restore(state["mixer"])
        ended = need_bool(state["ended"], "ended")
        names = [s.name for s in self.sources]
        stats = need_fields(state["stats"], "stats", ("documents", "tokens", "skipped"))
        documents = need_counts(stats["documents"], "stats.documents", names)
        tokens = need_counts(stats["tokens"], "stats.tokens", names)
        self._check_counts(documents, tokens, need_fields(stats["skipped"], "stats.skipped",
                                                          names))
        self._check_active(ended)
        self._ended = ended
        self.documents = documents
        self.tokens = tokens

    def _check_counts(self, documents: dict[str, int], tokens: dict[str, int],
                      skipped: dict[str, Any]) -> None:
        """The mixer's delivered amounts are the counts of what it handed on (tokens when
        mixing by tokens, else documents); the skipped counts are the sources' own."""
        amounts, unit = (tokens, "tokens") if self.by_tokens else (documents, "documents")
        for i, source in enumerate(self.sources):
            name = source.name
            if self.mixer.delivered[i] != amounts[name]:
                raise StateFieldError(
                    item("mixer.delivered", i), f"is {self.mixer.delivered[i]}, but "
                    f"stats.{unit}.{name} is {amounts[name]}: both count what {name!r} "
                    "delivered")
            path = join("stats.skipped", name)
            if need_dict(skipped[name], path) != source.skipped:
                raise StateFieldError(path, f"is {skipped[name]}, but sources[{i}].skipped "
                                            f"is {source.skipped}: both count the same drops")

    def _check_active(self, ended: bool) -> None:
        """With ``stop`` no dataset leaves the mixture (the lane ends instead); with
        ``drain`` the lane ends exactly when the last one has left."""
        active = self.mixer.active
        if self.stop_when_one_ends and not all(active):
            raise StateFieldError(item("mixer.active", active.index(False)),
                                  "is false, but with on_exhausted='stop' no dataset leaves "
                                  "the mixture")
        if not self.stop_when_one_ends and ended == any(active):
            raise StateFieldError("ended", f"is {'true' if ended else 'false'}, but "
                                  + ("datasets are still in the mixture (mixer.active)" if ended
                                     else "no dataset is left in the mixture (mixer.active)"))

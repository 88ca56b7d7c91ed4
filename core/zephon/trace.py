"""What was in step N: the documents of every microbatch a trainer received at given steps.

Global microbatch ``g`` is round ``g // lanes`` of lane ``g % lanes`` (in the last round of
the data, the one :mod:`zephon.engine.last_round` hands out); every data-parallel rank takes
its lanes' microbatches round by round, so with ``k`` microbatches per optimizer step (global
batch size over microbatch size) step ``s`` (from 1) is made of the global microbatches
``[(s - 1) k, s k)`` at any data-parallel size that divides the lanes, and microbatch ``g``
went to data-parallel rank ``g % world_size``. A one-rank pipeline of
the recipe yields the global microbatches in that order, so :func:`trace_steps` iterates one,
from the start or from a checkpoint's loader state (:func:`read_loader_state`), which puts it
at the checkpoint's microbatch without replaying the steps before: tracing one step 10,000
steps into a run costs what the first step of a fresh run costs.

Data that began later than the training, or started over: a loader state records the
trainer's step at which its data began (``start_step``: a run that restarted its data, such
as TorchTitan's ``--checkpoint.exclude_from_loading dataloader``) and the microbatches of
earlier passes over the data since then (``earlier_microbatches``: data that ended and was
started over). With a state, step ``s`` is global microbatches ``[(s - start_step - 1) k -
earlier, ...)`` of the state's pass; a step before the state's data began, or in an earlier
pass, cannot be traced from it and is an error saying which checkpoint can; so is a step past
the end of the data.

Limits: the recipe, seq_len, microbatch size and lanes must be the run's (the loader state's
fingerprint refuses another recipe); datasets must be readable from here. Without a state the
run is taken to have begun its data at step 1 and never started it over.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.artifacts import from_text
from zephon.errors import ConfigError, DataError, StateMismatchError
from zephon.io.formats import RowLabel
from zephon.loader_options import lanes_problem
from zephon.runtime import microbatch_tokens

_LANE_KEY = re.compile(r"(?:^|\.)(lane_\d+)$")


@dataclass
class TracedDocument:
    """One document (or piece of one) in a traced row."""

    dataset: str
    file: str
    row: str
    """Where the row is in its file (:meth:`zephon.io.formats.RowLabel.position`): ``line
    N`` from 1 for JSON Lines, ``row N`` from 0 for Parquet, Arrow and indexed datasets."""
    tokens: int
    start: int
    """The piece's first token within its document (0: the document starts here)."""
    excerpt: str
    epoch: int = 0
    """Which pass over its dataset this reading is from: 0 for the first (a repeated
    dataset's documents come again in passes 1, 2, ...; their record ids end in ``#e1``,
    ``#e2``, ...)."""


@dataclass
class TracedMicrobatch:
    step: int
    global_microbatch: int
    lane: int
    dp_rank: int
    ids: list[str]
    """The record ids, as the adapters' traces write them."""
    rows: list[list[TracedDocument]]
    stage: int | None = None
    """The mixture stage (from 1) the job was in at the microbatch's first token, counting
    the tokens the trainer received (rows times their length) since the data began; None for
    a static mixture. The lanes mix by the tokens their mixers handed on, which trail the
    trainer's count by what waits in packing and shuffle buffers and lead it by padding, so
    within a few microbatches of a boundary the documents may follow either stage."""


def row_lines(traced: TracedMicrobatch) -> list[str]:
    """A traced microbatch's rows as ``zephon trace`` prints them: each row's record id, then
    one line a document (dataset, file and row, tokens, where the piece starts, excerpt)."""
    lines = []
    for row, (record_id, documents) in enumerate(zip(traced.ids, traced.rows, strict=True)):
        lines.append(f"  row {row} {record_id}")
        for d in documents:
            part = "" if d.start == 0 else f" from token {d.start:,}"
            again = f" (pass {d.epoch + 1})" if d.epoch else ""
            lines.append(f"    {d.dataset:<12} {d.file} {d.row}{again}  {d.tokens:,} tokens"
                         f"{part}  {d.excerpt!r}")
    return lines


def trace_line(batch: Any, lanes: int, dp_rank: int, dp_world_size: int,
               tensors: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The JSON line adapters write per microbatch handed to the trainer (``trace_dir``):
    global microbatch index, lane, index in the lane, the rank, the record ids (what
    :func:`trace_steps` lists) and a SHA-256 of each tensor the trainer received."""
    import hashlib

    return {"global_microbatch": batch.global_microbatch(lanes), "lane": batch.lane,
            "index": batch.index, "dp_rank": dp_rank, "dp_world_size": dp_world_size,
            "ids": batch.ids,
            "sha256": {k: hashlib.sha256(v.numpy().tobytes()).hexdigest()
                       for k, v in tensors.items()}, **extra}


def read_loader_state(path: str | Path) -> dict[str, Any]:
    """The lane entries (``{"lane_<l>": entry}``) of a checkpoint's loader state, found by
    their keys in:

    - a TorchTitan (torch.distributed.checkpoint) step directory (``.metadata`` and
      ``*.distcp``): the ``dataloader.lane_<l>`` entries, read without the model;
    - a Megatron-LM checkpoint directory or ``iter_<7 digits>`` folder, in any checkpoint
      format (a ``torch_dist`` one holds a ``.metadata`` too): every
      ``train_dataloader_dprank*.pt`` of the iteration (``latest_checkpointed_iteration.txt``
      says which when the directory holds several);
    - a file written with ``torch.save`` of a ``state_dict()`` (read with
      ``weights_only=True``), or a JSON file of one.

    Nothing is unpickled: entries stored as text (TorchTitan's) are decoded as JSON, and
    every entry is then checked by the pipeline that loads it (:mod:`zephon.artifacts`).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--from-state {str(path)!r} does not exist")
    megatron = path.is_dir() and any(path.glob("mp_rank_*/train_dataloader_dprank*.pt"))
    if (path / ".metadata").is_file() and not megatron:  # Megatron's torch_dist has one too
        return _lanes(_distributed_checkpoint(path), str(path))
    if path.is_dir():
        files = _megatron_files(path)
        merged: dict[str, Any] = {}
        for file in files:
            merged.update(_lanes(_load_file(file), str(file)))
        return merged
    return _lanes(_load_file(path), str(path))


def _distributed_checkpoint(path: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    keys = {k for k in FileSystemReader(str(path)).read_metadata().state_dict_metadata
            if _LANE_KEY.search(k)}
    if not keys:
        raise StateMismatchError(f"{path}: the checkpoint holds no loader state (no "
                                 "dataloader.lane_<l> entries)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming a single process"
        return _load_state_dict_from_keys(keys=keys, checkpoint_id=str(path))


def _megatron_files(path: Path) -> list[Path]:
    if not path.name.startswith("iter_"):
        latest = path / "latest_checkpointed_iteration.txt"
        if latest.is_file():
            path = path / f"iter_{int(latest.read_text().strip()):07d}"
        else:
            iterations = sorted(path.glob("iter_*"))
            if len(iterations) != 1:
                raise ConfigError(f"{path}: name one iter_<7 digits> folder of "
                                  f"{[p.name for p in iterations][:6]}")
            path = iterations[0]
    files = sorted(path.glob("mp_rank_*/train_dataloader_dprank*.pt"))
    if not files:
        raise StateMismatchError(f"{path}: no mp_rank_*/train_dataloader_dprank*.pt loader "
                                 "state files")
    return files


def _load_file(path: Path) -> Any:
    """A state file's content: JSON text, else a ``torch.save`` file read with
    ``weights_only=True`` (which refuses anything but plain data and tensors)."""
    data = path.read_bytes()
    if data[:1] in (b"{", b"[", b" ", b"\n"):
        return from_text(data, str(path))
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StateMismatchError(f"{path}: not a loader state file (neither JSON nor a "
                                 f"torch.save file of plain data: {str(exc)[:200]})") from None


_STEP_FOLDER = re.compile(r"(?:step-|iter_)(\d+)")


@dataclass
class TracedRun:
    """What a loader state tells of the run that wrote it, for :func:`trace_steps`: each
    value None where the state cannot tell."""

    lanes: int
    dp_world_size: int | None
    microbatch_size: int | None
    seq_len: int | None
    """Input tokens a row (the packed rows' length less one)."""
    microbatches_per_step: int | None
    """From the checkpoint's step (the nearest ``step-N`` or ``iter_N`` folder of its path):
    the microbatches trained since the data began over the steps since then."""


def geometry_of(state: dict[str, Any], path: str | Path | None = None) -> TracedRun:
    """The run geometry a loader state (and its checkpoint's path) tells; see
    :class:`TracedRun`."""
    entry = next(iter(state.values()))
    ops = {op.get("op"): op for op in entry["fingerprint"].get("ops", ())
           if isinstance(op, dict)}
    batch = ops.get("batch", {}).get("microbatch_size")
    pack = next((op for name, op in ops.items() if name.startswith("pack")), {})
    max_length = pack.get("max_length") if pack.get("flat", True) else None
    per_step = None
    parts = reversed(Path(path).parts) if path is not None else ()
    found = next((m for m in map(_STEP_FOLDER.fullmatch, parts) if m), None)
    if found:
        steps = int(found.group(1)) - int(entry["start_step"])
        trained = int(entry["consumed_global"]) + int(entry["earlier_microbatches"])
        if steps > 0 and trained % steps == 0:
            per_step = trained // steps
    return TracedRun(len(state), entry.get("dp_world_size"),
                       batch if isinstance(batch, int) else None,
                       max_length - 1 if isinstance(max_length, int) else None, per_step)


def _lanes(blob: Any, where: str) -> dict[str, Any]:
    """Every ``lane_<l>`` entry anywhere in ``blob`` (entries stored as text decoded)."""
    found: dict[str, Any] = {}

    def walk(value: Any, key: str = "") -> None:
        match = _LANE_KEY.search(key)
        if match:
            found[match.group(1)] = from_text(value, f"{where}: {key}")
        elif isinstance(value, dict) and value.get("artifact") == "loader_state":
            from zephon.integration.state_envelope import read_state

            found.update(read_state(value, f"{where}: {key or 'state'}").entries)
        elif isinstance(value, dict):
            for name, child in value.items():
                walk(child, f"{key}.{name}" if key else str(name))

    walk(blob)
    if not found:
        raise StateMismatchError(f"{where}: no loader state (lane_<l> entries) found")
    return found


def trace_steps(pipeline: Any, first: int, last: int, per_step: int, world_size: int,
                state: dict[str, Any] | None = None, decode: Any = None,
                excerpt_chars: int = 60) -> Iterator[TracedMicrobatch]:
    """The microbatches of steps ``first`` to ``last`` of a run with ``per_step``
    microbatches per step at ``world_size`` data-parallel ranks. ``pipeline`` is the recipe's
    one-rank pipeline; ``state`` a loader state to start from (its step must be before
    ``first``); ``decode`` turns token ids into text for the excerpts."""
    lanes = pipeline.lanes
    problem = lanes_problem(lanes, world_size)
    if problem:
        raise ConfigError(f"--world-size {world_size}: {problem}")
    start, begun, earlier = 0, 0, 0
    if state is not None:
        pipeline.load_state_dict(state)
        entry = next(iter(state.values()))
        start, begun = int(entry["consumed_global"]), int(entry["start_step"])
        earlier = int(entry["earlier_microbatches"])
    if first <= begun:
        raise ConfigError(f"step {first} was trained before the data of this loader state "
                          f"began (the run restarted its data after step {begun}); trace it "
                          f"from a checkpoint saved before step {begun + 1}")
    offset = begun * per_step + earlier  # global microbatch g of this data is trained at
    if (first - 1) * per_step < offset:  # step (g + offset) // per_step + 1
        raise ConfigError(f"step {first} was trained in an earlier pass over the data (it "
                          f"ended and started over {earlier} microbatch(es) into it); trace "
                          "it from a checkpoint saved in that pass")
    if offset + start > (first - 1) * per_step:
        raise ConfigError(f"the loader state is at step {(offset + start) // per_step} "
                          f"(global microbatch {start}); trace steps after it")
    names = {d.name: d for d in getattr(pipeline.work_source, "datasets", ())}
    schedule = pipeline.work_source.schedule
    per_microbatch = microbatch_tokens(pipeline.operators)
    index = start
    for batch in pipeline:
        step = (index + offset) // per_step + 1
        if step > last:
            return
        if step >= first:
            rows = [[_document(span, record, names, decode, excerpt_chars)
                     for span in record.meta.get("documents", ())] for record in batch.records]
            stage = None
            if not schedule.static and per_microbatch:
                stage = schedule.stage_at(index * per_microbatch) + 1
            yield TracedMicrobatch(step, index, batch.lane, index % world_size,
                                   batch.ids, rows, stage)
        index += 1
    ends = (index - 1 + offset) // per_step + 1  # the step of the last microbatch
    raise DataError(f"the data ends after global microbatch {index - 1} (in step {ends}, with "
                    f"{per_step} microbatch(es) a step): steps "
                    f"{max(first, ends + 1)}..{last} were not trained on this data (a run "
                    "that went on started it over; trace those from one of its checkpoints)")


def _document(span: Any, record: Any, datasets: dict[str, Any], decode: Any,
              chars: int) -> TracedDocument:
    _name, file_index, key = span.doc_id.rsplit(":", 2)
    key, _, epoch = key.partition("#e")
    dataset = datasets.get(span.dataset)
    if dataset is not None:
        data_file = dataset.files()[int(file_index)]
        file = dataset.display_name(data_file)
        local = data_file.path if os.path.isfile(data_file.path) else ""
        row = RowLabel(file, local, data_file.fmt, data_file.compression, int(key)).position()
    else:
        file, row = file_index, f"key {key}"
    ids = record.payload["input_ids"][span.row_start:span.row_start + span.length]
    text = decode([int(i) for i in ids[:4 * chars]]) if decode is not None else ""
    excerpt = " ".join(text.split())[:chars]
    return TracedDocument(span.dataset, file, row, int(span.length), int(span.doc_start),
                          excerpt, int(epoch or 0))

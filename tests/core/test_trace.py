"""zephon trace: the microbatches of given steps, as the ranks of a run received them, from a
checkpoint's loader state in any of the forms adapters write."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from zephon import ConfigError, DataError, Pipeline, StateMismatchError
from zephon.artifacts import as_text
from zephon.io import Dataset
from zephon.trace import read_loader_state, trace_steps
from zephon.work import MixtureSpec, StaticMixtureWorkSource

LANES, PER_STEP = 4, 6  # six microbatches per step: three per rank at two ranks


def pipeline(paths: dict, tokenizer_dir: str, dp_rank: int = 0, world: int = 1) -> Pipeline:
    datasets = [Dataset.from_path(n, p) for n, p in paths.items()]
    source = StaticMixtureWorkSource(datasets, MixtureSpec(dict.fromkeys(paths, 1.0)), seed=9,
                                     unit_bytes=4096)
    return (Pipeline(source).options(lanes=LANES, prefetch=0, dp_rank=dp_rank,
                                     dp_world_size=world)
            .tokenize(tokenizer_id=tokenizer_dir, max_document_tokens=50)
            .pack_flat(33).shuffle(8).batch(2))


def recipe_of(paths: dict, tokenizer_dir: str, folder: Path, extra: str = "") -> Path:
    """:func:`pipeline` as a recipe file (rows and microbatches left to the run unless
    ``extra`` sets them)."""
    datasets = "".join(f'[[datasets]]\nname = "{n}"\npath = "{p}"\n' for n, p in paths.items())
    recipe = folder / "recipe.toml"
    recipe.write_text(f"""lanes = {LANES}
seed = 9
{datasets}[mixture]
by = "documents"
[work]
unit_bytes = 4096
[tokenize]
tokenizer = "{tokenizer_dir}"
max_document_tokens = 50
[shuffle]
buffer_size = 8
{extra}""")
    return recipe


def train_two_ranks(paths, tokenizer_dir, steps: int, save_after: int):
    """Two ranks taking PER_STEP / 2 microbatches each per step: what each global microbatch
    held and which rank got it, and both ranks' states after ``save_after`` steps."""
    ranks = [pipeline(paths, tokenizer_dir, r, 2) for r in range(2)]
    iterators = [iter(p) for p in ranks]
    seen, saved = {}, None
    for step in range(1, steps + 1):
        for rank, iterator in enumerate(iterators):
            for _ in range(PER_STEP // 2):
                batch = next(iterator)
                seen[batch.index * LANES + batch.lane] = (step, rank, batch.ids)
        if step == save_after:
            saved = {**ranks[0].state_dict(), **ranks[1].state_dict()}
    return seen, saved


def test_steps_traced_from_a_state_are_what_the_ranks_received(two_datasets, tokenizer_dir):
    seen, state = train_two_ranks(two_datasets, tokenizer_dir, steps=6, save_after=4)
    traced = list(trace_steps(pipeline(two_datasets, tokenizer_dir), 5, 6, PER_STEP, 2,
                              state=state))
    assert [t.global_microbatch for t in traced] == list(range(4 * PER_STEP, 6 * PER_STEP))
    for t in traced:
        assert (t.step, t.dp_rank, t.ids) == seen[t.global_microbatch]
        assert all(d.dataset in two_datasets and d.tokens > 0 for row in t.rows for d in row)
        assert sum(d.tokens for row in t.rows for d in row) == 2 * 33
    replayed = list(trace_steps(pipeline(two_datasets, tokenizer_dir), 5, 6, PER_STEP, 2))
    assert [t.ids for t in replayed] == [t.ids for t in traced]
    with pytest.raises(Exception, match="loader state is at step 4"):
        list(trace_steps(pipeline(two_datasets, tokenizer_dir), 3, 3, PER_STEP, 2, state))


def test_loader_states_are_read_in_every_form_adapters_write(two_datasets, tokenizer_dir,
                                                             tmp_path):
    _, state = train_two_ranks(two_datasets, tokenizer_dir, steps=2, save_after=2)
    # a state_dict() saved as JSON, and with torch.save
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert read_loader_state(tmp_path / "state.json") == state
    torch.save(state, tmp_path / "state.pt")
    assert read_loader_state(tmp_path / "state.pt") == state
    # Megatron-LM: iter_<n>/mp_rank_00/train_dataloader_dprank<r>.pt holding the lanes
    megatron = tmp_path / "megatron"
    folder = megatron / "iter_0000002" / "mp_rank_00"
    folder.mkdir(parents=True)
    for rank in range(2):
        lanes = {k: v for k, v in state.items() if int(k.split("_")[1]) % 2 == rank}
        torch.save({"dataloader_state_dict": {"format": "zephon_megatron.loader",
                                              "pipeline": lanes}},
                   folder / f"train_dataloader_dprank{rank:03d}.pt")
    (megatron / "latest_checkpointed_iteration.txt").write_text("2")
    assert read_loader_state(megatron) == read_loader_state(megatron / "iter_0000002")
    assert read_loader_state(megatron).keys() == state.keys()
    # TorchTitan: a torch.distributed.checkpoint folder with dataloader.lane_<l> text entries
    import torch.distributed.checkpoint as dcp

    titan = tmp_path / "step-2"
    dcp.save({"dataloader": {k: as_text(v) for k, v in state.items()},
              "model": {"w": torch.zeros(3)}}, checkpoint_id=str(titan), no_dist=True)
    assert read_loader_state(titan) == state
    with pytest.raises(Exception, match="no loader state"):
        torch.save({"model": 1}, tmp_path / "other.pt")
        read_loader_state(tmp_path / "other.pt")


class _RunsCode:
    """Unpickling this runs a command: what a crafted state file could hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_no_state_file_is_ever_unpickled(two_datasets, tokenizer_dir, tmp_path):
    """A pickle file, or a pickled entry inside a torch or DCP checkpoint, is refused as it
    is, and the code it names never runs."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    (tmp_path / "state.pkl").write_bytes(pickle.dumps({"lane_0": _RunsCode(marker)}))
    with pytest.raises(StateMismatchError, match=r"state\.pkl: not a loader state file"):
        read_loader_state(tmp_path / "state.pkl")
    torch.save({"lane_0": pickle.dumps(_RunsCode(marker))}, tmp_path / "entry.pt")
    with pytest.raises(StateMismatchError, match=r"lane_0 is pickled bytes .* never unpickles"):
        read_loader_state(tmp_path / "entry.pt")
    titan = tmp_path / "step-3"
    dcp.save({"dataloader": {"lane_0": pickle.dumps(_RunsCode(marker))}},
             checkpoint_id=str(titan), no_dist=True)
    with pytest.raises(StateMismatchError, match="pickled bytes"):
        read_loader_state(titan)
    assert not marker.exists()


def test_a_data_restart_and_a_pass_started_over_are_followed_or_refused(two_datasets,
                                                                        tokenizer_dir):
    """A run whose data restarted after step 10 (TorchTitan's exclude_from_loading) and
    later started over at the end of the data: the state says both, so a step maps to the
    microbatches that trained it, and a step the state cannot account for is refused."""
    from zephon.integration import LoaderSession

    whole = [batch.ids for batch in pipeline(two_datasets, tokenizer_dir)]
    restarted = pipeline(two_datasets, tokenizer_dir).options(start_step=10)
    session = LoaderSession(restarted)
    first_pass = len(list(session.batches()))
    assert first_pass == len(whole)
    again = session.batches()
    for _ in range(PER_STEP + 2):  # one step and two microbatches into the second pass
        next(again)
    state = restarted.state_dict()
    entry = next(iter(state.values()))
    assert (entry["start_step"], entry["earlier_microbatches"]) == (10, first_pass)
    offset = 10 * PER_STEP + first_pass
    step = -(-(offset + PER_STEP + 2) // PER_STEP) + 1  # the first step after the state
    traced = list(trace_steps(pipeline(two_datasets, tokenizer_dir), step, step, PER_STEP, 2,
                              state))
    assert [t.global_microbatch for t in traced] == \
        list(range((step - 1) * PER_STEP - offset, step * PER_STEP - offset))
    assert [t.ids for t in traced] == whole[traced[0].global_microbatch:
                                            traced[-1].global_microbatch + 1]
    with pytest.raises(ConfigError, match=r"step 10 was trained before the data of this loader "
                                          r"state began .* before step 11"):
        list(trace_steps(pipeline(two_datasets, tokenizer_dir), 10, 10, PER_STEP, 2, state))
    with pytest.raises(ConfigError, match="step 12 was trained in an earlier pass over the "
                                          "data"):
        list(trace_steps(pipeline(two_datasets, tokenizer_dir), 12, 12, PER_STEP, 2, state))


def test_steps_past_the_end_of_the_data_are_an_error_not_silence(two_datasets, tokenizer_dir,
                                                                 tmp_path, capsys):
    total = len(list(pipeline(two_datasets, tokenizer_dir)))
    last = -(-total // PER_STEP)
    got = []
    with pytest.raises(DataError, match=rf"the data ends after global microbatch {total - 1} "
                                        rf"\(in step {last}, .*steps {last + 1}\.\.{last + 5}"):
        got.extend(trace_steps(pipeline(two_datasets, tokenizer_dir), last, last + 5, PER_STEP,
                               2))
    assert [t.step for t in got] == [last] * (total - (last - 1) * PER_STEP)
    recipe = recipe_of(two_datasets, tokenizer_dir, tmp_path, "[pack]\nmax_length = 33\n"
                       "[batch]\nmicrobatch_size = 2\n")
    from zephon.cli import main as zephon

    assert zephon(["trace", str(recipe), "--steps", "100:101", "--global-batch-size",
                   "12"]) == 1
    assert "the data ends after global microbatch" in capsys.readouterr().err


def test_the_state_and_its_checkpoint_step_tell_the_geometry(two_datasets, tokenizer_dir,
                                                            tmp_path, capsys):
    """From a state saved at step 4 in a ``step-4`` folder, trace needs no sizes: ranks,
    microbatch rows, row length and microbatches a step come from the state and the path."""
    from zephon.cli import main as zephon

    seen, state = train_two_ranks(two_datasets, tokenizer_dir, steps=6, save_after=4)
    recipe = recipe_of(two_datasets, tokenizer_dir, tmp_path)
    checkpoint = tmp_path / "checkpoint" / "step-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "loader.json").write_text(json.dumps(state))
    assert zephon(["trace", str(recipe), "--steps", "5:6", "--from-state",
                   str(checkpoint / "loader.json"), "--json"]) == 0
    traced = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["global_microbatch"] for t in traced] == list(range(4 * PER_STEP, 6 * PER_STEP))
    assert all((t["step"], t["dp_rank"], t["ids"]) == seen[t["global_microbatch"]]
               for t in traced)


def test_rows_are_named_alike_in_every_format(tmp_path, tokenizer_dir):
    """Parquet rows from 0, JSON Lines lines from 1 (plain files are read by byte offset,
    named by line), and a repeated dataset's second pass said apart."""
    import gzip

    from tests.conftest import write_jsonl, write_parquet
    from zephon.demo.assets import make_documents

    texts = make_documents(12, seed=2)
    write_parquet(tmp_path / "p" / "a.parquet", texts[:4], row_group_size=4)
    write_jsonl(tmp_path / "j" / "a.jsonl", [{"text": t} for t in texts[4:8]])
    with gzip.open(tmp_path / "z.jsonl.gz", "wt") as out:
        out.writelines(json.dumps({"text": t}) + "\n" for t in texts[8:])
    (tmp_path / "z").mkdir()
    (tmp_path / "z.jsonl.gz").rename(tmp_path / "z" / "a.jsonl.gz")
    datasets = [Dataset.from_path(n, tmp_path / n) for n in ("p", "j", "z")]
    source = StaticMixtureWorkSource(datasets, seed=1, repeat=True, shuffle_rows=False,
                                     shuffle_units=False)
    pipeline = (Pipeline(source).options(lanes=1, prefetch=0)
                .tokenize(tokenizer_id=tokenizer_dir).pack_flat(4097, "best_fit").batch(1))
    traced = list(trace_steps(pipeline, 1, 3, 1, 1))
    rows = {}
    for document in (d for t in traced for row in t.rows for d in row):
        rows.setdefault((document.dataset, document.epoch), set()).add(document.row)
    assert rows[("p", 0)] == {f"row {i}" for i in range(4)}
    assert rows[("j", 0)] == {f"line {i}" for i in range(1, 5)}
    assert rows[("z", 0)] == {f"line {i}" for i in range(1, 5)}
    assert any(epoch == 1 for _, epoch in rows)  # the small datasets came round again

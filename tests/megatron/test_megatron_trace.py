"""Megatron's iterations as ranges of global microbatches (zephon_megatron_tools.trace), the batch
size ramp included, against the clock the loader metrics use."""

from __future__ import annotations

import pytest
from megatron_helpers import PACKED, megatron_argv, parse

from zephon_megatron.args_checks import megatron_ramps
from zephon_megatron.arguments import settings_from_args
from zephon_megatron.provider import step_clock
from zephon_megatron_tools.trace import iteration_ranges, main


def ranges_by_ticking(settings, dp: int, iterations: int) -> list[tuple[int, int, int]]:
    """The same ranges from the reader's clock, one microbatch per reader at a time."""
    clock = step_clock(settings, dp)
    out, start, handed = [], 0, 0
    while len(out) < iterations:
        handed += 1
        done = clock.tick()
        if done is not None:
            out.append((done, start, handed * dp - start))
            start = handed * dp
    return out


@pytest.mark.parametrize("extra", [[], ["--rampup-batch-size", "4", "4", "40"]])
@pytest.mark.parametrize("world", [1, 2])
def test_iterations_are_the_microbatches_the_readers_hand_out(extra, world: int) -> None:
    args = parse(megatron_argv(PACKED, "--global-batch-size", "16", "--zephon-lanes", "8",
                               *extra))
    settings = settings_from_args(args, world_size=world)
    expected = ranges_by_ticking(settings, world, 12)
    assert iteration_ranges(step_clock(settings, world), 2, 1, 12) == expected
    assert iteration_ranges(step_clock(settings, world), 2, 7, 9) == expected[6:9]
    counts = [count for _, _, count in expected]
    if extra and megatron_ramps():  # megatron-core <= 0.18 ramps from 4 rows to 16
        assert counts[0] == 2 and counts[-1] == 8 and counts == sorted(counts)
    else:
        assert counts == [8] * 12


def test_the_command_names_a_state_after_the_iterations_asked_for(tmp_path, capsys) -> None:
    from zephon.recipe import DataRecipe
    from zephon_megatron.state_files import write_dataloader_state

    pipeline = DataRecipe.from_toml(str(PACKED)).build(seq_len=64, microbatch_size=2, lanes=8,
                                                      prefetch=0, workers=0)
    iterator = iter(pipeline)
    for _ in range(8):  # two iterations of 4 microbatches
        next(iterator)
    # the Megatron adapter's own state of zephon 0.3, still read
    write_dataloader_state(tmp_path, 2, 0, {"format": "zephon_megatron.loader", "version": 1,
                                            "micro_batch_size": 2, "lanes": 8,
                                            "pipeline": pipeline.state_dict()})
    flags = megatron_argv(PACKED)
    assert main(["--steps", "2", "--from-state", str(tmp_path / "iter_0000002"), "--",
                 *flags]) == 2
    assert "trace iterations after 2" in capsys.readouterr().err
    assert main(["--steps", "3", "--json", "--from-state", str(tmp_path / "iter_0000002"),
                 "--", *flags]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split('"global_microbatch": ')[1].split(",")[0] for line in listed] == \
        ["8", "9", "10", "11"]

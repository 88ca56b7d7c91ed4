"""Mixture schedules in a running pipeline: identical global microbatches at every data-parallel
size across stage boundaries and a ramp, exact resume anywhere around a boundary and at another
size, realized shares per stage, a future changed on resume, a past change refused."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from tests.kit.stages import (
    LANES,
    MICROBATCH_TOKENS,
    RECIPE_STAGES,
    ROW_TOKENS,
    ROWS,
    STAGES,
    recipe_text,
    write_corpus,
)
from zephon import Pipeline, StateMismatchError
from zephon.io import Dataset
from zephon.work import MixtureSchedule, ScheduledMixtureWorkSource, Stage


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("stages"))


def build(corpus, tokenizer_dir, stages=STAGES, *, rank=0, world=1) -> Pipeline:
    source = ScheduledMixtureWorkSource([Dataset.from_path(n, p) for n, p in corpus.items()],
                                        MixtureSchedule(stages), seed=5, repeat=True,
                                        unit_bytes=2048)
    return (Pipeline(source).options(lanes=LANES, dp_rank=rank, dp_world_size=world,
                                     prefetch=0)
            .tokenize(tokenizer_id=tokenizer_dir).pack_flat(ROW_TOKENS).shuffle(4)
            .batch(ROWS))


def digest(batch) -> str:
    h = hashlib.sha256()
    for record in batch.records:
        h.update(record.payload["input_ids"].tobytes())
    return h.hexdigest()[:16]


def global_stream(pipelines, count: int, start: int = 0) -> list[tuple[int, str]]:
    """Global microbatches ``start`` to ``start + count``, each taken from the rank that
    reads it: (global index, digest)."""
    iterators = [iter(p) for p in pipelines]
    out = []
    for index in range(start, start + count):
        batch = next(iterators[index % LANES % len(pipelines)])
        out.append((batch.index * LANES + batch.lane, digest(batch)))
    return out


def ranks(corpus, tokenizer_dir, world, stages=STAGES, state=None):
    pipelines = [build(corpus, tokenizer_dir, stages, rank=r, world=world) for r in range(world)]
    if state is not None:
        for p in pipelines:
            p.load_state_dict(state)
    return pipelines


def state_of(pipelines) -> dict:
    state = {}
    for p in pipelines:
        state.update(json.loads(json.dumps(p.state_dict())))
    return state


def test_the_global_microbatches_are_the_same_at_every_size_across_stages(corpus,
                                                                           tokenizer_dir):
    reference = global_stream(ranks(corpus, tokenizer_dir, 1), 130)
    assert [g for g, _ in reference] == list(range(130))
    for world in (2, 4):
        assert global_stream(ranks(corpus, tokenizer_dir, world), 130) == reference


@pytest.mark.parametrize("before, after", [(2, 1), (1, 4)])
def test_a_resume_at_every_microbatch_around_a_boundary_is_exact(corpus, tokenizer_dir, before,
                                                                 after):
    reference = global_stream(ranks(corpus, tokenizer_dir, 1), 60)
    for stop in range(36, 56, before):  # the first boundary is near microbatch 46
        first = ranks(corpus, tokenizer_dir, before)
        assert global_stream(first, stop) == reference[:stop]
        resumed = ranks(corpus, tokenizer_dir, after, state=state_of(first))
        assert global_stream(resumed, 60 - stop, stop) == reference[stop:], f"at {stop}"


def test_each_stage_delivers_its_shares(corpus, tokenizer_dir):
    """Token shares of what the trainer received, per stage: within 0.03 of the stage's
    weights (the ramp's: of the average of its shares over the ramp)."""
    schedule = MixtureSchedule(STAGES)
    tokens: dict[int, dict[str, int]] = {}
    pipeline = build(corpus, tokenizer_dir)
    for index, batch in enumerate(pipeline):
        position = index * MICROBATCH_TOKENS
        if position >= 20_000:
            break
        part = "ramp" if 6_000 <= position < 9_000 else schedule.stage_at(position)
        counts = tokens.setdefault(part, {})
        for record in batch.records:
            for span in record.meta["documents"]:
                counts[span.dataset] = counts.get(span.dataset, 0) + span.length
    for part, counts in tokens.items():
        if part == "ramp":
            target = [(b - a) / 3_000 for a, b in zip(schedule.targets(6_000),
                                                       schedule.targets(9_000), strict=True)]
        else:
            start = schedule.stage_boundary(part) + (3_000 if part == 1 else 0)
            end = min(20_000, STAGES[part].until_tokens or 20_000)
            target = [(b - a) / (end - start) for a, b in zip(
                schedule.targets(start), schedule.targets(end), strict=True)]
        total = sum(counts.values())
        for name, share in zip(schedule.names, target, strict=True):
            assert abs(counts.get(name, 0) / total - share) <= 0.03, (part, name, counts)


def test_a_future_stage_changed_on_resume_continues_without_rereading(corpus, tokenizer_dir):
    """Saved in the first stage, resumed with the later stages changed: the run goes on
    exactly as a run that had the new stages from its start (so no document is read twice or
    skipped), and differs from the run that kept the old ones."""
    changed = [STAGES[0], Stage({"web": 0.1, "math": 0.9}, ramp_tokens=1_000)]
    first = ranks(corpus, tokenizer_dir, 2)
    head = global_stream(first, 20)
    state = state_of(first)
    tail = global_stream(ranks(corpus, tokenizer_dir, 2, stages=changed,
                               state=copy.deepcopy(state)), 110, 20)
    assert head + tail == global_stream(ranks(corpus, tokenizer_dir, 1, stages=changed), 130)
    kept = global_stream(ranks(corpus, tokenizer_dir, 2, state=state), 110, 20)
    assert tail[:20] == kept[:20]  # the first stage, which did not change
    assert tail[40:] != kept[40:]  # the new future


def test_a_past_stage_changed_on_resume_is_refused_naming_it(corpus, tokenizer_dir):
    first = ranks(corpus, tokenizer_dir, 1)
    global_stream(first, 60)  # into the ramp of stage 2
    state = state_of(first)
    past = [STAGES[0], Stage(STAGES[1].weights, until_tokens=14_000, ramp_tokens=1_000),
            STAGES[2]]
    with pytest.raises(StateMismatchError, match=r"nodes\[0\]\.schedule is the mixture the run "
                                                 r"trained with, and stage 2 of this one"):
        build(corpus, tokenizer_dir, past).load_state_dict(state)
    moved = [Stage({"web": 0.8, "code": 0.2}, until_tokens=5_000), *STAGES[1:]]
    with pytest.raises(StateMismatchError, match=r"stage 2 of this one differs from it from "
                                                 r"job token 5,000 \(at 6,000: shares"):
        build(corpus, tokenizer_dir, moved).load_state_dict(state)
    later = [*STAGES[:2], Stage({"web": 0.9, "math": 0.1})]  # stage 3 is still ahead
    build(corpus, tokenizer_dir, later).load_state_dict(state)


def test_metrics_give_each_datasets_tokens_seen_and_the_schedules_target(corpus,
                                                                         tokenizer_dir):
    from zephon.integration import LoaderSession

    session = LoaderSession(build(corpus, tokenizer_dir))
    batches = session.batches()
    for _ in range(60):  # into the ramp of the second stage
        next(batches)
    metrics = session.metrics()
    report = session.pipeline.report()
    handed = {d.name: d.handed_tokens for d in report.datasets}
    assert {n: metrics[f"zephon/tokens_seen/{n}"] for n in handed} == handed
    assert sum(handed.values()) == 60 * MICROBATCH_TOKENS
    position = 60 * MICROBATCH_TOKENS
    schedule = MixtureSchedule(STAGES)
    for name, target in zip(schedule.names, schedule.targets(position), strict=True):
        assert metrics[f"zephon/target/{name}"] == pytest.approx(target / position)
        assert abs(metrics[f"zephon/realized/{name}"] - target / position) < 0.03


def test_a_recipe_with_stages_gives_the_python_pipelines_batches(corpus, tokenizer_dir,
                                                                  tmp_path):
    from zephon.recipe import DataRecipe

    path = tmp_path / "stages.toml"
    path.write_text(recipe_text(corpus, tokenizer_dir, RECIPE_STAGES))
    recipe = DataRecipe.from_toml(path)
    assert recipe.mix_by == "tokens"
    pipeline = recipe.build()
    got = [digest(b) for _, b in zip(range(80), pipeline, strict=False)]
    assert got == [d for _, d in global_stream([build(corpus, tokenizer_dir)], 80)]
    assert [s.stage for s in pipeline.report().stages] == [1, 2]


@pytest.mark.parametrize("stages, extra, problem", [
    (RECIPE_STAGES.replace("math = 0.4", "maths = 0.4"), "",
     r"names datasets the recipe does not have: \['maths'\]"),
    (RECIPE_STAGES, "weight = 2\n", r"\[\[datasets\]\] weight is not used with them"),
    ('by = "documents"\n' + RECIPE_STAGES, "", "stages end at token counts; mix by tokens"),
    (RECIPE_STAGES.replace("until_tokens = 14_000\n", ""), "",
     "stage 2: until_tokens must be a positive number"),
])
def test_bad_stages_in_a_recipe_are_named(corpus, tokenizer_dir, tmp_path, stages, extra,
                                          problem):
    from zephon.errors import ConfigError
    from zephon.recipe import DataRecipe

    path = tmp_path / "stages.toml"
    path.write_text(recipe_text(corpus, tokenizer_dir, stages, extra))
    with pytest.raises(ConfigError, match=problem):
        DataRecipe.from_toml(path)


@pytest.fixture
def stages_recipe(corpus, tokenizer_dir, tmp_path) -> Path:
    path = tmp_path / "stages.toml"
    path.write_text(recipe_text(corpus, tokenizer_dir, RECIPE_STAGES))
    return path


def test_stats_lists_the_stages_and_each_datasets_share_of_a_budget(stages_recipe, capsys):
    from zephon.cli import main

    assert main(["stats", str(stages_recipe), "--tokens", "20000"]) == 0
    out = capsys.readouterr().out
    assert "stage 1  0..6,000:  web 0.800  code 0.200" in out
    assert "stage 2  6,000..14,000, ramp 3,000:  web 0.300  code 0.300  math 0.400" in out
    assert "stage 3  14,000..end:  web 0.500  math 0.500" in out
    schedule = MixtureSchedule(STAGES)
    shares = dict(zip(schedule.names, schedule.targets(20_000), strict=True))
    line = next(li for li in out.splitlines() if li.startswith("math "))
    assert f"{shares['math'] / 20_000:.3f}" in line  # the budget's share, not stage 1's 0


def test_trace_names_each_microbatchs_stage(stages_recipe, capsys):
    from zephon.cli import main

    # 4 microbatches a step of 130 tokens: stage 2 begins at token 6,000 (in microbatch 46,
    # step 12), stage 3 at 14,000 (in microbatch 107, step 27; 108 is step 28).
    assert main(["trace", str(stages_recipe), "--steps", "11:12", "--global-batch-size", "8",
                 "--json"]) == 0
    traced = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    stages = {t["global_microbatch"]: t["stage"] for t in traced}
    assert stages == {g: 1 if g * MICROBATCH_TOKENS < 6_000 else 2 for g in range(40, 48)}
    assert main(["trace", str(stages_recipe), "--steps", "27:28",
                 "--global-batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "microbatch 107 (lane 3, dp rank 0 of 1, mixture stage 2)" in out
    assert "microbatch 108 (lane 0, dp rank 0 of 1, mixture stage 3)" in out


def test_preview_shows_target_and_delivered_shares_over_the_run(stages_recipe, capsys,
                                                                 tmp_path):
    from zephon.cli import main
    from zephon.preview_shares import share_windows

    windows = share_windows(stages_recipe, 18_000, windows=9)
    assert [(w.begin, w.end) for w in windows][:2] == [(0, 2_000), (2_000, 4_000)]
    assert windows[0].target == pytest.approx({"web": 0.8, "code": 0.2, "math": 0.0})
    assert windows[-1].target == pytest.approx({"web": 0.5, "code": 0.0, "math": 0.5})
    # The ramp's first window (6,000-8,000 of a 3,000-token ramp) is its mean there.
    middle = MixtureSchedule(STAGES).shares_at(7_000)
    assert windows[3].target["math"] == pytest.approx(middle[2])
    for window in (windows[1], windows[-2], windows[-1]):  # away from boundaries
        assert all(abs(window.delivered[n] - window.target[n]) < 0.06 for n in window.target)
    assert windows[0].delivered["math"] == 0 and windows[-1].delivered["code"] == 0
    assert main(["preview", str(stages_recipe), "--shares", "--tokens", "18000",
                 "--windows", "3", "--targets-only"]) == 0
    out = capsys.readouterr().out
    assert "0.800 / -" in out and "mixture shares over 18,000 tokens" in out
    page = tmp_path / "shares.html"
    assert main(["preview", str(stages_recipe), "--shares", "--tokens", "6000",
                 "--windows", "2", "--out", str(page)]) == 0
    assert "<table" in page.read_text() and "0.800 / " in page.read_text()


def test_preview_draws_the_shares(stages_recipe, tmp_path):
    pytest.importorskip("matplotlib")
    from zephon.cli import main

    picture = tmp_path / "shares.png"
    assert main(["preview", str(stages_recipe), "--shares", "--tokens", "16000",
                 "--out", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""``Pipeline`` is an immutable builder; its loader owns iteration, state and report."""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import pytest

import zephon
from tests.kit.elastic import build, digest
from zephon import ConfigError, Pipeline, StateMismatchError
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.ops.pack import PackSpec
from zephon.ops.tokenize import TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def test_builder_calls_leave_the_pipeline_unchanged(two_datasets, tokenizer_dir):
    base = Pipeline(StaticMixtureWorkSource(
        [Dataset.from_path("s", two_datasets["short"])])).tokenize(tokenizer_id=tokenizer_dir)
    packed = base.pack_flat(33)
    assert [s.op_name for s in base.operators] == ["tokenize"]
    assert [s.op_name for s in packed.operators] == ["tokenize", "pack_flat"]
    wider = packed.options(lanes=4)
    assert packed.loader_options.lanes is None and wider.loader_options.lanes == 4
    one, two = packed.batch(2), packed.batch(3)
    assert len(next(iter(one))) == 2 and len(next(iter(two))) == 3
    assert one.loader() is one.loader() and one.loader() is not two.loader()


def test_operator_methods_take_exactly_the_spec_fields():
    tokenize = inspect.signature(Pipeline.tokenize).parameters
    assert list(tokenize)[1:] == [f for f in inspect.signature(TokenizeSpec).parameters]
    pack_flat = inspect.signature(Pipeline.pack_flat).parameters
    assert "flat" not in pack_flat and "max_length" in pack_flat
    assert set(pack_flat) - {"self"} == set(inspect.signature(PackSpec).parameters) - {"flat"}
    with pytest.raises(TypeError):
        Pipeline.pack_flat(None, 33, flat=False)
    pack_sequences = inspect.signature(Pipeline.pack_sequences).parameters
    assert "flat" not in pack_sequences and "pad_token_id" not in pack_sequences


def test_type_checkers_see_the_builder_methods_signatures(tmp_path):
    """The methods are typed through the specs (a ParamSpec), so an editor or mypy sees
    ``pack_flat(max_length: int, ...)`` and flags a misspelled option, not ``(*args,
    **kwargs)``."""
    from mypy import api as mypy
    (tmp_path / "use.py").write_text(
        "from zephon import Pipeline\n\n"
        "def use(p: Pipeline) -> None:\n"
        "    reveal_type(p.pack_flat)\n"
        "    p.pack_flat(33, flat=False)\n"
        "    p.tokenize('tok', feild='body')\n"
        "    p.shuffle(buffer_size='8')\n")
    # the source tree, since an editable install hides it; zephon's modules followed, the
    # libraries it imports taken as Any (following torch and numpy took 18 s, not 2.5)
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {Path(zephon.__file__).resolve().parents[1]}\n"
                      "follow_imports = skip\n\n[mypy-zephon.*]\nfollow_imports = silent\n")
    out, _, _ = mypy.run(["--config-file", str(config),
                          "--ignore-missing-imports", "--no-incremental",
                          "--cache-dir=/dev/null", str(tmp_path / "use.py")])
    assert ('def (max_length: int | None, algorithm: str =, pad_token_id: int | None =, '
            'max_open_bins: int =) -> zephon.pipeline.Pipeline') in out, out
    assert 'use.py:5: error: Unexpected keyword argument "flat"' in out, out
    assert 'use.py:6: error: Unexpected keyword argument "feild"; did you mean "field"?' in out
    assert 'use.py:7: error: Argument "buffer_size"' in out, out


def test_every_operator_is_registered_and_abstract_methods_are_enforced():
    from zephon.ops.base import OPERATORS, DocumentOperator, RowOperator

    assert {"tokenize", "tokenize_chat", "pretokenized", "map", "filter", "pack_flat",
            "pack_sequences", "shuffle", "batch"} <= set(OPERATORS)
    for name, spec in ((n, OPERATORS.get(n)) for n in OPERATORS):
        assert spec.op_name == name
    for base in (DocumentOperator, RowOperator):
        incomplete = type("Incomplete", (base,), {})
        with pytest.raises(TypeError, match="abstract"):
            incomplete(PackSpec(9))


def test_options_after_load_state_dict_carry_the_state(two_datasets, tokenizer_dir):
    base = build(two_datasets, tokenizer_dir).options(lanes=2)
    reference = [digest(b) for _, b in zip(range(8), base, strict=False)]
    first = build(two_datasets, tokenizer_dir).options(lanes=2)
    iterator = iter(first)
    head = [digest(next(iterator)) for _ in range(4)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = build(two_datasets, tokenizer_dir).options(lanes=2)
    resumed.load_state_dict(state)
    # Derived pipelines keep the loaded state instead of restarting from row 0.
    more = resumed.options(prefetch=0)
    assert head + [digest(b) for _, b in zip(range(4), more, strict=False)] == reference
    # A change that alters the data refuses the carried state by name.
    with pytest.raises(StateMismatchError, match="the lane count changed"):
        iter(resumed.options(lanes=4))


def test_pipelines_never_share_bound_datasets(tmp_path):
    hub = Dataset.from_path("h", "hf://org/name/train")
    source = StaticMixtureWorkSource([hub])
    options = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "c")))
    bound = source.bound(options)
    assert bound.datasets[0] is not hub and str(bound.datasets[0].cache.root) == str(tmp_path / "c")
    assert hub._cache is None and source.datasets[0] is hub
    other = source.bound(StoreOptions(cache=CacheOptions(enabled=True,
                                                         root=str(tmp_path / "d"))))
    assert other.datasets[0].cache.root != bound.datasets[0].cache.root
    assert other.datasets[0]._shared is bound.datasets[0]._shared  # one pinned revision


def test_loader_is_the_runtime(two_datasets, tokenizer_dir):
    pipeline = build(two_datasets, tokenizer_dir).options(lanes=2)
    loader = pipeline.loader()
    batches = [digest(b) for _, b in zip(range(2), loader, strict=False)]
    assert pipeline.state_dict() == loader.state_dict()
    assert pipeline.report().microbatches == 2
    assert batches == [digest(b) for _, b in zip(range(2), build(
        two_datasets, tokenizer_dir).options(lanes=2), strict=False)]


def test_one_consumer_at_a_time(two_datasets, tokenizer_dir):
    import threading

    from zephon.errors import ZephonError

    pipeline = build(two_datasets, tokenizer_dir).options(lanes=2)
    loaders, errors, batches = [], [], []

    def first_loader():
        loaders.append(pipeline.loader())

    threads = [threading.Thread(target=first_loader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(loader is loaders[0] for loader in loaders)  # built once, not once per thread

    iterator = iter(pipeline)
    batches.append(next(iterator))

    def second_consumer():
        try:
            iter(pipeline)
        except ZephonError as exc:
            errors.append(str(exc))

    other = threading.Thread(target=second_consumer, name="reader-2")
    other.start()
    other.join()
    assert errors and "is being iterated by thread 'MainThread'" in errors[0]
    batches.append(next(iterator))  # the first consumer is unaffected
    iterator.close()
    other = threading.Thread(target=lambda: batches.append(next(iter(pipeline))))
    other.start()
    other.join()
    assert len(batches) == 3 and batches[2].index == 1  # continues after a close()


def test_a_pipeline_refuses_an_open_hole_when_the_operator_is_added(tmp_path):
    """``max_length`` and ``microbatch_size`` may be open (None) in a recipe, for the
    framework to fill; a pipeline refuses them at once, naming the field."""
    from zephon.ops.batch import BatchSpec

    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_path("a", str(tmp_path))],
                                                MixtureSpec({"a": 1.0})))
    with pytest.raises(ConfigError, match="pack_flat: max_length is open"):
        pipeline.pack_flat(None)
    with pytest.raises(ConfigError, match="batch: microbatch_size is open"):
        pipeline.apply(BatchSpec(microbatch_size=None))
    assert BatchSpec(microbatch_size=None).holes == ("microbatch_size",)

"""A file format registered from this module alone (``.toy``: one ``id<TAB>text`` a line)
is detected, planned, read, resumed and checked like a built-in format, on local disk and
through a storage scheme registered here too."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.hub.hubdata import fast_options
from tests.kit.buckets import BUCKETS, MemoryBucket
from tests.kit.elastic import build, merged_state, run, stream
from zephon.errors import DataError
from zephon.io import Dataset, formats, storage
from zephon.io.formats import UnitSpec
from zephon.recipe import DataRecipe
from zephon.recipe.checks import check_recipe

ROWS_PER_UNIT = 7


def _lines(path: str) -> list[tuple[int, str]]:
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        ident, tab, text = line.partition("\t")
        if not tab or not ident.isdigit():
            raise DataError(f"{path}:{number}: not an id<TAB>text line")
        rows.append((int(ident), text))
    return rows


def plan_toy(path, hints, min_units):
    count = len(_lines(path))
    step = max(1, min(ROWS_PER_UNIT, -(-count // max(min_units, 1))))
    return [UnitSpec("rows", 0, s, min(s + step, count)) for s in range(0, count, step)]


def read_toy(path, unit, columns, display):
    rows = _lines(path)[unit.start:unit.stop]
    table = {"id": [i for i, _ in rows], "text": [t for _, t in rows]}
    missing = [c for c in columns or () if c not in table]
    if missing:
        raise DataError(f"{display}: has no field(s) {missing}; its fields: id, text")
    return ({c: table[c] for c in columns} if columns else table,
            list(range(unit.start, unit.start + len(rows))))


TOY = formats.FileFormat("toy", (".toy",), plan=plan_toy, read=read_toy,
                              fields=lambda path: {"id": "int", "text": "text"},
                              row_label="sample")


@pytest.fixture
def toy_corpus(two_datasets, tmp_path):
    """``two_datasets`` with its Parquet files rewritten as .toy files."""
    import pyarrow.parquet as pq

    formats.register_format(TOY)
    storage.register_scheme("mem", storage.Scheme(MemoryBucket))
    root = tmp_path / "toy"
    (root / "short").mkdir(parents=True)
    for part in sorted(two_datasets["short"].glob("*.parquet")):
        texts = pq.read_table(part).column("text").to_pylist()
        (root / "short" / part.with_suffix(".toy").name).write_text(
            "".join(f"{i}\t{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    yield {"short": root / "short", "long": two_datasets["long"]}
    formats.unregister_format("toy")
    storage.unregister_scheme("mem")
    BUCKETS.clear()


def test_a_registered_format_reads_resumes_and_is_checked(toy_corpus, tokenizer_dir,
                                                           tmp_path):
    dataset = Dataset.from_path("short", toy_corpus["short"])
    assert [f.fmt for f in dataset.files()] == ["toy"] * 3
    toy = build(toy_corpus, tokenizer_dir)
    reference = run(toy, 1, steps=6)
    assert run(toy, 2, steps=6) == reference
    pipelines, first = stream(toy, 2, 0, 2)
    _, rest = stream(build(toy_corpus, tokenizer_dir), 1, 0, 4,
                     pickle.loads(pickle.dumps(merged_state(pipelines))))
    assert first + rest == reference
    BUCKETS["toys"] = {f"short/{p.name}": p.read_bytes()
                       for p in sorted(toy_corpus["short"].iterdir())}
    BUCKETS["toys"].update({f"long/{p.name}": p.read_bytes()
                            for p in sorted(toy_corpus["long"].iterdir())})
    remote = build({"short": "mem://toys/short/*.toy", "long": "mem://toys/long/"},
                   tokenizer_dir).options(io_options=fast_options(tmp_path / "cache"))
    assert run(remote, 2, steps=6) == reference
    recipe = DataRecipe.from_dict({"datasets": [{"name": "short",
                                                 "path": str(toy_corpus["short"])}],
                                   "tokenize": {"tokenizer": tokenizer_dir, "field": "body"}},
                                  source="toy.toml")
    [problem] = check_recipe(recipe)[:1]
    assert "has no field 'body'" in problem and "'id', 'text'" in problem


def test_a_registered_formats_errors_name_its_file_and_rows(toy_corpus, tokenizer_dir):
    from zephon import Pipeline
    from zephon.io.formats import RowLabel
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    bad = toy_corpus["short"] / "part-9.toy"
    bad.write_text("0\tfine\nnot a toy line\n", encoding="utf-8")
    source = StaticMixtureWorkSource([Dataset.from_path("d", bad)], MixtureSpec({"d": 1.0}),
                                     seed=0, repeat=False)
    with pytest.raises(DataError, match=rf"{bad}:2: not an id<TAB>text line"):
        list(Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).batch(2))
    assert str(RowLabel("x.toy", "x.toy", "toy", None, 4)) == "x.toy: sample 4"
    assert Dataset.from_path("d", bad, fmt="toy").fmt == "toy"
    with pytest.raises(Exception, match="built-in"):
        formats.register_format(formats.FileFormat("parquet", (".pq",), plan_toy,
                                                             read_toy))

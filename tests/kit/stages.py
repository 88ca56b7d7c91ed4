"""A corpus and a recipe with mixture stages, shared by the core and adapter tests of
schedules: three JSON Lines datasets of short documents (web, code, math), and stages that
end at 6,000 and 14,000 job tokens with a 3,000-token ramp between them."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import write_jsonl
from zephon.demo.assets import make_documents
from zephon.work import Stage

LANES, ROWS, ROW_TOKENS = 4, 2, 65
MICROBATCH_TOKENS = ROWS * ROW_TOKENS
STAGES = [Stage({"web": 0.8, "code": 0.2}, until_tokens=6_000),
          Stage({"web": 0.3, "code": 0.3, "math": 0.4}, until_tokens=14_000, ramp_tokens=3_000),
          Stage({"web": 0.5, "math": 0.5})]
"""Boundaries at global microbatch about 46 and 108, the ramp over 46-69."""

RECIPE_STAGES = """[[mixture.stages]]
until_tokens = 6_000
weights = { web = 0.8, code = 0.2 }
[[mixture.stages]]
until_tokens = 14_000
ramp_tokens = 3_000
weights = { web = 0.3, code = 0.3, math = 0.4 }
[[mixture.stages]]
weights = { web = 0.5, math = 0.5 }
"""
""":data:`STAGES` as a recipe writes them."""


def write_corpus(root: Path) -> dict[str, Path]:
    """The three datasets under ``root``, 240 documents each in three files."""
    out = {}
    for seed, name in enumerate(("web", "code", "math")):
        texts = make_documents(240, seed=40 + seed, min_words=8, max_words=30)
        for part in range(3):
            write_jsonl(root / name / f"part-{part}.jsonl",
                        [{"text": t} for t in texts[part::3]])
        out[name] = root / name
    return out


def recipe_text(corpus: dict[str, Path], tokenizer_dir: str, stages: str = RECIPE_STAGES,
                extra: str = "", to_training: str = "") -> str:
    """A recipe over ``corpus`` with ``stages``; ``extra`` goes into every [[datasets]]
    table, ``to_training`` into [to_training]."""
    datasets = "".join(f'[[datasets]]\nname = "{n}"\npath = "{p}"\n{extra}'
                       for n, p in corpus.items())
    return f"""seed = 5
lanes = {LANES}
prefetch = 0
{datasets}
[mixture]
repeat = true
{stages}
[work]
unit_bytes = 2048
[tokenize]
tokenizer = "{tokenizer_dir}"
[pack]
max_length = {ROW_TOKENS}
[shuffle]
buffer_size = 4
[batch]
microbatch_size = {ROWS}
[to_training]
{to_training}
"""


def write_stage_run(root: Path, tokenizer_dir: str, to_training: str = "") -> Path:
    """The corpus under ``root`` and a stage recipe over it (``root/stages.toml``), for the
    adapters' tests of schedules."""
    path = root / "stages.toml"
    path.write_text(recipe_text(write_corpus(root), tokenizer_dir, to_training=to_training))
    return path


def core_inputs(recipe: Path, count: int) -> list[list[list[int]]]:
    """The input ids (each row without its last token) of the first ``count`` global
    microbatches of the recipe's own one-rank pipeline: what every adapter must hand on."""
    from zephon.recipe import DataRecipe

    pipeline = DataRecipe.from_toml(recipe).build(seq_len=ROW_TOKENS - 1,
                                                  microbatch_size=ROWS)
    out = []
    for _, batch in zip(range(count), pipeline, strict=False):
        out.append([[int(t) for t in r.payload["input_ids"][:ROW_TOKENS - 1]]
                    for r in batch.records])
    return out

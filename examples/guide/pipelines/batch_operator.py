"""Group records into SampleBatch objects."""

from zephon import Pipeline
from zephon.demo.assets import build_demo_assets
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

# A local corpus and tokenizer stand in for the Hub dataset and "gpt2".
assets = build_demo_assets()
work_source = StaticMixtureWorkSource(
    datasets=[Dataset.from_path("demo", assets["corpus"])],
    mixture=MixtureSpec({"demo": 1.0}),
    seed=42,
)

# The default drops incomplete batches. drop_last=False keeps them, which in a
# pipeline that flushes means a short batch at every flush, not just at the end.
pipeline = (
    Pipeline(work_source)
    .tokenize(tokenizer_id=assets["tokenizer"], field="text")
    .batch(microbatch_size=32, drop_last=True)
)

for sample_batch in pipeline:
    print(len(sample_batch.records), sample_batch.ids)

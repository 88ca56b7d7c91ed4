"""zephon stats: counts where they are known, estimates marked as such."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import write_jsonl, write_parquet
from zephon.demo.assets import make_documents


def test_counted_and_estimated_figures_are_told_apart(tmp_path, tokenizer_dir):
    texts = make_documents(300, seed=4)
    write_parquet(tmp_path / "pq" / "a.parquet", texts[:137])
    write_jsonl(tmp_path / "js" / "b.jsonl", [{"text": t} for t in texts[137:]])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"""
[[datasets]]
name = "parquet"
path = "{tmp_path / 'pq'}"
[[datasets]]
name = "jsonl"
path = "{tmp_path / 'js'}"
[tokenize]
tokenizer = "{tokenizer_dir}"
""")
    run = subprocess.run([sys.executable, "-m", "zephon.cli", "stats", str(recipe)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()
            if line.split() and line.split()[0] in ("parquet", "jsonl")}
    assert rows["parquet"][2] == "137"  # Parquet metadata: counted
    assert rows["parquet"][3].startswith("~")  # tokens: from a sample
    assert rows["jsonl"][2].startswith("~")  # JSON Lines: extrapolated from bytes
    assert "~: estimated" in run.stdout

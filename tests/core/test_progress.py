"""Progress bars appear on a terminal (or when forced) and never otherwise."""

from __future__ import annotations

import pytest

from zephon.progress import enabled, progress


@pytest.mark.parametrize("setting, expected", [("0", False), ("off", False), ("1", True),
                                               ("on", True)])
def test_the_setting_decides(monkeypatch, setting, expected):
    monkeypatch.setenv("ZEPHON_PROGRESS", setting)
    assert enabled() is expected


def test_off_when_not_a_terminal_and_forced_on(monkeypatch, capsys, two_datasets,
                                               tokenizer_dir):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    monkeypatch.delenv("ZEPHON_PROGRESS", raising=False)
    assert not enabled()  # pytest's stderr is not a TTY
    assert list(progress(range(3))) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ZEPHON_PROGRESS", "1")
    source = StaticMixtureWorkSource([Dataset.from_path(n, p) for n, p in
                                      two_datasets.items()])
    estimates = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).batch(2).estimate()
    assert len(estimates) == 2
    assert "estimating tokens" in capsys.readouterr().err

"""Counts, per process, each data recipe read and each dataset listing (tests only).

On ``PYTHONPATH`` with ``ZEPHON_TEST_READ_COUNTS=DIR`` set, every Python process of a launch
appends ``recipe <path>`` for each ``DataRecipe.from_toml`` and ``listing <dataset name> <path>
<documents>`` for each dataset file listing to ``DIR/<pid>.log``.
"""

import os

_OUT = os.environ.get("ZEPHON_TEST_READ_COUNTS")


def _note(line: str) -> None:
    with open(os.path.join(_OUT, f"{os.getpid()}.log"), "a") as f:
        f.write(line + "\n")


if _OUT:
    from zephon.io.dataset import Dataset
    from zephon.recipe import DataRecipe

    _from_toml = DataRecipe.from_toml.__func__
    _list_files = Dataset._list_files

    def _counted_from_toml(cls, path, *args, **kwargs):
        _note(f"recipe {os.path.abspath(path)}")
        return _from_toml(cls, path, *args, **kwargs)

    def _counted_list_files(self):
        _note(f"listing {self.name} {self.path} {self.documents}")
        return _list_files(self)

    DataRecipe.from_toml = classmethod(_counted_from_toml)
    Dataset._list_files = _counted_list_files

"""The Megatron adapter, unchanged, reads an ``s3://``, ``gs://`` or ``az://`` recipe (moto's
S3 server, fake-gcs-server, Azurite, on 127.0.0.1): the same microbatches as the same files on
local disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron_helpers import PACKED, megatron_argv, parse

from tests.kit.object_stores import upload
from tests.objectstore.servers import started_store
from zephon.demo.assets import build_demo_assets
from zephon.recipe import DataRecipe
from zephon_megatron.arguments import settings_from_args
from zephon_megatron.provider import Topology, build_iterator

pytestmark = pytest.mark.usefixtures("megatron_cpu")


@pytest.fixture(params=["s3", "gs", "az"])
def store(request, monkeypatch, tmp_path):
    server = started_store(request.param, monkeypatch, tmp_path)
    yield request.param, server
    server.close()


def microbatches(recipe: Path, n: int) -> list[list[list[int]]]:
    settings = settings_from_args(parse(megatron_argv(recipe, "--zephon-prefetch", "0",
                                                      "--zephon-lanes", "4")))
    reader = build_iterator(DataRecipe.from_toml(recipe), settings, Topology(0, 1))
    return [next(reader)["tokens"].tolist() for _ in range(n)]


def test_megatron_reads_a_store_recipe_as_the_local_files(store, tmp_path):
    scheme, server = store
    corpus = Path(build_demo_assets()["corpus"])
    upload(server, "megatron", corpus, prefix="web/")
    cache = f'\n[cache]\nroot = "{tmp_path / "cache"}"\n'
    local = tmp_path / "local.toml"
    local.write_text(PACKED.read_text().replace('path = "demo:corpus"', f'path = "{corpus}"')
                     + cache)
    remote = tmp_path / "remote.toml"
    remote.write_text(PACKED.read_text().replace('path = "demo:corpus"',
                                                 f'path = "{scheme}://megatron/web/*.parquet"')
                      + cache)
    expected = microbatches(local, 5)
    assert microbatches(remote, 5) == expected and expected[0]

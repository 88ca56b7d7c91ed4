"""Multipart S3 objects are verified: their ETag (the MD5 of the parts' MD5s, ``-N``) is
recomputed from the part sizes the store gives (``HEAD ?partNumber=1``, or each part's), as
they download and again by ``zephon cache verify``. Against moto's S3 server, which writes
multipart ETags as S3 does, with boto3 uploading as users do (8 MiB parts above 8 MiB)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from tests.hub.hubdata import fast_options
from tests.objectstore.servers import Fault
from zephon import cli
from zephon.errors import DataError
from zephon.io import Dataset

MiB = 1 << 20


def multipart_etag(data: bytes, part_sizes: list[int]) -> str:
    digests, at = [], 0
    for size in part_sizes:
        digests.append(hashlib.md5(data[at:at + size]).digest())
        at += size
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(part_sizes)}"


@pytest.fixture(scope="module")
def big(s3_server):
    """An 11 MB object uploaded by boto3's defaults (two parts: 8 MiB and the rest), and a
    three-part one of unequal parts (5, 6 and 1 MiB, as a client may send them)."""
    data = os.urandom(11_000_000)
    s3_server.client.create_bucket(Bucket="multipart")
    s3_server.client.upload_fileobj(io.BytesIO(data), "multipart", "big/train.bin")
    uneven = os.urandom(12 * MiB)
    client = s3_server.client
    upload = client.create_multipart_upload(Bucket="multipart", Key="uneven/train.bin")
    parts, at = [], 0
    for number, size in enumerate((5 * MiB, 6 * MiB, 1 * MiB), 1):
        answer = client.upload_part(Bucket="multipart", Key="uneven/train.bin",
                                    UploadId=upload["UploadId"], PartNumber=number,
                                    Body=uneven[at:at + size])
        parts.append({"ETag": answer["ETag"], "PartNumber": number})
        at += size
    client.complete_multipart_upload(Bucket="multipart", Key="uneven/train.bin",
                                     UploadId=upload["UploadId"],
                                     MultipartUpload={"Parts": parts})
    return {"big/train.bin": data, "uneven/train.bin": uneven}


def dataset_of(path: str, tmp_path: Path) -> Dataset:
    return Dataset.from_path("d", path, fmt="jsonl").bound(fast_options(tmp_path / "cache"))


def test_moto_writes_multipart_etags_as_s3_does(s3, big):
    head = s3.client.head_object(Bucket="multipart", Key="big/train.bin")
    assert head["ETag"].strip('"') == multipart_etag(big["big/train.bin"], [8 * MiB,
                                                                            11_000_000 - 8 * MiB])
    part = s3.client.head_object(Bucket="multipart", Key="big/train.bin", PartNumber=1)
    assert part["ContentLength"] == 8 * MiB and part["PartsCount"] == 2


def test_a_byte_flipped_in_transit_is_refused_naming_the_object(s3, big, proxy, tmp_path,
                                                                capsys):
    dataset = dataset_of("s3://multipart/big/", tmp_path)
    data_file = dataset.files()[0]
    assert data_file.version.endswith("-2")
    proxy.faults.append(Fault(r"^GET /multipart/big/train\.bin", flip_at=5_000_000,
                              times=None))
    with pytest.raises(DataError) as info, dataset.local_file(data_file):
        pass
    message = str(info.value)
    assert "downloading s3://multipart/big/train.bin: the bytes received do not match its " \
           "multipart ETag" in message
    assert not any((tmp_path / "cache" / "shards").iterdir())
    assert proxy.count(r"^HEAD /multipart/big/train\.bin\?partNumber=1") >= 1


def test_cache_verify_rechecks_a_multipart_shard_and_exits_1_when_it_is_bad(s3, big, tmp_path,
                                                                           capsys):
    dataset = dataset_of("s3://multipart/big/", tmp_path)
    with dataset.local_file(dataset.files()[0]) as local:
        assert Path(local).read_bytes() == big["big/train.bin"]
    root = str(tmp_path / "cache")
    assert cli.main(["cache", "verify", "--root", root]) == 0
    assert "verified 1 shard(s), 0 bad" in capsys.readouterr().out
    with open(local, "r+b") as shard:  # a byte changed on disk, the size kept
        shard.seek(9_000_000)
        byte = shard.read(1)
        shard.seek(9_000_000)
        shard.write(bytes([byte[0] ^ 0x01]))
    assert cli.main(["cache", "verify", "--root", root]) == 1
    captured = capsys.readouterr()
    assert "s3://multipart/big/train.bin: its bytes do not match" in captured.err
    assert "verified 1 shard(s), 1 bad" in captured.out


def test_parts_of_unequal_sizes_are_asked_one_by_one(s3, big, proxy, tmp_path):
    dataset = dataset_of("s3://multipart/uneven/", tmp_path)
    with dataset.local_file(dataset.files()[0]) as local:
        assert Path(local).read_bytes() == big["uneven/train.bin"]
    assert proxy.count(r"^HEAD /multipart/uneven/train\.bin\?partNumber=[23]") == 2
    # the equal-parts guess failed once, then the object was read again with the right parts
    assert proxy.count(r"^GET /multipart/uneven/train\.bin$") == 2

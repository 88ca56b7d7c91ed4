"""No credential, from any source, appears in an error or a log line."""

from __future__ import annotations

import logging

import pytest

from tests.hub.hubdata import docs, sharded
from tests.kit.hub import load
from zephon.errors import DataError
from zephon.redact import redact

SECRET = "s3cret-pass"


def test_redact_replaces_every_kind_of_credential():
    cases = {
        f"cannot reach http://user:{SECRET}@10.0.0.1:9000/api": "http://***@10.0.0.1:9000/api",
        f"s3://bucket/k?X-Amz-Signature={SECRET}&x=1": "X-Amz-Signature=***&x=1",
        f"url https://h/f?token={SECRET}": "token=***",
        "header hf_AbCdEf0123456789xyzw": "hf_***",
    }
    for text, kept in cases.items():
        cleaned = redact(text)
        assert SECRET not in cleaned and "hf_AbCd" not in cleaned and kept in cleaned, cleaned
    assert redact("hf://org/data/train and a=b") == "hf://org/data/train and a=b"
    assert SECRET not in str(DataError(f"at http://me:{SECRET}@host/x"))
    assert SECRET not in repr(DataError(f"at http://me:{SECRET}@host/x"))


def test_a_password_in_the_endpoint_reaches_no_error_and_no_log(hub, io_options, monkeypatch,
                                                                caplog):
    endpoint = hub.url.replace("http://", f"http://user:{SECRET}@")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    hub.create("org/data", sharded(docs(8, seed=2), 1, "train.parquet"))
    hub.fail(r"/api/datasets/org/missing", 404, times=5,
             headers={"X-Error-Code": "RepoNotFound"})
    hub.fail(r"/api/datasets/org/data", 500, times=2)
    messages = []
    with caplog.at_level(logging.DEBUG, logger="zephon"):
        with pytest.raises(DataError) as info:
            load("hf://org/missing/train", io_options, endpoint=endpoint).files()
        messages.append(str(info.value))
        assert load("hf://org/data/train", io_options, endpoint=endpoint).files()
    assert "was not found" in messages[0] and "***@" in messages[0]
    logged = [r.getMessage() for r in caplog.records]
    assert any("retry" in m for m in logged)  # the 500s were logged, with the endpoint
    assert not any(SECRET in m for m in [*messages, *logged])

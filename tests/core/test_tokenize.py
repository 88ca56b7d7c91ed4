"""tokenize and tokenizer loading."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from tests.kit.texts import long_text
from zephon.errors import ConfigError
from zephon.ops.tokenize import DocumentTokenizer, TokenizeSpec
from zephon.text.tokenizer import load_tokenizer


def test_bos_eos_added_per_document(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    hf = load_tokenizer(tokenizer_dir)
    [[doc]] = tok.encode(["Kalo mi ne."])
    assert doc[0] == hf.bos_token_id and doc[-1] == hf.eos_token_id
    assert doc.dtype == np.int32
    assert hf.decode(doc[1:-1]) == "Kalo mi ne."


def test_add_bos_false_and_missing_special(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=False))
    [[doc]] = tok.encode(["ka"])
    assert doc[0] != load_tokenizer(tokenizer_dir).bos_token_id
    from tokenizers import Tokenizer

    raw = Tokenizer.from_str(load_tokenizer(tokenizer_dir).backend_tokenizer.to_str())
    with pytest.raises(ConfigError, match="add_bos=True but the tokenizer has no BOS"):
        DocumentTokenizer(TokenizeSpec(tokenizer=raw, add_bos=True))


def test_long_documents_split_when_asked(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, max_document_tokens=8))
    text = " ".join(["kalo"] * 40)
    [pieces] = tok.encode([text])
    whole = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir)).encode([text])[0][0]
    assert all(len(p) <= 8 for p in pieces) and len(pieces) > 3
    assert (np.concatenate(pieces) == whole).all()


def test_empty_text_gives_no_document(tokenizer_dir):
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    assert tok.encode(["", "ka"])[0] == []


def test_batch_size_changes_nothing(tokenizer_dir, demo_assets):
    from zephon.demo.assets import make_documents

    texts = make_documents(40, seed=3)
    a = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, batch_size=1))
    b = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, batch_size=64))
    one = [p for t in texts for p in a.encode([t])]
    many = b.encode(texts)
    assert all((x[0] == y[0]).all() for x, y in zip(one, many, strict=True))


def test_encoded_ids_are_the_backend_ids_as_int32(tokenizer_dir, demo_assets):
    from zephon.demo.assets import make_documents
    from zephon.text.tokenizer import TextEncoder, ids_array

    texts = [*make_documents(20, seed=5), ""]
    hf = load_tokenizer(tokenizer_dir)
    expected = [e.ids for e in hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    got = TextEncoder(hf).encode(texts)
    assert [ids.tolist() for ids in got] == expected
    assert all(ids.dtype == np.int32 and ids.flags.writeable for ids in got)
    assert got[-1].size == 0
    assert ids_array([0, 7, 2**31 - 1]).tolist() == [0, 7, 2**31 - 1]


def test_missing_local_tokenizer_fails_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(ConfigError, match="no such directory"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer"))
    with pytest.raises(ConfigError, match="no such directory"):
        load_tokenizer("./not-here")
    assert time.monotonic() - start < 10  # no Hub request, no retries


def test_loading_leaves_environment_and_threads_alone(tmp_path):
    from zephon.demo.assets import make_documents, train_tokenizer

    path = train_tokenizer(make_documents(30, seed=5), tmp_path / "t", vocab_size=400)
    environ = dict(os.environ)
    threads = torch.get_num_threads()
    tok = DocumentTokenizer(TokenizeSpec(tokenizer_id=path))
    tok.encode(make_documents(50, seed=6))
    assert dict(os.environ) == environ
    assert torch.get_num_threads() == threads


def test_spec_validation():
    with pytest.raises(ConfigError, match="exactly one"):
        TokenizeSpec()
    with pytest.raises(ConfigError, match="max_document_tokens"):
        TokenizeSpec(tokenizer_id="x", max_document_tokens=1)


@pytest.mark.parametrize("which", ["demo", "chat"])
def test_long_texts_in_slices_give_the_whole_text_tokens(which, tokenizer_dir, tmp_path,
                                                         monkeypatch):
    import random

    import zephon.text.tokenizer as tokenizer_module
    from zephon.demo.assets import build_chat_assets, make_documents
    from zephon.text.tokenizer import TextEncoder

    path = tokenizer_dir if which == "demo" else build_chat_assets(tmp_path, n=20)["tokenizer"]
    encoder = TextEncoder(load_tokenizer(path))
    assert encoder.sliceable
    rng = random.Random(3)
    words = " ".join(make_documents(30, seed=5)).split(" ")
    pieces = []
    for word in words[:3000]:  # spaces, runs of spaces, newlines, tabs and punctuation
        pieces.append(word + rng.choice([" ", " ", " ", "  ", "\n", " \n ", "\t", ", ", ". "]))
    text = "".join(pieces)
    whole = encoder.encode([text])[0]
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 200)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 97)
    sliced = encoder.encode([text, "short"])
    assert np.array_equal(sliced[0], whole)
    assert np.array_equal(sliced[1], encoder.encode(["short"])[0])


@pytest.mark.parametrize("limit", [7, 64, 500])
def test_long_texts_are_cut_into_pieces_as_they_are_taken(tokenizer_dir, monkeypatch, limit):
    """With max_document_tokens a long text's pieces are made slice by slice: the same pieces
    as cutting the whole text's tokens, made one at a time."""
    import zephon.ops.tokenize as tokenize_module
    import zephon.text.tokenizer as tokenizer_module
    from zephon.ops.base import LazyPieces
    from zephon.records import Doc

    text = long_text(3000)
    op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, max_document_tokens=limit))
    [eager] = op.encode([text])
    monkeypatch.setattr(tokenize_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 333)
    doc = Doc(None, "d", "web", fields={"text": text})
    [outcome, short] = op.apply([doc, Doc(None, "s", "web", fields={"text": "Ka lo."})],
                                ["row 0", "row 1"])
    assert isinstance(outcome, LazyPieces) and isinstance(short, list)
    made = []
    slices = []
    real = op.encoder.slices

    def counted(text):
        for ids in real(text):
            slices.append(len(made))
            yield ids

    monkeypatch.setattr(op.encoder, "slices", counted)
    for piece in outcome:
        made.append(piece)
    assert [p.tokens.tolist() for p in made] == [p.tolist() for p in eager]
    assert [p.doc_start for p in made] == [limit * i for i in range(len(eager))]
    assert len(slices) > 5 and slices == sorted(slices)
    assert slices[-1] > 0  # the text was tokenized while pieces were taken, not before
    assert list(outcome)[3].tokens.tolist() == eager[3].tolist()  # iterating again remakes


def test_a_long_document_resumes_inside_itself_exactly(tokenizer_dir, tmp_path,
                                                       monkeypatch) -> None:
    import zephon.ops.tokenize as tokenize_module
    import zephon.text.tokenizer as tokenizer_module
    from tests.conftest import write_jsonl
    from zephon import Pipeline
    from zephon.engine.dataset_source import DatasetSource, _LazyRow
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    monkeypatch.setattr(tokenize_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 333)
    path = write_jsonl(tmp_path / "long.jsonl", [{"text": "Short one."}, {"text": long_text(4000)},
                                                 {"text": "Another short one."}])

    def pipeline(**options) -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("long", path)], shuffle_rows=False)
        return (Pipeline(source).options(**options)
                .tokenize(tokenizer_id=tokenizer_dir, max_document_tokens=48)
                .pack_flat(33).batch(2))

    def rows(batches) -> list[list[int]]:
        return [r.payload["input_ids"].tolist() for b in batches for r in b.records]

    straight = rows(pipeline(prefetch=0))
    assert len(straight) > 100
    assert rows(pipeline(workers=1)) == straight  # pieces made in a worker are the same
    batches = len(straight) // 2
    for cut in (3, batches // 3, batches - 2):
        run = pipeline()
        iterator = iter(run)
        head = rows(next(iterator) for _ in range(cut))
        state = run.state_dict()
        assert len(str(state)) < 20_000, "a long document's pieces went into the state"
        resumed = pipeline()
        resumed.load_state_dict(state)
        assert head + rows(resumed) == straight, cut
    sources = []
    real_init = DatasetSource.__init__

    def recorded(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        sources.append(self)

    monkeypatch.setattr(DatasetSource, "__init__", recorded)
    iterator = iter(pipeline(prefetch=0))
    for _ in range(20):
        next(iterator)
    [source] = sources
    assert isinstance(source._ahead[0], _LazyRow)  # inside the long document
    assert len(source._ahead) <= 2  # its next piece and the row after it, not all pieces


def test_a_very_long_document_without_a_limit_is_named_once(tokenizer_dir, monkeypatch,
                                                             caplog):
    import zephon.ops.tokenize as tokenize_module
    from zephon.records import Doc

    monkeypatch.setattr(tokenize_module, "LONG_DOCUMENT_TOKENS", 100)
    op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    docs = [Doc(None, f"d{i}", "web", fields={"text": long_text(200)}) for i in range(2)]
    with caplog.at_level("WARNING", logger="zephon.ops.tokenize"):
        op.apply(docs, ["web/part-0.jsonl:7", "web/part-0.jsonl:8"])
        op.apply(docs, ["web/part-0.jsonl:9", "web/part-0.jsonl:10"])
    [record] = [r for r in caplog.records if "max_document_tokens" in r.getMessage()]
    assert "web/part-0.jsonl:7" in record.getMessage()
    assert "[tokenize] max_document_tokens" in record.getMessage()


def test_a_saved_tokenizer_is_read_once_and_its_settings_never_cut_documents(tmp_path):
    """The tokenizer read for an encoder is used in place (no copy); one loaded through
    transformers, which others may hold, is copied. Both give the digest of the saved file's
    definition and encode whole documents, whatever truncation the file asks for."""
    import json
    import pickle
    import shutil

    from zephon.demo.assets import make_documents, train_tokenizer
    from zephon.text.tokenizer import TextEncoder, _SavedFastTokenizer

    path = train_tokenizer(make_documents(30, seed=5), tmp_path / "t", vocab_size=400)
    spec = json.loads((tmp_path / "t" / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 5, "strategy": "LongestFirst",
                          "stride": 0}
    truncating = tmp_path / "truncating"
    shutil.copytree(path, truncating)
    (truncating / "tokenizer.json").write_text(json.dumps(spec))
    text = make_documents(1, seed=9, min_words=200, max_words=200)[0]

    saved = _SavedFastTokenizer.try_load(str(truncating))
    own = TextEncoder(saved)
    assert own._backend is saved.backend_tokenizer  # read for this encoder: not copied
    shared = load_tokenizer(str(truncating))
    copied = TextEncoder(shared)
    assert copied._backend is not shared.backend_tokenizer
    assert shared.backend_tokenizer.truncation is not None  # the owner's object is untouched
    assert own.digest == copied.digest != TextEncoder(load_tokenizer(path)).digest
    whole = own.encode([text])[0]
    assert whole.size > 100
    assert np.array_equal(copied.encode([text])[0], whole)

    travelled = pickle.loads(pickle.dumps(copied))
    assert travelled.tokenizer is None  # the backend alone travels to worker processes
    assert np.array_equal(travelled.encode([text])[0], whole)
    assert travelled.digest == copied.digest and travelled.special == copied.special
    assert len(pickle.dumps(own)) < 1.2 * len(saved.backend_tokenizer.to_str())


CONTROL_TEXT = "A page on tokens: <|eos|> ends one, <|pad|> fills and <|bos|> opens the next."


def control_ids(tokenizer_dir) -> set[int]:
    hf = load_tokenizer(tokenizer_dir)
    return {hf.bos_token_id, hf.eos_token_id, hf.pad_token_id}


def test_special_token_text_in_a_document_is_plain_text(tokenizer_dir):
    hf = load_tokenizer(tokenizer_dir)
    [[doc]] = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir)).encode([CONTROL_TEXT])
    assert doc[0] == hf.bos_token_id and doc[-1] == hf.eos_token_id
    assert not control_ids(tokenizer_dir) & set(doc[1:-1].tolist())
    assert hf.decode(doc[1:-1]) == CONTROL_TEXT
    kept = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, split_special_tokens=False))
    [[marked]] = kept.encode([CONTROL_TEXT])
    assert control_ids(tokenizer_dir) <= set(marked[1:-1].tolist())  # markers on purpose


def test_split_special_tokens_is_in_the_fingerprint(tokenizer_dir):
    split = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir)).fingerprint()
    kept = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir,
                                          split_special_tokens=False)).fingerprint()
    assert split["split_special_tokens"] is True and kept["split_special_tokens"] is False


def test_every_encoding_path_gives_the_same_plain_ids(tokenizer_dir, monkeypatch):
    """Batch calls with and without a pool turn, offsets, long-text slices, a copied backend
    and an encoder sent to a worker process all give the ids of the backend's own switch."""
    import pickle

    from tokenizers import Tokenizer

    import zephon.text.tokenizer as tokenizer_module
    from zephon.text.tokenizer import TextEncoder, resolve_encoder

    words = long_text(900).split(" ")
    markers = ["<|eos|>", "<|pad|>", "<|bos|>", "x<|eos|>y", "<|pad|><|bos|>"]
    text = " ".join(w if i % 9 else f"{w} {markers[i % 5]}" for i, w in enumerate(words))
    reference = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    reference.encode_special_tokens = True
    expected = reference.encode(text, add_special_tokens=False).ids
    assert not control_ids(tokenizer_dir) & set(expected)

    own = resolve_encoder(tokenizer_dir, None, split_special_tokens=True)
    copied = TextEncoder(load_tokenizer(tokenizer_dir), split_special_tokens=True)
    travelled = pickle.loads(pickle.dumps(copied))
    for encoder in (own, copied, travelled):
        assert encoder.encode([text])[0].tolist() == expected
        assert all(ids.tolist() == expected for ids in encoder.encode([text] * 20))
        assert encoder.encode_with_offsets(text).ids == expected
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 200)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 97)
    for encoder in (own, copied, travelled):
        assert len(list(encoder.slices(text))) > 20
        assert encoder.encode([text, "ka"])[0].tolist() == expected
    assert TextEncoder(load_tokenizer(tokenizer_dir)).encode([text])[0].tolist() != expected


def test_a_python_tokenizer_splits_special_token_text_too():
    from transformers import ByT5Tokenizer

    from zephon.text.tokenizer import TextEncoder

    python = ByT5Tokenizer()  # no Rust backend: encoded through transformers' own call
    assert getattr(python, "backend_tokenizer", None) is None
    text = "one </s> two"
    [split] = TextEncoder(python, split_special_tokens=True).encode([text])
    assert python.eos_token_id not in split.tolist()
    assert python.decode(split.tolist()) == text
    [kept] = TextEncoder(python).encode([text])
    assert python.eos_token_id in kept.tolist()


def test_a_tokenizer_that_cannot_split_special_tokens_is_refused():
    class Refusing:
        eos_token_id = 1

        def get_vocab(self):
            return {"x": 0, "</s>": 1}

        def __call__(self, texts, add_special_tokens=True, split_special_tokens=False):
            if split_special_tokens:
                raise ValueError("this tokenizer does not support split_special_tokens")
            return {"input_ids": [[0] for _ in texts]}

    with pytest.raises(ConfigError, match="split_special_tokens=False"):
        DocumentTokenizer(TokenizeSpec(tokenizer=Refusing()))
    assert DocumentTokenizer(TokenizeSpec(tokenizer=Refusing(), split_special_tokens=False))


def gpt2_style_tokenizer(path) -> str:
    """A byte-level BPE whose BOS and EOS are both ``<|endoftext|>``, as GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from zephon.demo.assets import make_documents

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(make_documents(30, seed=5), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>").save_pretrained(str(path))
    return str(path)


def test_a_bos_that_is_the_eos_is_not_added_unless_asked(tmp_path):
    path = gpt2_style_tokenizer(tmp_path / "gpt2")
    hf = load_tokenizer(path)
    end = hf.eos_token_id
    assert hf.bos_token_id == end
    plain = DocumentTokenizer(TokenizeSpec(tokenizer_id=path)).encode(["Ka lo.", "Mi ne."])
    ids = np.concatenate([doc for [doc] in plain]).tolist()
    assert ids.count(end) == 2 and ids[-1] == end  # one separator per document, not two
    assert plain[0][0].tolist() == hf("Ka lo.", add_special_tokens=False)["input_ids"] + [end]
    for tokenizer in (dict(tokenizer_id=path), dict(tokenizer=hf)):
        op = DocumentTokenizer(TokenizeSpec(**tokenizer))
        assert op.bos is None and op.fingerprint()["bos"] is None
        asked = DocumentTokenizer(TokenizeSpec(**tokenizer, add_bos=True))
        [[doc]] = asked.encode(["Ka lo."])
        assert doc[0] == end and doc[-1] == end and asked.fingerprint()["bos"] == end


def write_surrogate_jsonl(path):
    """JSON Lines whose second line escapes a lone surrogate, as scraped data does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"text": "Ka lo mi."}\n{"text": "x \\udc80 y"}\n{"text": "Mi ne."}\n')
    return path


def test_a_lone_surrogate_is_an_error_naming_the_row_and_the_cleaning_map(tokenizer_dir,
                                                                           monkeypatch):
    import json

    import zephon.ops.tokenize as tokenize_module
    import zephon.text.tokenizer as tokenizer_module
    from zephon.errors import DataError
    from zephon.records import Doc

    bad = json.loads('"x \\udc80 y"')
    op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir, max_document_tokens=64))
    texts = [f"Ka lo {i}." for i in range(30)]
    for at in (1, 17):  # a short batch call, and one that takes a turn in the pool
        batch = [*texts[:at], bad, *texts[at:]]
        docs = [Doc(None, f"d{i}", "web", fields={"text": t}) for i, t in enumerate(batch)]
        with pytest.raises(DataError, match=rf"web/part-0\.jsonl:{at + 1}: field 'text', "
                                            r"character 2, holds the surrogate code point "
                                            r"U\+DC80.*zephon\.text\.tokenizer:replace_surrogates"):
            op.apply(docs, [f"web/part-0.jsonl:{i + 1}" for i in range(len(batch))])
    monkeypatch.setattr(tokenize_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "LONG_TEXT_CHARS", 1000)
    monkeypatch.setattr(tokenizer_module, "SLICE_CHARS", 333)
    long = long_text(400)
    long = long[:2500] + "\ud83d" + long[2500:]
    [lazy] = op.apply([Doc(None, "d", "web", fields={"text": long})], ["web/part-1.jsonl:9"])
    with pytest.raises(DataError, match=r"web/part-1\.jsonl:9: field 'text', character 2500, "
                                        r"holds the surrogate code point U\+D83D"):
        list(lazy)


def test_the_cleaning_map_replaces_lone_surrogates_in_a_pipeline(tokenizer_dir, tmp_path):
    from zephon import Pipeline
    from zephon.errors import DataError
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    path = write_surrogate_jsonl(tmp_path / "web" / "part-0.jsonl")

    def pipeline() -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("web", path)], shuffle_rows=False)
        return Pipeline(source).options(prefetch=0)

    tokenized = pipeline().tokenize(tokenizer_id=tokenizer_dir).pack_sequences(64).batch(1)
    with pytest.raises(DataError, match=r"part-0\.jsonl:2: field 'text', character 2, holds"):
        list(tokenized)
    from zephon.text.tokenizer import replace_surrogates

    cleaned = (pipeline().map(replace_surrogates).tokenize(tokenizer_id=tokenizer_dir)
               .pack_sequences(64).batch(1))
    op = DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
    expected = [op.encode([t])[0][0].tolist() for t in ("Ka lo mi.", "x \ufffd y", "Mi ne.")]
    got = [ids.tolist() for b in cleaned for r in b.records for ids in r.payload["documents"]]
    assert sorted(got) == sorted(expected)
    assert replace_surrogates({"a": "\ud800\udc00 ok", "b": [{"c": "\udfff"}], "n": 3}) == \
        {"a": "\ufffd\ufffd ok", "b": [{"c": "\ufffd"}], "n": 3}


def test_special_token_text_stays_text_in_threads_and_worker_processes(tokenizer_dir,
                                                                       tmp_path):
    from tests.conftest import write_jsonl
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    hf = load_tokenizer(tokenizer_dir)
    texts = [f"Row {i}: {CONTROL_TEXT}" for i in range(40)]
    path = write_jsonl(tmp_path / "web.jsonl", [{"text": t} for t in texts])

    def documents(split: bool = True, **options) -> list[list[int]]:
        source = StaticMixtureWorkSource([Dataset.from_path("web", path)], shuffle_rows=False)
        kept = {} if split else {"split_special_tokens": False}
        pipeline = (Pipeline(source).options(**options)
                    .tokenize(tokenizer_id=tokenizer_dir, **kept)
                    .pack_sequences(4096).batch(1, drop_last=False))
        return sorted(d.tolist() for b in pipeline for r in b.records
                      for d in r.payload["documents"])

    expected = sorted(DocumentTokenizer(TokenizeSpec(tokenizer_id=tokenizer_dir))
                      .encode([t])[0][0].tolist() for t in texts)
    for options in ({"prefetch": 0}, {}, {"workers": 1}):  # producer, document threads, worker
        docs = documents(**options)
        assert docs == expected, options
        assert all(not control_ids(tokenizer_dir) & set(d[1:-1]) for d in docs)
        assert sorted(hf.decode(d[1:-1]) for d in docs) == sorted(texts)
    assert all(control_ids(tokenizer_dir) <= set(d[1:-1]) for d in documents(False, workers=1))


def test_a_truncated_tokenizer_json_is_named(tokenizer_dir, tmp_path):
    import shutil

    damaged = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, damaged)
    text = (damaged / "tokenizer.json").read_text()
    (damaged / "tokenizer.json").write_text(text[:len(text) // 2])
    with pytest.raises(ConfigError, match=r"tok/tokenizer\.json cannot be read .*truncated"):
        DocumentTokenizer(TokenizeSpec(tokenizer_id=str(damaged)))

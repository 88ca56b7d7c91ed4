"""tokenize_chat: assistant-only train masks, through packing and to_training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import write_jsonl
from zephon import Pipeline
from zephon.demo.assets import make_documents
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset
from zephon.ops.pack import Doc, Packer, PackSpec
from zephon.ops.tokenize_chat import ChatTokenizer, TokenizeChatSpec
from zephon.work import StaticMixtureWorkSource

CHATML = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message.get('content') or '' }}"
    "{% if message.get('tool_calls') %}{{ '<tool_call>' + (message['tool_calls'] | tojson) + "
    "'</tool_call>' }}{% endif %}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + (message.get('content') or '') + "
    "'<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA3 = (
    "{{ '<|begin_of_text|>' }}"
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\nTools: ' + "
    "(tools | tojson) + '<|eot_id|>' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message.get('tool_calls') %}{{ message['tool_calls'] | tojson }}"
    "{% else %}{{ message.get('content') or '' }}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}


@pytest.fixture(scope="module")
def chat_tokenizers(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [*make_documents(300, seed=11), '{"name": "get_weather", "arguments": {}}']
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1500, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = {}
    for name, template in (("chatml", CHATML), ("llama3", LLAMA3)):
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|bos|>",
                                      eos_token="<|eos|>", pad_token="<|pad|>")
        tok.chat_template = template
        path = tmp_path_factory.mktemp(name)
        tok.save_pretrained(str(path))
        out[name] = str(path)
    return out


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Kalo mi ne?"},
    {"role": "assistant", "content": "Ne ta shi."},
    {"role": "user", "content": "Weather in Lima?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "Lima"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "It is 21 degrees."},
]


def trained_turns(tokenizer, ids, mask) -> list[str]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [tokenizer.decode(ids[s:e].tolist()) for s, e in zip(edges[::2], edges[1::2],
                                                                strict=True)]


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_trained_tokens_are_exactly_the_assistant_replies(chat_tokenizers, style):
    chat = ChatTokenizer(TokenizeChatSpec(tokenizer_id=chat_tokenizers[style]))
    assert chat.markers == (style == "chatml")
    ids, mask = chat.encode_conversation(CONVERSATION, TOOLS)
    eot = END_OF_TURN[style]
    call = json.dumps(CONVERSATION[4]["tool_calls"], separators=(", ", ": "))
    expected = ["Ne ta shi." + eot,
                ("<tool_call>" + call + "</tool_call>" if style == "chatml" else call) + eot,
                "It is 21 degrees." + eot]
    turns = trained_turns(chat.tokenizer, ids, mask)
    assert [t.replace(" ", "") for t in turns] == [e.replace(" ", "") for e in expected]
    assert "Be brief" not in "".join(turns) and "Lima?" not in "".join(turns)


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_train_on_last_turn_only(chat_tokenizers, style):
    chat = ChatTokenizer(TokenizeChatSpec(tokenizer_id=chat_tokenizers[style], train_on="last"))
    ids, mask = chat.encode_conversation(CONVERSATION, TOOLS)
    assert trained_turns(chat.tokenizer, ids, mask) == [
        "It is 21 degrees." + END_OF_TURN[style]]


def test_template_that_rewrites_turns_fails_closed(chat_tokenizers):
    rewriting = LLAMA3.replace("{{ message.get('content') or '' }}",
                               "{{ (message.get('content') or '') if loop.last else 'X' }}")
    chat = ChatTokenizer(TokenizeChatSpec(tokenizer_id=chat_tokenizers["llama3"],
                                          chat_template=rewriting))
    with pytest.raises(ConfigError, match="cannot find assistant turn 2"):
        chat.encode_conversation([*CONVERSATION[:4], {"role": "assistant", "content": "ok"}])


def test_tokenizer_without_template_is_refused(tokenizer_dir):
    with pytest.raises(ConfigError, match="no chat template"):
        ChatTokenizer(TokenizeChatSpec(tokenizer_id=tokenizer_dir))


ROWS = [
    {"messages": CONVERSATION[1:3]},
    {"messages": [{"role": "user", "content": "only a question"}]},        # no_assistant
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]},
    {"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]},
    {"messages": None},                                                     # missing_field
    {"messages": "not json"},                                               # invalid
    {"messages": CONVERSATION},
]


def chat_pipeline(path, tokenizer, **kwargs) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("chat", path)], seed=0,
                                     shuffle_rows=False, shuffle_units=False)
    return Pipeline(source).tokenize_chat(tokenizer_id=tokenizer, **kwargs)


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_untrainable_conversations_are_dropped_and_counted(tmp_path, chat_tokenizers, style):
    write_jsonl(tmp_path / "chat.jsonl", ROWS)
    pipeline = chat_pipeline(tmp_path / "chat.jsonl", chat_tokenizers[style]).batch(
        1, drop_last=False)
    batches = list(pipeline)
    assert len(batches) == 2
    [report] = pipeline.report().datasets
    assert report.documents == 2
    assert report.skipped == {"no_assistant": 1, "empty": 1, "unknown_role": 1,
                              "missing_field": 1, "invalid": 1}
    assert "skipped rows" in str(pipeline.report())


def test_untrainable_can_raise(tmp_path, chat_tokenizers):
    write_jsonl(tmp_path / "chat.jsonl", ROWS[:2])
    pipeline = chat_pipeline(tmp_path / "chat.jsonl", chat_tokenizers["chatml"],
                             on_untrainable="raise").batch(1)
    with pytest.raises(DataError, match=r"chat\.jsonl:\d+: conversation has nothing to "
                                        r"train on \(no_assistant"):
        list(pipeline)


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
def test_masks_survive_packing_and_to_training(tmp_path, chat_tokenizers, algorithm):
    rows = [{"messages": CONVERSATION[:3]}, {"messages": CONVERSATION}] * 6
    write_jsonl(tmp_path / "chat.jsonl", rows)
    pipeline = (chat_pipeline(tmp_path / "chat.jsonl", chat_tokenizers["llama3"])
                .pack_flat(97, algorithm).batch(2, drop_last=False))
    tokenizer = ChatTokenizer(TokenizeChatSpec(tokenizer_id=chat_tokenizers["llama3"]))
    masks = {}
    for batch in pipeline:
        out = batch.to_training(return_labels=True, return_loss_mask=True,
                                return_num_valid_tokens=True)
        assert int(out["num_valid_tokens"]) == int(out["loss_mask"].sum())
        for row, record in enumerate(batch.records):
            for span in record.meta["documents"]:
                masks.setdefault(span.doc_id, {})
                labels = out["labels"][row].numpy()
                for j in range(span.length):
                    pos = span.row_start + j
                    if pos >= 1:  # the label at pos-1 predicts token pos
                        masks[span.doc_id][span.doc_start + j] = labels[pos - 1] != -100
    lines = (tmp_path / "chat.jsonl").read_bytes().splitlines(keepends=True)
    offsets = np.cumsum([0] + [len(line) for line in lines[:-1]])  # JSONL ids: byte offsets
    assert len(masks) == len(rows)
    for offset, row in zip(offsets, rows, strict=True):
        _, expected = tokenizer.encode_conversation(row["messages"])
        got = masks[f"chat:0:{offset}"]
        for position, supervised in got.items():
            assert supervised == expected[position], (offset, position)


@st.composite
def conversations(draw):
    words = ["ka", "lo", "mi", "ne", "ta", "shi", "ven"]
    n = draw(st.integers(1, 4))
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": " ".join(draw(st.lists(
            st.sampled_from(words), min_size=1, max_size=5)))})
    for _ in range(n):
        for role in ("user", "assistant"):
            messages.append({"role": role, "content": " ".join(draw(st.lists(
                st.sampled_from(words), min_size=1, max_size=12)))})
    return messages


@settings(max_examples=40, deadline=None)
@given(st.lists(conversations(), min_size=1, max_size=6), st.integers(8, 60),
       st.sampled_from(["wrap", "first_fit", "best_fit"]), st.sampled_from(["chatml", "llama3"]))
def test_supervised_labels_equal_shifted_assistant_spans(chat_tokenizers, convs, max_length,
                                                         algorithm, style):
    from zephon import SampleBatch

    chat = _chat(chat_tokenizers[style])
    packer = Packer(PackSpec(max_length, algorithm, max_open_bins=3), 0, 0)
    docs, rows = {}, []
    for i, messages in enumerate(convs):
        ids, mask = chat.encode_conversation(messages)
        docs[f"c{i}"] = mask
        rows += packer.add(Doc(ids, f"c{i}", "chat", 0, mask))
    rows += packer.flush()
    out = SampleBatch(rows).to_training(return_labels=True)
    labels = out["labels"].numpy()
    supervised = {(r, i) for r, i in zip(*np.nonzero(labels != -100), strict=True)}
    expected = set()
    for r, record in enumerate(rows):
        for span in record.meta["documents"]:
            mask = docs[span.doc_id][span.doc_start:span.doc_start + span.length]
            for j in np.flatnonzero(mask):
                if span.row_start + j >= 1:
                    expected.add((r, span.row_start + j - 1))
    assert supervised == expected


_CHATS: dict[str, ChatTokenizer] = {}


def _chat(path: str) -> ChatTokenizer:
    if path not in _CHATS:
        _CHATS[path] = ChatTokenizer(TokenizeChatSpec(tokenizer_id=path))
    return _CHATS[path]


def test_conversation_opening_with_the_assistant(chat_tokenizers):
    chat = ChatTokenizer(TokenizeChatSpec(tokenizer_id=chat_tokenizers["llama3"]))
    messages = [{"role": "assistant", "content": "Hello there."},
                {"role": "user", "content": "Ka?"},
                {"role": "assistant", "content": "Lo."}]
    ids, mask = chat.encode_conversation(messages)
    assert trained_turns(chat.tokenizer, ids, mask) == ["Hello there.<|eot_id|>", "Lo.<|eot_id|>"]
    assert not mask[0]  # <|begin_of_text|> and the header stay context


def test_bad_tools_field_is_counted(tmp_path, chat_tokenizers):
    write_jsonl(tmp_path / "chat.jsonl", [
        {"messages": CONVERSATION[1:3], "tools": "{not json"},
        {"messages": CONVERSATION[1:3], "tools": "{\"a\": 1}"},
        {"messages": CONVERSATION[1:3], "tools": json.dumps(TOOLS)}])
    pipeline = chat_pipeline(tmp_path / "chat.jsonl", chat_tokenizers["llama3"],
                             tools_field="tools").batch(1, drop_last=False)
    assert len(list(pipeline)) == 1
    assert pipeline.report().datasets[0].skipped == {"invalid": 2}


def test_the_demo_templates_with_and_without_markers_train_the_same_tokens(tmp_path):
    """The marked template reads the replies from its marks (one render, the batch call, which
    releases the GIL: the operator goes to the document threads); the unmarked one renders
    prefixes. Both give the same ids and masks."""
    from zephon.demo.assets import MARKED_CHAT_TEMPLATE, build_chat_assets, make_conversations

    paths = build_chat_assets(tmp_path, n=20)
    marked = ChatTokenizer(TokenizeChatSpec(tokenizer_id=paths["tokenizer"],
                                            chat_template=MARKED_CHAT_TEMPLATE))
    plain = ChatTokenizer(TokenizeChatSpec(tokenizer_id=paths["tokenizer"]))
    assert (marked.markers, marked.releases_gil) == (True, True)
    assert (plain.markers, plain.releases_gil) == (False, False)
    for messages in make_conversations(20, seed=3):
        ids, mask = marked.encode_conversation(messages)
        plain_ids, plain_mask = plain.encode_conversation(messages)
        assert ids.tolist() == plain_ids.tolist() and mask.tolist() == plain_mask.tolist()
        replies = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert trained_turns(marked.tokenizer, ids, mask) == replies


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_a_lone_surrogate_in_a_message_is_an_error_naming_the_row(tmp_path, chat_tokenizers,
                                                                  style):
    """With generation markers (transformers encodes the render) and without (the encoder's
    offsets) alike; the cleaning map then lets the conversation through, its template markers
    still the control ids."""
    path = tmp_path / "chat.jsonl"
    good = json.dumps({"messages": CONVERSATION[1:3]})
    bad = good.replace("Ne ta shi.", "Ne \\udc80 ta shi.")
    path.write_text(f"{good}\n{bad}\n")
    pipeline = chat_pipeline(path, chat_tokenizers[style]).batch(1, drop_last=False)
    with pytest.raises(DataError, match=r"chat\.jsonl:2: field 'messages': message 1 \(role "
                                        r"'assistant'\) holds the surrogate code point U\+DC80"
                                        r".*zephon\.text\.tokenizer:replace_surrogates"):
        list(pipeline)
    from zephon.text.tokenizer import replace_surrogates

    source = StaticMixtureWorkSource([Dataset.from_path("chat", path)], seed=0,
                                     shuffle_rows=False, shuffle_units=False)
    cleaned = (Pipeline(source).map(replace_surrogates)
               .tokenize_chat(tokenizer_id=chat_tokenizers[style]).batch(1, drop_last=False))
    [first, second] = [b.records[0].payload["input_ids"] for b in cleaned]
    chat = _chat(chat_tokenizers[style])
    assert "Ne \ufffd ta shi." in chat.tokenizer.decode(second.tolist())
    marker = chat.tokenizer.convert_tokens_to_ids(END_OF_TURN[style])
    assert first.tolist().count(marker) == second.tolist().count(marker) == 2

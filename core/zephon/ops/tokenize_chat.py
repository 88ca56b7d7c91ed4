"""``tokenize_chat``: conversations -> token ids plus a mask of the tokens to train on.

A conversation is a list of ``{"role", "content"}`` messages (assistant messages may carry
``tool_calls`` instead of content), optionally with a list of tool schemas in another column.
It is rendered with the tokenizer's chat template (or ``chat_template``) and tokenized as a
whole; the template decides BOS and turn markers, so nothing else is added.

Which tokens are trained on: the assistant turns, each with its end-of-turn token (the model
must learn to stop); never system, user or tool turns. ``train_on="all"`` (default) trains
every non-empty assistant turn, ``"last"`` only the final one. The spans are found:

1. with generation markers (``{% generation %}...{% endgeneration %}``) in the template, from
   the template itself (transformers' assistant-token mask); each marked block is one turn;
2. without markers, by rendering prefixes: for assistant message ``i``, the rendering of
   messages ``[:i]`` with the generation prompt must be a prefix of the rendering of ``[:i+1]``,
   which must be a prefix of the whole conversation; the difference (less trailing whitespace)
   is the turn. A template that breaks this (one that rewrites earlier turns, say) raises
   ConfigError naming the problem. Costs two renders per assistant turn.

Fail closed: a conversation with nothing to train on (no assistant turn, only empty ones, an
unknown role, a missing or malformed field) is dropped and counted by reason, or raises with
``on_untrainable="raise"``. There is no fallback to training on every token.

Special tokens: the rendered conversation is encoded with special-token text as control tokens,
so the template's own markers (``<|im_start|>``, ``<|im_end|>``, BOS) are the control ids they
must be. The same holds for special-token text inside a message's content: the template's
output does not say which characters came from the messages (``tokenize``'s
``split_special_tokens`` has no counterpart here).

Engine: conversations are encoded by ``tokenizers`` alone (``zephon.text.tokenizer``'s
``engine="hf"``), never by the fast engine: both ways of finding the trained spans map
character spans to tokens, by offsets (prefix rendering) or transformers' ``char_to_token``
(generation markers), and fastokens gives no offsets.

A message holding a surrogate code point (from a JSON escape such as ``\\udc80``) is a
DataError naming the row and the message, found only after the tokenizer refuses the text; the
map ``zephon.text.tokenizer.replace_surrogates`` cleans such data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError, DataError
from zephon.logs import get_logger
from zephon.ops.base import (
    Dropped,
    Outcome,
)
from zephon.ops.tokenize import TokenizerChoice, TokenizingOperator, split_pieces
from zephon.records import Doc
from zephon.text.tokenizer import (
    TextEncoder,
    UnencodableText,
    find_surrogate,
    load_tokenizer,
    surrogate_advice,
)

log = get_logger(__name__)

ROLES = ("system", "user", "assistant", "tool")
_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class TokenizeChatSpec(TokenizerChoice):
    """Options of ``tokenize_chat``; its tokenizer must have a chat template (or be given
    ``chat_template``)."""

    op_name: ClassVar[str] = "tokenize_chat"
    title: ClassVar[str] = "tokenizer or tokenize_chat"

    field: str = "messages"
    """Column holding the conversation (a list of role/content messages)."""
    chat_template: str | None = None
    """A Jinja chat template overriding the tokenizer's."""
    tools_field: str | None = None
    """Column holding the tool schemas offered in the conversation (list or JSON text)."""
    train_on: str = "all"
    """``all`` assistant turns, or only the ``last`` one."""
    on_untrainable: str = "drop"
    """``drop`` (and count) conversations with nothing to train on, or ``raise``."""
    roles: tuple[str, ...] = ROLES
    """Roles accepted in a conversation; others make it untrainable (``unknown_role``)."""
    max_document_tokens: int | None = None
    """Split longer conversations into pieces of at most this many tokens."""
    batch_size: int = dataclasses.field(default=64, metadata={"fingerprint": False})
    """Conversations rendered per read-ahead batch; affects speed only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.roles, list):
            object.__setattr__(self, "roles", tuple(self.roles))
        if (self.tokenizer_id is None) == (self.tokenizer is None):
            raise ConfigError("tokenize_chat: give exactly one of tokenizer_id=... or "
                              "tokenizer=...")
        if self.train_on not in ("all", "last"):
            raise ConfigError(f"tokenize_chat: train_on={self.train_on!r} is not 'all' or "
                              "'last'")
        if self.on_untrainable not in ("drop", "raise"):
            raise ConfigError(f"tokenize_chat: on_untrainable={self.on_untrainable!r} is not "
                              "'drop' or 'raise'")
        if "assistant" not in self.roles:
            raise ConfigError("tokenize_chat: roles must include 'assistant'")
        if self.max_document_tokens is not None and self.max_document_tokens < 2:
            raise ConfigError("tokenize_chat: max_document_tokens must be >= 2")
        if self.batch_size <= 0:
            raise ConfigError("tokenize_chat: batch_size must be positive")

    def operator(self) -> ChatTokenizer:
        return ChatTokenizer(self)


class _Untrainable(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class _Surrogate(Exception):
    """The tokenizer refused a conversation holding a surrogate code point."""

    def __init__(self, place: str, code: int):
        super().__init__(place, code)
        self.place, self.code = place, code


class ChatTokenizer(TokenizingOperator):
    """Runtime side of :class:`TokenizeChatSpec`."""

    def __init__(self, spec: TokenizeChatSpec):
        super().__init__(spec)
        self.spec: TokenizeChatSpec = spec
        self.batch_size = spec.batch_size
        tokenizer = spec.tokenizer if spec.tokenizer is not None else \
            load_tokenizer(spec.tokenizer_id)
        if not hasattr(tokenizer, "apply_chat_template"):
            raise ConfigError("tokenize_chat needs a transformers tokenizer (it renders chat "
                              "templates)")
        template = spec.chat_template or getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            raise ConfigError("tokenize_chat: the tokenizer has no chat template; pass "
                              "chat_template=<jinja template>")
        self.tokenizer = tokenizer
        self.template = template
        self.markers = bool(_MARKER.search(template))
        # With markers the rendered conversation is encoded by the tokenizer's batch call,
        # which releases the GIL; without, by a single encode with offsets, which holds it,
        # and the two renders per assistant turn (Python) are most of the work.
        self.releases_gil = self.markers
        self.encoder = TextEncoder(tokenizer)
        log.info("zephon: tokenize_chat encodes with %s, not fastokens: its assistant masks "
                 "need character offsets, which fastokens does not give", self.encoder.engine)
        self.columns = [spec.field] + ([spec.tools_field] if spec.tools_field else [])

    def fingerprint_options(self) -> dict[str, Any]:
        return {
            "chat_template": hashlib.sha256(self.template.encode()).hexdigest()[:16],
            "tools_field": self.spec.tools_field,
            "train_on": self.spec.train_on,
            "roles": list(self.spec.roles),
            "max_document_tokens": self.spec.max_document_tokens,
        }

    # -- encoding --------------------------------------------------------------------------
    def apply(self, docs: Sequence[Doc], where: Sequence[str]) -> list[Outcome]:
        out: list[Outcome] = []
        for doc, label in zip(docs, where, strict=True):
            fields = doc.fields or {}
            if self.spec.field not in fields:
                raise DataError(f"{label}: missing field {self.spec.field!r} "
                                f"(has {sorted(fields)})")
            row = tuple(fields.get(c) for c in self.columns)
            try:
                messages, tools = self._parse(row)
                ids, mask = self.encode_conversation(messages, tools)
            except _Untrainable as exc:
                if self.spec.on_untrainable == "raise":
                    raise DataError(f"{label}: conversation has nothing to train on "
                                    f"({exc.reason}: {exc})") from None
                out.append(Dropped(exc.reason))
                continue
            except ConfigError as exc:
                raise ConfigError(f"{label}: {exc}") from None
            except _Surrogate as exc:
                raise DataError(f"{label}: field {self.spec.field!r}: {exc.place} holds "
                                f"{surrogate_advice(exc.code, 'tokenize_chat')}") from None
            limit = self.spec.max_document_tokens
            if limit is None or len(ids) <= limit:
                out.append(split_pieces(doc, [ids], [mask]))
            else:
                cuts = range(0, len(ids), limit)
                out.append(split_pieces(doc, [ids[i:i + limit] for i in cuts],
                                        [mask[i:i + limit] for i in cuts]))
        return out

    def _parse(self, row: tuple[Any, ...]) -> tuple[list[dict[str, Any]], Any]:
        messages = row[0]
        tools = row[1] if len(row) > 1 else None
        if messages is None:
            raise _Untrainable("missing_field", f"field {self.spec.field!r} is empty")
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError:
                raise _Untrainable("invalid", "messages are text, not a list") from None
        if not isinstance(messages, list) or not messages:
            raise _Untrainable("invalid", "messages must be a non-empty list")
        clean = []
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise _Untrainable("invalid", f"message without a role: {message!r:.80}")
            if message["role"] not in self.spec.roles:
                raise _Untrainable("unknown_role", f"role {message['role']!r} is not one of "
                                   f"{list(self.spec.roles)}")
            clean.append({k: v for k, v in message.items() if v is not None})
        if isinstance(tools, str):
            try:
                tools = json.loads(tools) if tools.strip() else None
            except ValueError:
                raise _Untrainable("invalid", "the tools field is not valid JSON") from None
        if tools is not None and not isinstance(tools, list):
            raise _Untrainable("invalid", "the tools field must be a list of tool schemas")
        return clean, tools or None

    def encode_conversation(self, messages: list[dict[str, Any]], tools: Any = None
                            ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32) and the train mask (bool) of one conversation."""
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistant:
            raise _Untrainable("no_assistant", "no assistant turn")
        wanted = [i for i in assistant if _has_content(messages[i])]
        if self.spec.train_on == "last":
            wanted = [i for i in wanted if i == assistant[-1]]
        if not wanted:
            raise _Untrainable("empty", "the assistant turns to train on are empty")
        if self.markers:
            ids, mask = self._marked(messages, tools, assistant, wanted)
        else:
            ids, mask = self._by_prefixes(messages, tools, wanted)
        if not mask.any():
            raise ConfigError("the chat template produced no assistant tokens for a "
                              "conversation with assistant turns; check its generation "
                              "markers")
        return ids, mask

    def _render(self, messages: list[dict[str, Any]], tools: Any,
                generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=self.template, tokenize=False,
                add_generation_prompt=generation_prompt)
        except Exception as exc:  # jinja errors, template raise_exception(...)
            raise _Untrainable("invalid", f"the chat template failed: {exc}") from None

    def _marked(self, messages, tools, assistant: list[int], wanted: list[int]
                ) -> tuple[np.ndarray, np.ndarray]:
        try:
            out = self.tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=self.template, tokenize=True,
                return_dict=True, return_assistant_tokens_mask=True)
        except Exception as exc:
            found = _surrogate(messages, tools)
            if found is not None:
                raise _Surrogate(*found) from None
            raise _Untrainable("invalid", f"the chat template failed: {exc}") from None
        ids = np.asarray(out["input_ids"], dtype=np.int32)
        marked = np.asarray(out["assistant_masks"], dtype=bool)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], marked.astype(np.int8), [0]])))
        runs = list(zip(edges[::2], edges[1::2], strict=True))
        if len(runs) != len(assistant):
            raise ConfigError(f"the chat template marks {len(runs)} generation block(s) for "
                              f"{len(assistant)} assistant turn(s); each assistant turn needs "
                              "exactly one {% generation %} block")
        mask = np.zeros(len(ids), dtype=bool)
        for turn, (start, end) in zip(assistant, runs, strict=True):
            if turn in wanted:
                mask[start:end] = True
        return ids, mask

    def _by_prefixes(self, messages, tools, wanted: list[int]) -> tuple[np.ndarray, np.ndarray]:
        full = self._render(messages, tools, False)
        spans = []
        for i in wanted:
            upto = self._render(messages[:i + 1], tools, False)
            prompt = (self._render(messages[:i], tools, True) if i
                      else self._opening_prompt(upto, tools))
            if not upto.startswith(prompt):
                raise ConfigError(
                    f"cannot find assistant turn {i} in the chat template's output: rendering "
                    "the conversation up to it with add_generation_prompt=True is not a prefix "
                    "of rendering it with the turn (does the template lack a generation prompt "
                    "or rewrite turns?); add {% generation %} markers to the template")
            if not full.startswith(upto):
                raise ConfigError(
                    f"cannot find assistant turn {i} in the chat template's output: the "
                    "template renders earlier turns differently once later turns follow; add "
                    "{% generation %} markers to the template")
            spans.append((len(prompt), len(upto.rstrip())))
        try:
            encoding = self.encoder.encode_with_offsets(full)
        except UnencodableText as exc:
            raise _Surrogate(*(_surrogate(messages, tools) or
                               ("the rendered conversation", exc.code))) from None
        ids = np.asarray(encoding.ids, dtype=np.int32)
        starts = np.array([o[0] for o in encoding.offsets], dtype=np.int64)
        ends = np.array([o[1] for o in encoding.offsets], dtype=np.int64)
        mask = np.zeros(len(ids), dtype=bool)
        for start, end in spans:
            mask |= (starts >= start) & (ends <= end) & (ends > starts)
        return ids, mask


    def _opening_prompt(self, rendered: str, tools: Any) -> str:
        """What precedes the first message's content when the conversation opens with the
        assistant: BOS, any default system prompt and the assistant header. Templates refuse an
        empty conversation, so the header is taken from a one-message user conversation (the
        generation prompt it adds) and looked up in ``rendered``."""
        probe = [{"role": "user", "content": "\x00"}]
        header = self._render(probe, tools, True)[len(self._render(probe, tools, False)):]
        at = rendered.find(header) if header else -1
        if at < 0:
            raise _Untrainable("invalid", "cannot find where the opening assistant turn starts "
                               "in the template's output")
        return rendered[:at + len(header)]


def _surrogate(messages: list[dict[str, Any]], tools: Any) -> tuple[str, int] | None:
    """(which message, or the tools, the code point) of the first surrogate code point in a
    conversation, or None. Asked only after the tokenizer refused it."""
    for i, message in enumerate(messages):
        code = _first_surrogate(message)
        if code is not None:
            return f"message {i} (role {message.get('role')!r})", code
    code = _first_surrogate(tools)
    return ("the tools", code) if code is not None else None


def _first_surrogate(value: Any) -> int | None:
    """The first surrogate code point in a string, or in the keys and values of nested
    dicts and lists."""
    if isinstance(value, str):
        found = find_surrogate([value])
        return found[2] if found is not None else None
    if isinstance(value, dict):
        value = [part for item in value.items() for part in item]
    if isinstance(value, (list, tuple)):
        for part in value:
            code = _first_surrogate(part)
            if code is not None:
                return code
    return None


def _has_content(message: dict[str, Any]) -> bool:
    if message.get("tool_calls"):
        return True
    content = message.get("content")
    if isinstance(content, list):
        return any(isinstance(p, dict) and str(p.get("text", "")).strip() for p in content)
    return bool(content and str(content).strip())

"""Tokenizers behind one small interface: a built-in byte-level one, and a local Hugging Face folder.

Invariants: ``decode`` and the streaming decoders never raise on token ids that end inside a
UTF-8 character (incomplete bytes become U+FFFD, or are held back while streaming); the text a
``StreamDecoder`` emits, concatenated and followed by its ``finish()``, is the text ``decode``
gives for the same ids; nothing here downloads anything (``local_files_only=True``);
``never_sampled_ids`` are ids the engine masks out of every sampled token: for the byte tokenizer
all but printable ASCII, newline and EOS, so whatever a random preset generates decodes to text
that encodes back to the same ids (a client that resends the history as text hits the cache).
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}

BYTE_VOCAB_SIZE = 256
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
_BYTE_SPECIALS = {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>"}
# What a byte-tokenizer model may generate: newline and printable ASCII (space to tilde), each one
# byte that is a whole UTF-8 character, so decode -> encode gives the same ids. Not tab or CR:
# clients and templates rewrite them (CRLF -> LF, tabs to spaces) more often than not.
TEXT_OUTPUT_BYTES = frozenset([0x0A, *range(0x20, 0x7F)])


def _check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise ValueError("a chat needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")


class StreamDecoder(ABC):
    """Turns generated token ids into text deltas, holding back bytes of an unfinished character."""

    @abstractmethod
    def push(self, token_id: int) -> str:
        """The new text that ``token_id`` completes ('' while a character is still partial)."""

    @abstractmethod
    def finish(self) -> str:
        """Text still held back at the end (an incomplete character comes out as U+FFFD)."""


class Tokenizer(ABC):
    """What the engine needs from a tokenizer."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Token ids are in ``[0, vocab_size)``."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a generation."""

    @property
    def never_sampled_ids(self) -> frozenset[int]:
        """Ids the sampler never picks (their logits are masked); none unless a tokenizer says."""
        return frozenset()

    @abstractmethod
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the BOS token first when ``add_special_tokens``)."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens; never raises on partial UTF-8."""

    @abstractmethod
    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a chat ready for the assistant's reply (the generation prompt appended).
        Raises ValueError for an empty chat or a malformed message."""

    @abstractmethod
    def stream_decoder(self) -> StreamDecoder:
        """A fresh incremental decoder for one generation."""


# ---- byte level ----------------------------------------------------------------------------------

class _ByteStreamDecoder(StreamDecoder):
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if not 0 <= token_id < BYTE_VOCAB_SIZE:
            return ""  # specials carry no text
        return self._utf8.decode(bytes((token_id,)))

    def finish(self) -> str:
        return self._utf8.decode(b"", final=True)


_NEVER_SAMPLED_BYTE_IDS = frozenset(
    [*(b for b in range(BYTE_VOCAB_SIZE) if b not in TEXT_OUTPUT_BYTES), BOS_ID, PAD_ID])


class ByteTokenizer(Tokenizer):
    """Ids 0-255 are the UTF-8 bytes of the text; 256 BOS, 257 EOS, 258 PAD.

    Prompts may hold any byte; generation is limited to ``TEXT_OUTPUT_BYTES`` and EOS (see
    ``never_sampled_ids``), so a model's output is always text that re-encodes to the same ids.
    The chat template is plain text, ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``,
    after one BOS, so a later turn's prompt extends the earlier turn's prompt and reply byte for byte.
    """

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB_SIZE + len(_BYTE_SPECIALS)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({EOS_ID})

    @property
    def never_sampled_ids(self) -> frozenset[int]:
        """Every byte outside ``TEXT_OUTPUT_BYTES``, BOS and PAD: a random model would otherwise
        emit invalid UTF-8 (decoded as U+FFFD, three other bytes) and specials (no text at all),
        and a client resending the reply as text would miss the cache from there on."""
        return _NEVER_SAMPLED_BYTE_IDS

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < BYTE_VOCAB_SIZE).decode("utf-8", errors="replace")

    def chat_text(self, messages: Sequence[Message]) -> str:
        _check_messages(messages)
        turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return turns + "<|assistant|>\n"

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.chat_text(messages), add_special_tokens=True)

    def stream_decoder(self) -> StreamDecoder:
        return _ByteStreamDecoder()


# ---- Hugging Face folder -------------------------------------------------------------------------

class _HFStreamDecoder(StreamDecoder):
    """Detokenizes a window of recent ids and emits what grew, as text-generation-inference does:
    decoding single ids loses the spaces and merges that depend on neighbours."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window re-decoded each step
        self._read_offset = 0  # ids before this are already emitted

    def _text(self, start: int, end: int) -> str:
        return self._hf.decode(self._ids[start:end], skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix = self._text(self._prefix_offset, self._read_offset)
        text = self._text(self._prefix_offset, len(self._ids))
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return text[len(prefix):]
        return ""

    def finish(self) -> str:
        prefix = self._text(self._prefix_offset, self._read_offset)
        text = self._text(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix):]


class HFTokenizer(Tokenizer):
    """A tokenizer folder loaded with ``AutoTokenizer.from_pretrained(path, local_files_only=True)``.

    Chats use the folder's own chat template when it has one, else the byte tokenizer's plain one.
    """

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        eos = set()
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        self._eos = frozenset(eos)
        self._vocab_size = len(hf)

    @classmethod
    def from_folder(cls, path: str | Path) -> "HFTokenizer":
        """Raises OSError when the folder does not exist or holds no tokenizer files."""
        from transformers import AutoTokenizer  # heavy import, only when a folder is used

        if not Path(path).is_dir():  # else transformers would take the path for a Hub repo id
            raise OSError(f"tokenizer folder {path} does not exist")
        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def add_eos_token_ids(self, ids: Sequence[int]) -> None:
        """Also stop on ``ids`` (a model's generation config often lists several)."""
        self._eos = self._eos | frozenset(int(i) for i in ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        _check_messages(messages)
        if self.has_chat_template:
            # The template writes its own BOS and markers; encoding the text again must not add more.
            text = self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
            return self.encode(text, add_special_tokens=False)
        return self.encode(ByteTokenizer().chat_text(messages), add_special_tokens=True)

    def stream_decoder(self) -> StreamDecoder:
        return _HFStreamDecoder(self.hf)

"""Byte tokenizer and local Hugging Face tokenizer folders behind one interface."""

from __future__ import annotations

import pytest

from chunkstore.engine.tokenizer import BOS_ID, EOS_ID, PAD_ID, TEXT_OUTPUT_BYTES, ByteTokenizer, HFTokenizer, Tokenizer

TEXTS = ["plain ascii", "héllo wörld", "你好, 世界", "emoji 🙂 and more 🚀!", ""]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]


def streamed(tok: Tokenizer, ids: list[int]) -> tuple[list[str], str]:
    dec = tok.stream_decoder()
    deltas = [dec.push(t) for t in ids]
    tail = dec.finish()
    return deltas, "".join(deltas) + tail


def test_byte_round_trip_and_specials():
    tok = ByteTokenizer()
    assert tok.vocab_size == 259 and tok.eos_token_ids == {EOS_ID}
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids[0] == BOS_ID and tok.decode(ids) == text
        assert tok.encode(text, add_special_tokens=False) == list(text.encode())


def test_byte_decode_never_raises_on_partial_utf8():
    tok = ByteTokenizer()
    ids = list("你好".encode())
    assert tok.decode(ids[:2]) == "\ufffd"
    assert tok.decode([*ids[:4], EOS_ID]) == "你\ufffd"


def test_byte_stream_holds_partial_characters_back():
    tok = ByteTokenizer()
    for text in TEXTS:
        ids = tok.encode(text) + [EOS_ID]
        deltas, whole = streamed(tok, ids)
        assert whole == text and not any("\ufffd" in d for d in deltas)
    deltas, whole = streamed(tok, list("🙂".encode())[:3])  # cut inside the emoji
    assert deltas == ["", "", ""] and whole == tok.decode(list("🙂".encode())[:3])


def test_byte_chat_template_extends_across_turns():
    tok = ByteTokenizer()
    first = tok.encode_chat(CHAT)
    reply = "hi!"
    second = tok.encode_chat([*CHAT, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}])
    assert second[:len(first)] == first  # a chat's next turn extends its prompt: the cache hits
    assert tok.decode(first).endswith("<|assistant|>\n")
    assert tok.decode(second[len(first):]).startswith(reply)
    with pytest.raises(ValueError, match="at least one message"):
        tok.encode_chat([])
    with pytest.raises(ValueError, match="message 0"):
        tok.encode_chat([{"role": "user"}])


def test_byte_generation_is_limited_to_text_that_round_trips():
    tok = ByteTokenizer()
    sampled = set(range(tok.vocab_size)) - tok.never_sampled_ids
    assert sampled == {*TEXT_OUTPUT_BYTES, EOS_ID} and len(sampled) == 1 + 95 + 1  # newline, space..tilde, EOS
    assert {BOS_ID, PAD_ID, 0x09, 0x0D, 0x7F, 0x80, 0xFF} <= tok.never_sampled_ids
    text = tok.decode(sorted(TEXT_OUTPUT_BYTES))
    assert tok.encode(text, add_special_tokens=False) == sorted(TEXT_OUTPUT_BYTES)
    assert tok.encode("h\u00e9\t", add_special_tokens=False) == [0x68, 0xC3, 0xA9, 0x09]  # prompts take any byte


def make_hf_folder(path, *, chat_template: str | None) -> None:
    """A small byte-level BPE tokenizer, trained here, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(TEXTS * 20, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
    if chat_template is not None:
        hf.chat_template = chat_template
    hf.save_pretrained(str(path))


TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_hf_folder_encode_decode_stream(tmp_path):
    make_hf_folder(tmp_path, chat_template=TEMPLATE)
    tok = HFTokenizer.from_folder(tmp_path)
    assert tok.eos_token_ids == {1} and tok.vocab_size == len(tok.hf)
    assert tok.never_sampled_ids == frozenset()  # a real model samples its whole vocabulary
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        deltas, whole = streamed(tok, ids)
        assert whole == text and not any("\ufffd" in d for d in deltas)


def test_hf_folder_uses_its_own_chat_template(tmp_path):
    make_hf_folder(tmp_path, chat_template=TEMPLATE)
    tok = HFTokenizer.from_folder(tmp_path)
    ids = tok.encode_chat(CHAT)
    assert ids.count(0) == 1  # one BOS: the template's, none added on top
    assert tok.hf.decode(ids) == "<s>[system] be brief\n[user] héllo\n[assistant] "


def test_hf_folder_without_template_falls_back_to_plain_chat(tmp_path):
    make_hf_folder(tmp_path, chat_template=None)
    tok = HFTokenizer.from_folder(tmp_path)
    assert not tok.has_chat_template
    assert tok.decode(tok.encode_chat(CHAT)) == ByteTokenizer().chat_text(CHAT)


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(OSError):
        HFTokenizer.from_folder(tmp_path / "nothing")

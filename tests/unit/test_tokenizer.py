"""TextTokenizer: byte offsets, token boundaries, raw token bytes, streaming decode."""

from __future__ import annotations

import pytest

from cairn.daemon.modelgen.make_model import SPECIAL_TOKENS
from cairn.daemon.protocol.tokenizer import StreamDecoder, TextTokenizer

MULTI = "héllo ✓ 日本 the model 🙂!"


@pytest.fixture(scope="module")
def tok(tiny_md):
    return TextTokenizer.from_model_dir(tiny_md)


def test_ids_and_vocab(tok, tiny_md):
    assert tok.vocab_size == tiny_md.config["vocab_size"] == 512
    assert (tok.bos_id, tok.eos_id) == (0, 1)


def test_encode_adds_no_special_tokens_but_maps_their_text(tok):
    ids = tok.encode("hi")
    assert tok.bos_id not in ids and tok.eos_id not in ids
    user = SPECIAL_TOKENS.index("<｜User｜>")
    ids = tok.encode("<｜begin▁of▁sentence｜>a<｜User｜>b")
    assert ids[0] == tok.bos_id and user in ids
    assert tok.decode(ids) == "<｜begin▁of▁sentence｜>a<｜User｜>b"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_token_bytes_concatenate_to_the_text(tok):
    text = MULTI + "<｜Assistant｜>x"
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert tok.decode(ids) == text
    assert tok.token_bytes(tok.bos_id) == "<｜begin▁of▁sentence｜>".encode()


def test_a_multibyte_character_is_split_across_tokens(tok):
    # the premise of the streaming and offset tests: byte-level pieces of one character
    assert any(tok.token_bytes(i).decode("utf-8", "replace") != tok.token_bytes(i).decode("utf-8", "ignore")
               for i in tok.encode("✓"))


def test_offsets_are_utf8_byte_ends(tok):
    data = MULTI.encode()
    ids, ends = tok.encode_with_offsets(MULTI)
    assert len(ids) == len(ends) and ends == sorted(ends) and ends[-1] == len(data)
    for i, end in enumerate(ends):
        # pieces of one character all report that character's end; check where a character completes
        if i + 1 == len(ends) or ends[i + 1] != end:
            assert b"".join(tok.token_bytes(t) for t in ids[: i + 1]) == data[:end]


def test_boundary_for_byte_offset(tok):
    data = MULTI.encode()
    ids = tok.encode(MULTI)
    assert tok.boundary_for_byte_offset(MULTI, 0) == 0
    assert tok.boundary_for_byte_offset(MULTI, len(data)) == len(ids)
    assert tok.boundary_for_byte_offset(MULTI, 10**9) == len(ids)
    check = data.index("✓".encode())
    before = tok.boundary_for_byte_offset(MULTI, check)
    # every offset inside the 3-byte character gives the boundary before it
    assert [tok.boundary_for_byte_offset(MULTI, check + k) for k in range(3)] == [before] * 3
    after = tok.boundary_for_byte_offset(MULTI, check + 3)
    assert after > before + 1  # ✓ took more than one token
    assert b"".join(tok.token_bytes(t) for t in ids[:after]) == data[: check + 3]


def test_ascii_offsets(tok):
    text = "the model reads the prompt"
    ids, ends = tok.encode_with_offsets(text)
    assert b"".join(tok.token_bytes(t) for t in ids) == text.encode()
    assert ends == [len(b"".join(tok.token_bytes(t) for t in ids[: i + 1])) for i in range(len(ids))]


def test_stream_decoder_reassembles_characters_split_across_tokens(tok):
    text = MULTI + "</think>"      # a marker the output parser reads is text (others are dropped: below)
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in tok.encode(text)]
    assert "".join(pieces) + dec.flush() == text
    assert "\ufffd" not in "".join(pieces)
    assert "" in pieces  # partial characters were held back, not emitted broken
    assert "✓" in pieces and "🙂" in pieces  # ...and emitted whole with their last byte


def test_stream_decoder_flush_reports_an_incomplete_character(tok):
    ids = tok.encode("✓")
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.flush() == "\ufffd"
    assert dec.push(tok.encode("a")[0]) == "a"  # flush resets


def test_padding_ids_past_the_tokenizer_have_no_text(tok):
    """config vocab_size may be padded past the tokenizer: those ids decode to nothing, not IndexError."""
    pad = tok.vocab_size + 7
    hello = tok.encode("hello")
    assert tok.token_bytes(pad) == b""
    assert tok.decode([*hello, pad]) == tok.decode(hello)
    d = StreamDecoder(tok)
    assert "".join(d.push(i) for i in [*hello, pad]) == "hello"


def test_a_long_prompt_is_tokenized_without_holding_the_gil(tok):
    # The API tokenizes in a worker thread; a tokenizer that held the GIL for a megabyte prompt
    # would stall the event loop (and /health) for seconds all the same.
    import threading
    import time

    text = "def f(x):\n    return x + 1  # a comment\n" * 40_000          # ~1.6 MB of ASCII
    result = {}
    worker = threading.Thread(target=lambda: result.update(ids=tok.encode_with_offsets(text)[0]))
    worst, last = 0.0, time.perf_counter()
    start = last
    worker.start()
    while worker.is_alive():
        time.sleep(0.002)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    total = time.perf_counter() - start
    assert result["ids"] == tok._tok.encode(text, add_special_tokens=False).ids
    # GIL held: this thread waits out nearly the whole run at once; released: it runs throughout
    assert worst < 0.5 * total, (worst, total)

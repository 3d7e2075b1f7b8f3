"""Text <-> token ids, from the model directory's tokenizer.json (no hub, no network).

Design notes:
- `encode` never adds BOS/EOS: the chat template writes them as text, and special-token text in
  the input maps to its id (the tokenizer matches added tokens before the BPE model).
- `tokenizers` reports offsets as CHARACTER indices of the Python string, and every byte-level
  piece of one multi-byte character reports that whole character. Prefix matching works in
  UTF-8 byte offsets, so offsets are converted here: a byte prefix -> the tokens that end at or
  before it. Prefixes are then compared on token ids, never on text.
- Streaming: each token's raw bytes come from inverting the byte-level alphabet (GPT-2's
  bytes_to_unicode); added/special tokens are their UTF-8 content. `StreamDecoder` feeds those
  bytes through an incremental UTF-8 decoder, so a character split across tokens is emitted once,
  whole, when its last byte arrives.
"""

from __future__ import annotations

import codecs
from itertools import accumulate

from cairn.actors.turns import TemplateMarkers, markers_from_vocab

from cairn.daemon.weights.model_dir import ModelDir, ModelDirError


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: printable stand-in character -> the byte it encodes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_ALPHABET = _byte_level_alphabet()


class TextTokenizer:
    def __init__(self, tokenizer, bos_token: str = "", eos_token: str = "",
                 bos_id: int | None = None, eos_id: int | None = None):
        self._tok = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_id: int = self._id_of(bos_token, bos_id, "bos")
        self.eos_id: int = self._id_of(eos_token, eos_id, "eos")
        added = tokenizer.get_added_tokens_decoder()
        self._bytes: list[bytes] = [self._piece_bytes(i, added) for i in range(self.vocab_size)]
        # The most text one token can stand for: n bytes of text are at least n / this many tokens, so
        # a prompt's size bounds its length before it is tokenized. Only without a normalizer (which
        # may shrink the text first); None: no bound.
        self.max_token_bytes: int | None = None if tokenizer.normalizer is not None else \
            max((len(b) for b in self._bytes), default=0) or None

    @classmethod
    def from_file(cls, path, **kw) -> "TextTokenizer":
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception with its parse error
            raise ModelDirError(f"{path}: cannot load tokenizer ({e})") from None
        return cls(tok, **kw)

    @classmethod
    def from_model_dir(cls, md: ModelDir) -> "TextTokenizer":
        kw = dict(bos_token=md.bos_token, eos_token=md.eos_token,
                  bos_id=md.config.get("bos_token_id"), eos_id=md.config.get("eos_token_id"))
        if md.tokenizer_json is not None:   # a GGUF: built from its metadata (daemon/weights/gguf_dir.py)
            from tokenizers import Tokenizer

            tok = cls(Tokenizer.from_str(md.tokenizer_json), **kw)
        else:
            tok = cls.from_file(md.tokenizer_file, **kw)
        if tok.vocab_size > md.config["vocab_size"]:
            raise ModelDirError(f"{md.tokenizer_file}: tokenizer has {tok.vocab_size} tokens but config.json "
                                f"vocab_size is {md.config['vocab_size']} (ids would index past the embedding)")
        return tok

    def _id_of(self, text: str, fallback: int | None, what: str) -> int:
        i = self._tok.token_to_id(text) if text else None
        if i is None:
            i = fallback
        if not isinstance(i, int) or not 0 <= i < self.vocab_size:
            raise ModelDirError(f"tokenizer: {what} token {text!r} is not in the vocabulary")
        return i

    def _piece_bytes(self, i: int, added: dict) -> bytes:
        if i in added:
            return added[i].content.encode()
        piece = self._tok.id_to_token(i)
        if piece is None:
            return b""
        try:
            return bytes(_ALPHABET[c] for c in piece)
        except KeyError:  # not a byte-level piece: let the tokenizer's decoder say what it is
            return self._tok.decode([i], skip_special_tokens=False).encode()

    # ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids, and for each token the UTF-8 byte offset in `text` where it ends."""
        enc = self._tok.encode(text, add_special_tokens=False)
        char_end = _char_to_byte(text)  # char index -> byte offset
        return enc.ids, [char_end[end] for _, end in enc.offsets]

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        # ids past the tokenizer (a config vocab_size padded beyond it) are text-less padding rows
        return self._tok.decode([i for i in ids if i < self.vocab_size], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """A token's raw bytes; b"" for a padding id (config vocab_size may exceed the tokenizer's)."""
        return self._bytes[token_id] if token_id < self.vocab_size else b""

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what llguidance reads; daemon/protocol/constrain.py)."""
        return self._tok.to_str()

    def token_to_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def template_markers(self) -> TemplateMarkers | None:
        """The chat template's message-start tokens, for capture points read from ids (actors/turns.py)."""
        return markers_from_vocab(self._tok.token_to_id)

    def boundary_for_byte_offset(self, text: str, byte_offset: int) -> int:
        """How many leading tokens of encode(text) end at or before `byte_offset`."""
        _, ends = self.encode_with_offsets(text)
        n = 0
        for end in ends:
            if end > byte_offset:
                break
            n += 1
        return n


def _char_to_byte(text: str) -> list[int]:
    """[0, bytes of char 0, bytes of chars 0..1, ...]: byte offset of each character index."""
    if text.isascii():
        return list(range(len(text) + 1))
    return [0, *accumulate(len(c.encode("utf-8", "surrogatepass")) for c in text)]


class StreamDecoder:
    """Token ids in, text out, one complete character at a time."""

    def __init__(self, tok: TextTokenizer):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD); the decoder is reset."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out

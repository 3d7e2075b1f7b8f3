"""Text <-> token ids, from the model directory's tokenizer.json (no hub, no network).

Design notes:
- `encode` never adds BOS/EOS: the chat template writes them as text, and special-token text in
  the input maps to its id (the tokenizer matches added tokens before the BPE model).
- Control tokens (every added token: BOS, EOS, `<｜User｜>`, `<think>`, the DSML marker, …) come only
  from the renderer's own structure, never from a request's text: given the rendered prompt's
  content spans (RenderedChat.content_spans), a control token found inside one means the stretch
  of text between the structure's control tokens around it is tokenized again as plain text (by a
  copy of the tokenizer that matches no added token, `_plain`, built on first use). The tokenizer
  splits at added tokens before anything else, so every other stretch keeps its ids: a prompt whose
  content holds no control token's text gets exactly the ids it always had, and a stretch before a
  boundary does not depend on what follows it (checkpoints keep matching). The check is one table
  lookup per token.
- `tokenizers` reports offsets as CHARACTER indices of the Python string, and every byte-level
  piece of one multi-byte character reports that whole character. Prefix matching works in
  UTF-8 byte offsets, so offsets are converted here: a byte prefix -> the tokens that end at or
  before it. Prefixes are then compared on token ids, never on text.
- Streaming: each token's raw bytes come from inverting the byte-level alphabet (GPT-2's
  bytes_to_unicode); added/special tokens are their UTF-8 content. `StreamDecoder` feeds those
  bytes through an incremental UTF-8 decoder, so a character split across tokens is emitted once,
  whole, when its last byte arrives. It is where every reply's text is made (all APIs, streamed or
  not), and it drops the control tokens a reply has no use for (`hidden_ids`: all added tokens but
  `<think>`, `</think>` and the DSML marker, which the output parser reads): their text never
  reaches a client.
"""

from __future__ import annotations

import codecs
import json
from bisect import bisect_right
from functools import cached_property
from itertools import accumulate

import numpy as np

from cairn.actors.checkpoints.turns import TemplateMarkers
from cairn.daemon.protocol.dsv4.family import CHAT as DSV4_CHAT
from cairn.daemon.protocol.families import chat_family

from cairn.daemon.service.logs import get_logger
from cairn.daemon.weights.model_dir import ModelDir, ModelDirError

_log = get_logger()


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
# The control tokens a V4 reply may carry as text: the output parser reads them (daemon/protocol/dsv4/
# output.py). Another family's are its ChatFamily's reply_markers.
REPLY_MARKERS = DSV4_CHAT.reply_markers


class TextTokenizer:
    def __init__(self, tokenizer, bos_token: str = "", eos_token: str = "",
                 bos_id: int | None = None, eos_id: int | None = None, chat=None):
        self._tok = tokenizer
        self.chat = chat if chat is not None else DSV4_CHAT   # the model family's chat half (families.py)
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        # None: a model without one (Qwen3.5's bos_token is null; its template writes none)
        self.bos_id: int | None = (self._id_of(bos_token, bos_id, "bos") if bos_token or bos_id is not None
                                   else None)
        self.eos_id: int = self._id_of(eos_token, eos_id, "eos")
        added = tokenizer.get_added_tokens_decoder()
        self._bytes: list[bytes] = [self._piece_bytes(i, added) for i in range(self.vocab_size)]
        # Control tokens: every added token (special or not). Only the renderer's structure makes them.
        self.control_texts: tuple[str, ...] = tuple(t.content for t in added.values())
        self._control = np.zeros(self.vocab_size, dtype=bool)
        self._control[[i for i in added if i < self.vocab_size]] = True
        # ...and those a reply never shows as text (the output parser reads the others).
        self.hidden_ids: frozenset[int] = frozenset(i for i, t in added.items()
                                                    if t.content not in self.chat.reply_markers)
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
                  bos_id=md.config.get("bos_token_id"), eos_id=md.config.get("eos_token_id"),
                  chat=chat_family(md.family))
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

    def encode(self, text: str, content: tuple[tuple[int, int], ...] = ()) -> list[int]:
        """Token ids; `content`: character ranges of request text, which never become control tokens."""
        enc = _encode(self._tok, text)
        if content:
            hits = self._control_hits(enc.ids)
            if hits:
                return self._as_text(text, enc.ids, [enc.token_to_chars(k) for k in hits], hits, content)[0]
        return enc.ids

    def encode_with_offsets(self, text: str, content: tuple[tuple[int, int], ...] = ()) -> tuple[list[int], list[int]]:
        """Token ids, and for each token the UTF-8 byte offset in `text` where it ends (`content` as
        for `encode`)."""
        enc = _encode(self._tok, text)
        ids, offsets = enc.ids, enc.offsets
        if content:
            hits = self._control_hits(ids)
            if hits:
                ids, offsets = self._as_text(text, ids, [offsets[k] for k in hits], hits, content, offsets)
        char_end = _char_to_byte(text)  # char index -> byte offset
        return ids, [char_end[end] for _, end in offsets]

    def _control_hits(self, ids: list[int]) -> list[int]:
        """Positions of control tokens in `ids`."""
        return np.flatnonzero(self._control[np.asarray(ids, dtype=np.intp)]).tolist() if ids else []

    def _as_text(self, text, ids, spans, hits, content, offsets=None):
        """(ids, character offsets or None) of `text` with `content` as plain text: unchanged when no
        control token of `ids` (at `hits`, covering `spans`) overlaps a content range. Otherwise only
        the stretches between the structure's control tokens that hold such a token are tokenized
        again; the others keep their ids (the tokenizer splits at added tokens first)."""
        starts = [a for a, _ in content]
        structure = []                             # the structure's control tokens: (position in ids, span)
        bad = []                                   # positions of control tokens made from content
        for k, (s, e) in zip(hits, spans):
            j = bisect_right(starts, s) - 1        # the last range starting at or before the token
            if (j >= 0 and content[j][1] > s) or (j + 1 < len(content) and content[j + 1][0] < e):
                bad.append(k)
            else:
                structure.append((k, (s, e)))
        if not bad:
            return ids, offsets
        out_ids: list[int] = []
        out_offsets: list[tuple[int, int]] | None = [] if offsets is not None else None
        prev, at = -1, 0                           # the last structure token (position in ids) and its end
        for k, (s, e) in [*structure, (len(ids), (len(text), len(text)))]:
            i = bisect_right(bad, prev)
            if i < len(bad) and bad[i] < k:        # this stretch holds content's control text
                piece = _encode(self._plain, text[at:s])
                out_ids += piece.ids
                if out_offsets is not None:
                    out_offsets += [(a + at, b + at) for a, b in piece.offsets]
            else:
                out_ids += ids[prev + 1:k]
                if out_offsets is not None:
                    out_offsets += offsets[prev + 1:k]
            if k < len(ids):
                out_ids.append(ids[k])
                if out_offsets is not None:
                    out_offsets.append((s, e))
            prev, at = k, e
        return out_ids, out_offsets

    @cached_property
    def _plain(self):
        """This tokenizer matching no added token: their text is tokenized by the model as any text."""
        from tokenizers import Tokenizer

        spec = json.loads(self._tok.to_str())
        for t in spec.get("added_tokens") or []:
            t["special"] = True
        plain = Tokenizer.from_str(json.dumps(spec))
        plain.encode_special_tokens = True
        return plain

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
        """The chat template's message-start tokens, for capture points read from ids (the family's
        turn_markers; V4's: actors/checkpoints/turns.py)."""
        return self.chat.turn_markers(self)

    def boundary_for_byte_offset(self, text: str, byte_offset: int) -> int:
        """How many leading tokens of encode(text) end at or before `byte_offset`."""
        _, ends = self.encode_with_offsets(text)
        n = 0
        for end in ends:
            if end > byte_offset:
                break
            n += 1
        return n


def _encode(tok, text: str):
    """One text's Encoding. `Tokenizer.encode` holds the GIL for its whole run (seconds for a
    megabyte prompt, and the event loop with it); `encode_batch` releases it, same ids and offsets."""
    return tok.encode_batch([text], add_special_tokens=False)[0]


def _char_to_byte(text: str) -> list[int]:
    """[0, bytes of char 0, bytes of chars 0..1, ...]: byte offset of each character index."""
    if text.isascii():
        return list(range(len(text) + 1))
    return [0, *accumulate(len(c.encode("utf-8", "surrogatepass")) for c in text)]


class StreamDecoder:
    """Token ids in, text out, one complete character at a time; a control token the reply has no
    use for (TextTokenizer.hidden_ids) gives no text."""

    def __init__(self, tok: TextTokenizer):
        self._tok = tok
        self._hidden = getattr(tok, "hidden_ids", frozenset())
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if token_id in self._hidden:
            _log.debug("reply_control_token_dropped", token_id=token_id,
                       token=self._tok.token_bytes(token_id).decode("utf-8", "replace"))
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def hidden_text(self, token_id: int) -> str | None:
        """A dropped control token's text (a stop string may name it: actors/decoding/stops.py), else None."""
        return self._tok.token_bytes(token_id).decode("utf-8", "replace") if token_id in self._hidden else None

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD); the decoder is reset."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out

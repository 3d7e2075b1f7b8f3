"""Constrained output with llguidance: a request's grammar -> a per-step token mask.

What is constrained: `response_format` json_object / json_schema (the reply is JSON, valid against
the schema), and `tool_choice` "required" or a named function (the reply is the family's tool-call
block, `Grammars.call_lark`; DeepSeek-V4's (dsv4/grammar.py) is a DSML tool-call block whose invoke
names a given tool and whose parameters are the tool's required properties, each typed by its
schema: strings raw with `string="true"`, anything else JSON with `string="false"`). In thinking
mode the grammar starts after `</think>`: the reasoning is free text, but it cannot end the reply
(the end-of-sequence token is masked until the constrained part is done).

Known limits: a string parameter under a forced call cannot contain `</` (the grammar ends the
value there; with `maxLength` it cannot contain `<`); optional parameters are left out; a string
parameter's `enum`, `minLength`/`maxLength` are enforced, its `pattern` and `format` are not. JSON replies follow llguidance's JSON-schema support.

The `Constraint` object is what the decode actor sees: `allowed()` (a boolean row over the
vocabulary, or None while unarmed) and `accept(token)`. It never touches trio; the decode actor
calls `allowed()` in a worker thread (llguidance releases the GIL while it fills the mask).
"""

from __future__ import annotations

import threading

import numpy as np


# JSON as json.dumps writes it (the V4 encoder renders JSON values so) and no free whitespace: a
# random-weight model would otherwise pad forever.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ValueError):
    """A schema or tool the grammar cannot express; the message is fit for an HTTP 400. `detail` is
    the grammar library's own text (a Rust panic and backtrace, maybe): for the log, never the client."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


def _is_panic(e: BaseException) -> bool:
    # pyo3's PanicException derives from BaseException, not Exception
    return type(e).__name__ == "PanicException"


_TOO_BIG = "it is too large or complex for the grammar engine (too many tools or parameters?)"


def _reason(err: str, on_panic: str = _TOO_BIG) -> str:
    """A short, client-safe reason from llguidance's error text (its first line, no panic/backtrace)."""
    first = err.strip().split("\n", 1)[0]
    if "panic" in first.lower() or "<backtrace>" in err:
        return on_panic
    return first[:200]


class Grammars:
    """Per model: llguidance's view of the tokenizer (built once, on first use) and special ids. A
    family's subclass writes its forced-call grammar (`call_lark`; DeepSeek-V4's DSML one is
    dsv4/grammar.py); the JSON grammar and the constraint are shared."""

    end_think = "</think>"   # the reasoning's end: the grammar starts after it (V4's and Qwen3.5's text)

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int, tok) -> None:
        self._json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.end_think_id = tok.token_to_id(self.end_think)
        self._ll = None
        self._lock = threading.Lock()

    @classmethod
    def from_model_dir(cls, md, tok) -> "Grammars":
        return cls(md.tokenizer_text(), int(md.config["vocab_size"]), tok.eos_id, tok)

    def ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                import llguidance

                self._ll = llguidance.LLTokenizer(self._json, n_vocab=self.vocab_size, eos_token=self.eos_id)
            return self._ll

    # --- grammars ------------------------------------------------------------------------------

    def grammar_for(self, *, json_schema: dict | None, tool_choice, tools: list | None,
                    parallel: bool = True) -> str | None:
        """The llguidance grammar a request asks for, or None (free text)."""
        import llguidance

        if tool_choice == "required" or isinstance(tool_choice, dict):
            names = [tool_choice["function"]["name"]] if isinstance(tool_choice, dict) else None
            lark = self.call_lark(tools or [], names, single=names is not None or not parallel)
            try:
                return llguidance.LLMatcher.grammar_from_lark(lark)
            except BaseException as e:
                if not (isinstance(e, Exception) or _is_panic(e)):
                    raise
                raise ConstraintError(f"the tools could not be compiled into a constraint: {_reason(str(e))}",
                                      detail=str(e)) from None
        if json_schema is not None:
            schema = json_schema or {"type": "object"}
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)
            except BaseException as e:
                if not (isinstance(e, Exception) or _is_panic(e)):
                    raise
                raise ConstraintError(f"response_format.json_schema.schema: {_reason(str(e))}",
                                      detail=str(e)) from None
        return None

    def constraint(self, grammar: str, *, thinking: bool) -> "Constraint":
        import llguidance

        try:
            matcher = llguidance.LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
            err = matcher.get_error() if matcher.is_error() else None
        except BaseException as e:
            if not (isinstance(e, Exception) or _is_panic(e)):
                raise
            err = str(e) or type(e).__name__
        if err is not None:
            what = "the tools" if "tool_calls" in grammar else "the schema"
            raise ConstraintError(f"{what} could not be compiled into a constraint: {_reason(err)}", detail=err)
        trigger = self.end_think_id if thinking else None
        return Constraint(matcher, self.vocab_size, trigger, self.eos_id)

    def call_lark(self, tools: list, only: list[str] | None, single: bool = False) -> str:
        """Lark for the family's tool-call block naming the offered tools (`only`: these names; exactly
        one call when `single`)."""
        raise ConstraintError("tool_choice: forced tool calls are not supported for this model")


class Constraint:
    """One request's matcher. Not thread-safe: the decode actor uses it from one thread at a time."""

    def __init__(self, matcher, vocab_size: int, trigger: int | None, eos: int = 0) -> None:
        self.m = matcher
        self.eos = eos
        self.V = vocab_size
        self.trigger = trigger
        self.armed = trigger is None
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        # Before the trigger (the reasoning) every token is free but the end: a reply the grammar
        # constrains (a forced call, a JSON answer) must still come, so the reasoning cannot end it.
        self._reasoning = None if self.armed else np.ones(vocab_size, dtype=bool)
        if self._reasoning is not None:
            self._reasoning[eos] = False

    def allowed(self) -> np.ndarray:
        """Boolean [V]: tokens the grammar allows next (before the trigger: all but the end)."""
        if not self.armed:
            return self._reasoning
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.V].astype(bool)
        if not allowed.any():      # finished (or failed): only the end of the reply is left
            allowed[self.eos] = True
        return allowed

    def accept(self, token_id: int) -> None:
        if not self.armed:
            self.armed = token_id == self.trigger
            return
        if not self.m.consume_token(token_id):
            raise ValueError(f"constrained decoding: token {token_id} refused "
                             f"({_reason(self.m.get_error() or '', 'the grammar engine failed')})")

    def allowed_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from here, the grammar would accept (nothing is consumed):
        a speculative draft ends at the first token it forbids. Before the trigger every token but
        the end is free up to the trigger itself (what follows it is not known to the grammar yet)."""
        if not self.armed:
            n = tokens.index(self.trigger) + 1 if self.trigger in tokens else len(tokens)
            return tokens.index(self.eos) if self.eos in tokens[:n] else n
        return int(self.m.validate_tokens(list(tokens)))

    @property
    def error(self) -> str | None:
        return self.m.get_error() if self.m.is_error() else None

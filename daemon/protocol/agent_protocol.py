"""The request side of the agent protocol, between the parsed request and the engine: the mode
(thinking / chat, effort), the grammar constraint, unknown-field notes, logit_bias ids.

Stateful only in two small ways: the names of ignored fields already logged, and the grammar
machinery (built on first use). `constraint` runs in a worker thread (grammar compilation).
"""

from __future__ import annotations

import threading

from .constrain import ConstraintError, Grammars
from .dsv4.encoding import ChatOptions
from .families import chat_family
from cairn.daemon.api.schemas import APIError


MAX_LOGGED_FIELDS = 256   # distinct ignored names remembered (and logged); a client cannot grow it further


class AgentProtocol:
    def __init__(self, tok, vocab_size: int, log, chat=None) -> None:
        self.tok = tok
        self.chat = chat if chat is not None else chat_family()   # whose mode switches and call grammar
        self.vocab = vocab_size
        self.log = log
        self._logged: set[str] = set()
        self._grammars: Grammars | None = None
        self._lock = threading.Lock()

    def note_ignored(self, names: tuple[str, ...]) -> None:
        """Unknown top-level fields are accepted; say so once per name, not once per request."""
        for name in names:
            if name not in self._logged and len(self._logged) < MAX_LOGGED_FIELDS:
                self._logged.add(name)
                self.log.info("request_field_ignored", field=name,
                              note="unknown field accepted and ignored (logged once per name)")

    def options(self, req, default: str) -> ChatOptions:
        thinking, effort = self.chat.resolve_mode(thinking_field=req.thinking, template_kwargs=req.template_kwargs,
                                        reasoning_effort=req.reasoning_effort, default=default)
        schema = None
        rf = req.response_format
        if rf is not None and rf["type"] == "json_schema":
            schema = rf["json_schema"].get("schema", {})
        return ChatOptions(thinking=thinking, effort=effort, response_schema=schema)

    def check_logit_bias(self, common) -> None:
        for tid, _ in common.logit_bias:
            if tid >= self.vocab:
                raise APIError(400, f"logit_bias: token id {tid} is outside the vocabulary (0..{self.vocab - 1})",
                               param="logit_bias", code="invalid_value")

    def grammars(self) -> Grammars:
        with self._lock:
            if self._grammars is None:
                self._grammars = self.chat.Grammars(self.tok.to_json(), self.vocab, self.tok.eos_id, self.tok)
            return self._grammars

    def constraint(self, req, options: ChatOptions):
        """The request's grammar constraint, or None when its output is free."""
        if req.json_schema is None and not (req.tool_choice == "required" or req.forced_tool):
            return None
        param = "response_format" if req.json_schema is not None and req.tool_choice in ("auto", "none") \
            else "tool_choice"
        try:
            g = self.grammars()
            grammar = g.grammar_for(json_schema=req.json_schema if param == "response_format" else None,
                                    tool_choice=req.tool_choice, tools=req.tools, parallel=req.parallel_tool_calls)
            return None if grammar is None else g.constraint(grammar, thinking=options.thinking)
        except ConstraintError as e:
            if e.detail is not None:
                self.log.warning("grammar_compile_failed", param=param, reason=str(e), detail=e.detail[:4000])
            raise APIError(400, str(e) if str(e).startswith(param) else f"{param}: {e}", param=param,
                           code="invalid_value") from None

"""Forced tool calls for Qwen3.5 (`tool_choice` "required" or a named function) as an llguidance
Lark grammar; JSON replies are the shared machinery's (daemon/protocol/constrain.py).

The reply is one `<tool_call>` block, or several joined by "\\n" (parallel calls), each naming one
of the allowed functions, written as the chat template writes a call:
`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>\\n</tool_call>`.
The parameters are the function's required properties in schema order. A string value is raw text
that cannot contain `\\n</parameter>` (the value's end: the value and its end are one lexeme, which
ends at the first `\\n</parameter>`); an `enum` is one of its strings; `minLength`/`maxLength`
bound its characters. Any other value is JSON valid against its schema (the output parser reads
JSON as well as the Python literals the template writes). `<tool_call>`/`</tool_call>` are single
special tokens, named by id. In thinking mode the grammar starts after `</think>`, whose "\\n\\n"
the grammar allows before the first call (in chat mode the prompt already ends with it).
"""

from __future__ import annotations

import json

from ..constrain import JSON_STYLE, ConstraintError, Grammars, _is_panic, _reason
from .markers import TOOL_CALL, TOOL_CALL_CLOSE

# Text whose only `\n</parameter>` is its end.
_NOT_BEFORE_END = r"~/(?s:.*)\n<\/parameter>(?s:.+)/"
_VALUE = rf"/(?s:.*)\n<\/parameter>/ & {_NOT_BEFORE_END}"


class Qwen35Grammars(Grammars):
    """Per model, as `Grammars` (V4's), with Qwen's call grammar for forced calls."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int, tok) -> None:
        super().__init__(tokenizer_json, vocab_size, eos_id, tok)
        self.call_id = tok.token_to_id(TOOL_CALL)
        self.call_close_id = tok.token_to_id(TOOL_CALL_CLOSE)

    def grammar_for(self, *, json_schema: dict | None, tool_choice, tools: list | None,
                    parallel: bool = True) -> str | None:
        if not (tool_choice == "required" or isinstance(tool_choice, dict)):
            return super().grammar_for(json_schema=json_schema, tool_choice=tool_choice, tools=tools,
                                       parallel=parallel)
        import llguidance

        names = [tool_choice["function"]["name"]] if isinstance(tool_choice, dict) else None
        lark = self.call_lark(tools or [], names, single=names is not None or not parallel)
        try:
            return llguidance.LLMatcher.grammar_from_lark(lark)
        except BaseException as e:
            if not (isinstance(e, Exception) or _is_panic(e)):
                raise
            raise ConstraintError(f"the tools could not be compiled into a constraint: {_reason(str(e))}",
                                  detail=str(e)) from None

    def _special(self, token_id: int | None, text: str) -> str:
        return f"<[{token_id}]>" if token_id is not None else json.dumps(text)

    def call_lark(self, tools: list, only: list[str] | None, single: bool = False) -> str:
        """Lark for one `<tool_call>` block (`single`: a named tool, or parallel_tool_calls false) or
        several, naming the offered tools (`only`: these names)."""
        rules, alts = [], []
        fns = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
        for i, f in enumerate(fns):
            if only is not None and f["name"] not in only:
                continue
            params = f.get("parameters") or {}
            props = params.get("properties") or {}
            required = [k for k in props if k in set(params.get("required") or [])]
            items = []
            for j, key in enumerate(required):
                sub = props[key] if isinstance(props[key], dict) else {}
                head = json.dumps(f"<parameter={key}>\n")
                if sub.get("type") == "string":
                    if isinstance(sub.get("enum"), list) and sub["enum"]:
                        value = "(" + " | ".join(json.dumps(str(v)) for v in sub["enum"]) + r') "\n</parameter>"'
                    else:
                        lo = sub.get("minLength") if isinstance(sub.get("minLength"), int) else 0
                        hi = sub.get("maxLength") if isinstance(sub.get("maxLength"), int) else ""
                        if lo or hi != "":
                            rules.append(rf"V_{i}_{j}: /(?s:.){{{lo},{hi}}}\n<\/parameter>/ & {_NOT_BEFORE_END}")
                            value = f"V_{i}_{j}"
                        else:
                            value = "VALUE"
                else:
                    rules.append(f"j_{i}_{j}: %json {json.dumps({**sub, 'x-guidance': JSON_STYLE})}")
                    value = rf'j_{i}_{j} "\n</parameter>"'
                items.append(f'{head} {value} "\\n"')
            body = " ".join(items)
            rules.append(f"fn_{i}: " + json.dumps(f"<function={f['name']}>\n") + f" {body} " + '"</function>"')
            alts.append(f"fn_{i}")
        if not alts:
            raise ConstraintError("tool_choice: no tool to call")
        opened, closed = self._special(self.call_id, TOOL_CALL), self._special(self.call_close_id, TOOL_CALL_CLOSE)
        calls = "call" if single else r'call ("\n" call)*'
        head = [r'start: "\n\n"? tool_calls',
                f"tool_calls: {calls}",
                rf'call: {opened} "\n" function "\n" {closed}',
                "function: " + " | ".join(alts),
                f"VALUE: {_VALUE}"]
        return "\n".join(head + rules) + "\n"

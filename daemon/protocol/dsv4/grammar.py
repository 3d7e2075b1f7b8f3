"""DeepSeek-V4's forced-call grammar: a DSML tool-call block as Lark for llguidance (constrain.py holds
the shared JSON grammar and the per-token constraint; its module notes say what is constrained)."""

from __future__ import annotations

import json

from ..constrain import JSON_STYLE, ConstraintError, Grammars
from .encoding import DSML


class Dsv4Grammars(Grammars):
    """Per model, as `Grammars`, with the DSML call block for forced calls."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int, tok) -> None:
        super().__init__(tokenizer_json, vocab_size, eos_id, tok)
        self.dsml_id = tok.token_to_id(DSML)

    def call_lark(self, tools: list, only: list[str] | None, single: bool = False) -> str:
        return self.dsml_lark(tools, only, single)

    def _d(self) -> str:
        return f"<[{self.dsml_id}]>" if self.dsml_id is not None else json.dumps(DSML)

    def dsml_lark(self, tools: list, only: list[str] | None, single: bool = False) -> str:
        """Lark for `<｜DSML｜tool_calls>` … with one or more invokes (exactly one when `single`: a
        named tool, or parallel_tool_calls false)."""
        d = self._d()
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
                head = f'"<" {d} ' + json.dumps(f'parameter name="{key}" string="')
                if sub.get("type") == "string":
                    if isinstance(sub.get("enum"), list) and sub["enum"]:
                        value = "(" + " | ".join(json.dumps(str(v)) for v in sub["enum"]) + ")"
                    elif isinstance(sub.get("maxLength"), int):   # bounded: no "<" at all, simply
                        lo = sub.get("minLength") if isinstance(sub.get("minLength"), int) else 0
                        value = f"/[^<]{{{lo},{sub['maxLength']}}}/"
                    else:
                        value = "STR"
                    items.append(f'{head} "true\\">" {value} "</" {d} "parameter>"')
                else:
                    rules.append(f"j_{i}_{j}: %json {json.dumps({**sub, 'x-guidance': JSON_STYLE})}")
                    items.append(f'{head} "false\\">" j_{i}_{j} "</" {d} "parameter>"')
            body = ' "\\n" '.join(items) if items else '""'
            rules.append(f'inv_{i}: "<" {d} ' + json.dumps(f'invoke name="{f["name"]}">\n') + f" {body} "
                         + f'"\\n</" {d} "invoke>"')
            alts.append(f"inv_{i}")
        if not alts:
            raise ConstraintError("tool_choice: no tool to call")
        invokes = "invoke" if single else 'invoke ("\\n" invoke)*'
        head = [f'start: "\\n\\n<" {d} "tool_calls>\\n" {invokes} "\\n</" {d} "tool_calls>"',
                "invoke: " + " | ".join(alts),
                r"STR: /([^<]|<[^\/])*/"]
        return "\n".join(head + rules) + "\n"

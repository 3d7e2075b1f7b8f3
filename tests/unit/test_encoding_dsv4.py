"""Golden tests of the native DeepSeek-V4 chat encoder (daemon/protocol/encoding_dsv4.py), written from the
format's documented behaviour (shared docs v4-chat-encoding.md; docs/model-format.md)."""

from __future__ import annotations

import json

import pytest

from cairn.daemon.protocol.chat import ChatTemplateError
from cairn.daemon.protocol.chat_encoding import V4Renderer, choose_renderer
from cairn.daemon.protocol.dsv4.encoding import ChatOptions, encode, render_tool_calls, resolve_mode

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"
CHAT, THINK = ChatOptions(thinking=False), ChatOptions(thinking=True)
READ = {"type": "function", "function": {"name": "read", "description": "Lire ✓",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}}
TOOLS_BLOCK = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    f"writing a \"<{D}tool_calls>\" block like the following:\n\n<{D}tool_calls>\n<{D}invoke name=\"$TOOL_NAME\">\n"
    f"<{D}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{D}parameter>\n...\n"
    f"</{D}invoke>\n<{D}invoke name=\"$TOOL_NAME2\">\n...\n</{D}invoke>\n</{D}tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    '{"name": "read", "description": "Lire ✓", "parameters": {"type": "object", "properties": {"path": '
    '{"type": "string"}}, "required": ["path"]}}\n\n'
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n")
ABSOLUTE = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
BEYOND = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"


def enc(messages, tools=None, opts=CHAT, variant="original"):
    return encode(messages, tools, opts, effort_variant=variant)


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


# --- mode ------------------------------------------------------------------------------------------

def test_chat_mode_opens_the_answer_with_end_think():
    assert enc([{"role": "user", "content": "Hi"}]).text == f"{BOS}{U}Hi{A}</think>"


def test_thinking_mode_opens_the_answer_with_think():
    assert enc([{"role": "user", "content": "Hi"}], opts=THINK).text == f"{BOS}{U}Hi{A}<think>"


def test_system_text_has_no_marker_and_several_system_messages_concatenate():
    out = enc([{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "u"}])
    assert out.text == f"{BOS}ab{U}u{A}</think>"
    assert out.system_prefix_bytes == len(f"{BOS}ab".encode())


# --- past reasoning ----------------------------------------------------------------------------------

HISTORY = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
           {"role": "assistant", "content": "a1", "reasoning_content": "r1"}, {"role": "user", "content": "q2"}]


def test_thinking_mode_drops_reasoning_before_the_last_user_turn():
    out = enc(HISTORY, opts=THINK)
    assert out.text == f"{BOS}S{U}q1{A}</think>a1{EOS}{U}q2{A}<think>"
    # the next turn renders this prompt's `<think>` as `</think>`: it diverges one token before the end
    assert out.resume_bytes == len(out.text.encode()) - len("<think>")


def test_chat_mode_renders_past_turns_without_reasoning():
    assert enc(HISTORY).text == f"{BOS}S{U}q1{A}</think>a1{EOS}{U}q2{A}</think>"
    assert enc(HISTORY).resume_bytes is None


def test_reasoning_after_the_last_user_turn_is_kept():
    msgs = HISTORY[:2] + [{"role": "assistant", "content": "a", "reasoning": "r"}]
    # (the last message, so it is also left open for continuation: no EOS)
    assert enc(msgs, opts=THINK).text == f"{BOS}S{U}q1{A}<think>r</think>a"


def test_with_tools_nothing_is_dropped_and_every_turn_opens_with_think():
    out = enc(HISTORY, tools=[READ], opts=THINK)
    assert out.text == f"{BOS}S\n\n{TOOLS_BLOCK}{U}q1{A}<think>r1</think>a1{EOS}{U}q2{A}<think>"
    assert out.resume_bytes is None          # the next turn extends the whole prompt


# --- tools ---------------------------------------------------------------------------------------------

def test_tools_block_is_appended_to_the_first_system_message():
    out = enc([{"role": "system", "content": "S"}, {"role": "user", "content": "x"}], tools=[READ])
    assert out.text == f"{BOS}S\n\n{TOOLS_BLOCK}{U}x{A}</think>"
    assert out.system_prefix_bytes == len(f"{BOS}S\n\n{TOOLS_BLOCK}".encode())


def test_tools_without_a_system_message_get_an_empty_one():
    out = enc([{"role": "user", "content": "x"}], tools=[READ])
    assert out.text == f"{BOS}\n\n{TOOLS_BLOCK}{U}x{A}</think>"
    assert out.system_prefix_bytes == len(f"{BOS}\n\n{TOOLS_BLOCK}".encode())


def test_tool_calls_render_as_dsml_after_the_content():
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                call("c1", "read", '{"path": "a.txt", "limit": 10, "opts": {"x": [1, "日"]}}'),
                call("c2", "read", {"path": "b"})]}]
    out = enc(msgs, tools=[READ])
    assert out.text.endswith(
        f"{U}go{A}</think>Let me look.\n\n<{D}tool_calls>\n"
        f'<{D}invoke name="read">\n'
        f'<{D}parameter name="path" string="true">a.txt</{D}parameter>\n'
        f'<{D}parameter name="limit" string="false">10</{D}parameter>\n'
        f'<{D}parameter name="opts" string="false">{{"x": [1, "日"]}}</{D}parameter>\n'
        f"</{D}invoke>\n"
        f'<{D}invoke name="read">\n<{D}parameter name="path" string="true">b</{D}parameter>\n</{D}invoke>\n'
        f"</{D}tool_calls>{EOS}")


def test_arguments_that_are_not_a_json_object_are_wrapped():
    text = render_tool_calls([{"name": "f", "arguments": "not json"}])
    assert f'<{D}parameter name="arguments" string="true">not json</{D}parameter>' in text


def test_tool_results_merge_into_one_user_turn_in_call_order():
    msgs = [{"role": "user", "content": "both"},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "read", "{}"), call("c2", "read", "{}")]},
            {"role": "tool", "tool_call_id": "c2", "content": "beta"},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "alpha"}]},
            {"role": "user", "content": "thanks"}]
    out = enc(msgs, tools=[READ])
    assert out.text.endswith(
        f"</{D}tool_calls>{EOS}{U}<tool_result>alpha</tool_result>\n\n<tool_result>beta</tool_result>"
        f"\n\nthanks{A}</think>")


def test_a_tool_result_turn_is_followed_by_the_generation_prompt():
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "reasoning_content": "need a", "tool_calls": [call("c1", "read", "{}")]},
            {"role": "tool", "tool_call_id": "c1", "content": "data"}]
    out = enc(msgs, tools=[READ], opts=THINK)
    assert f"{U}q{A}<think>need a</think>\n\n<{D}tool_calls>" in out.text
    assert out.text.endswith(f"{EOS}{U}<tool_result>data</tool_result>{A}<think>")


# --- response format, effort ----------------------------------------------------------------------------

def test_response_format_block_follows_the_system_text():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    out = encode([{"role": "system", "content": "S"}, {"role": "user", "content": "x"}], None,
                 ChatOptions(response_schema=schema))
    assert out.text == (f"{BOS}S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
                        f"reply:\n{json.dumps(schema)}{U}x{A}</think>")


@pytest.mark.parametrize("variant,effort,preamble", [
    ("original", "low", ""), ("original", "high", ""), ("original", "max", ABSOLUTE),
    ("0731", "low", ""), ("0731", "high", ABSOLUTE), ("0731", "max", BEYOND)])
def test_effort_preamble_right_after_bos_in_thinking_mode(variant, effort, preamble):
    out = encode([{"role": "system", "content": "S"}, {"role": "user", "content": "x"}], None,
                 ChatOptions(thinking=True, effort=effort), effort_variant=variant)
    assert out.text.startswith(BOS + preamble + ("S" if not preamble else ""))
    assert out.text.endswith(f"S{U}x{A}<think>")
    if preamble:
        assert out.text[len(BOS):].split("\n\nS")[0].endswith("unchecked." if "Absolute" in preamble
                                                              else "undiscovered.")
    assert out.system_prefix_bytes == len(out.text.encode()) - len(f"{U}x{A}<think>".encode())


def test_no_effort_preamble_in_chat_mode():
    out = encode([{"role": "user", "content": "x"}], None, ChatOptions(thinking=False, effort="max"))
    assert out.text == f"{BOS}{U}x{A}</think>"


# --- the mode a request asks for ---------------------------------------------------------------------------

@pytest.mark.parametrize("fields,default,want", [
    ({}, "chat", (False, "low")),
    ({}, "thinking", (True, "low")),
    ({}, "max", (True, "max")),
    ({"reasoning_effort": "none"}, "thinking", (False, "low")),
    ({"reasoning_effort": "medium"}, "chat", (True, "high")),
    ({"reasoning_effort": "xhigh"}, "chat", (True, "max")),
    ({"thinking_field": {"type": "disabled"}, "reasoning_effort": "high"}, "thinking", (False, "high")),
    ({"thinking_field": {"type": "enabled"}}, "chat", (True, "low")),
    ({"template_kwargs": {"thinking": True}}, "chat", (True, "low")),
    ({"template_kwargs": {"enable_thinking": False}}, "max", (False, "max")),
])
def test_resolve_mode(fields, default, want):
    kw = {"thinking_field": None, "template_kwargs": None, "reasoning_effort": None, **fields}
    assert resolve_mode(**kw, default=default) == want


# --- the renderer and its choice ------------------------------------------------------------------------------

def test_renderer_errors_name_the_field():
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.reasoning_content"):
        V4Renderer().render([{"role": "assistant", "content": "x", "reasoning_content": 3}])


class _Dir:
    def __init__(self, template, name="m"):
        self.chat_template, self.name, self.bos_token, self.eos_token = template, name, BOS, EOS


def test_a_template_that_renders_differently_is_used_as_shipped():
    choice = choose_renderer(_Dir("{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"))
    assert choice.encoding == "model template" and "differently" in choice.reason


def test_no_template_or_a_broken_one_means_native_and_0731_is_detected_by_name():
    assert choose_renderer(_Dir(None)).encoding == "deepseek-v4 native"
    assert choose_renderer(_Dir("{% if %}")).encoding == "deepseek-v4 native"
    assert choose_renderer(_Dir(None, "DeepSeek-V4-Flash-0731")).renderer.effort_variant == "0731"


def test_a_template_equal_to_the_encoding_on_the_probes_means_native():
    # A template that reproduces the V4 encoding for the probe conversations (built from the native
    # encoder's own output, so this checks the comparison, not the template language).
    from cairn.daemon.protocol.chat_encoding import PROBE_OPTIONS, PROBES

    native = V4Renderer()
    cases = {}
    for k, (messages, tools) in enumerate(PROBES):
        for opts in PROBE_OPTIONS:
            cases[(len(messages), bool(tools), opts.thinking)] = native.render(messages, tools=tools,
                                                                               options=opts).text
    branches = "".join(f"{{% {'if' if i == 0 else 'elif'} messages|length == {n} and (tools is not none) == {k} "
                       f"and thinking == {t} %}}{{{{ {json.dumps(text)} }}}}"
                       for i, ((n, k, t), text) in enumerate(cases.items()))
    choice = choose_renderer(_Dir(branches + "{% endif %}"))
    assert choice.encoding == "deepseek-v4 native" and "renders as the V4 encoding" in choice.reason


@pytest.mark.parametrize("system", ["You are a careful agent.", "héllo ✓ 日本", "🙂" * 7])
@pytest.mark.parametrize("tools", [None, [READ]], ids=["no-tools", "tools"])
@pytest.mark.parametrize("opts", [CHAT, ChatOptions(thinking=True, effort="max")], ids=["chat", "thinking-max"])
def test_system_prefix_is_a_token_boundary_shared_by_other_conversations(tiny_md, system, tools, opts):
    # what the system-prefix checkpoint (hint_tokens) relies on, with the native encoding
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    tok = TextTokenizer.from_model_dir(tiny_md)
    r = V4Renderer()
    out = r.render([{"role": "system", "content": system}, {"role": "user", "content": "héllo ✓"},
                    {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}],
                   tools=tools, options=opts)
    data = out.text.encode()
    prefix = data[: out.system_prefix_bytes].decode()
    assert system in prefix and prefix.startswith(BOS)
    ids = tok.encode(out.text)
    n = tok.boundary_for_byte_offset(out.text, out.system_prefix_bytes)
    assert ids[:n] == tok.encode(prefix)
    other = r.render([{"role": "system", "content": system}, {"role": "user", "content": "other"}],
                     tools=tools, options=opts)
    assert other.system_prefix_bytes == out.system_prefix_bytes and tok.encode(other.text)[:n] == ids[:n]


def test_list_content_parts_are_joined_by_a_blank_line_in_every_role():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]
    out = enc([{"role": "system", "content": parts}, {"role": "user", "content": parts},
               {"role": "assistant", "content": parts}, {"role": "user", "content": "c"}])
    assert out.text == f"{BOS}a\n\nb{U}a\n\nb{A}</think>a\n\nb{EOS}{U}c{A}</think>"


@pytest.mark.parametrize("opts,opened", [(CHAT, f"{A}</think>"), (THINK, f"{A}<think>plan</think>")],
                         ids=["chat", "thinking"])
def test_a_trailing_assistant_message_is_continued_not_closed(opts, opened):
    """aider's prefix continuation: the last assistant turn stays open so the model writes on from it."""
    out = enc([{"role": "user", "content": "Write a haiku"},
               {"role": "assistant", "content": "Autumn moon,", "reasoning_content": "plan"}], opts=opts)
    assert out.text.endswith(f"{U}Write a haiku{opened}Autumn moon,")     # no EOS after it
    assert out.resume_bytes is None


def test_a_trailing_assistant_tool_call_or_empty_message_is_closed_as_before():
    calls = enc([{"role": "user", "content": "read a"},
                 {"role": "assistant", "content": None, "tool_calls": [call("c1", "read", {"path": "a"})]}], [READ])
    assert calls.text.endswith(f"</{D}tool_calls>{EOS}")
    empty = enc([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])
    assert empty.text.endswith(f"{A}</think>{EOS}")


@pytest.mark.parametrize("tools", [None, [READ]], ids=["no-tools", "tools"])
@pytest.mark.parametrize("opts", [CHAT, THINK], ids=["chat", "thinking"])
def test_developer_role_renders_exactly_as_system(tools, opts):
    # Codex and the openai SDK send `developer`; the same bytes as `system` share the prefix checkpoint.
    def conv(role):
        return [{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": role, "content": "Now in French."},
                {"role": "user", "content": "Bye"}]
    dev = V4Renderer().render(conv("developer"), tools=tools, options=opts)
    sys_ = V4Renderer().render(conv("system"), tools=tools, options=opts)
    assert dev == sys_
    assert dev.text.startswith(f"{BOS}Be brief.") and dev.system_prefix_bytes is not None

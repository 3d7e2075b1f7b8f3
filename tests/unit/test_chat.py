"""ChatRenderer: a model directory's own jinja template, message validation, and the system-prefix offset."""

from __future__ import annotations

import pytest

from cairn.daemon.protocol.chat import ChatRenderer, ChatTemplateError
from cairn.daemon.protocol.tokenizer import TextTokenizer

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Lire un fichier ✓",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
TOOLS_TEXT = ('\n\n## Tools\nYou can call these functions:\n{"name": "read_file", "description": "Lire un fichier ✓", '
              '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}\n')

# A V3-style template (what make-model wrote before the native V4 encoding): exercises the jinja
# renderer that serves model directories whose template differs from the V4 encoding.
V3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(first=true) -%}"
    "{%- for m in messages if m['role'] == 'system' -%}"
    "{%- if not ns.first %}{{ '\n\n' }}{% endif %}{{ m['content'] }}{%- set ns.first = false -%}"
    "{%- endfor -%}"
    "{%- if tools -%}"
    "{{ '\n\n## Tools\nYou can call these functions:\n' }}"
    "{%- for t in tools %}{{ (t['function'] if t['function'] is defined else t) | tojson }}{{ '\n' }}{% endfor -%}"
    "{%- endif -%}"
    "{%- set ns.in_tools = false -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] != 'tool' and ns.in_tools %}<｜tool▁outputs▁end｜>{% set ns.in_tools = false %}{% endif -%}"
    "{%- if m['role'] == 'user' -%}"
    "<｜User｜>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}"
    "<｜Assistant｜>{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{%- if m['tool_calls'] is defined and m['tool_calls'] -%}"
    "<｜tool▁calls▁begin｜>"
    "{%- for c in m['tool_calls'] -%}"
    "<｜tool▁call▁begin｜>{{ c['function']['name'] }}<｜tool▁sep｜>"
    "{%- if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
    "{%- else %}{{ c['function']['arguments'] | tojson }}{% endif -%}"
    "<｜tool▁call▁end｜>"
    "{%- endfor -%}"
    "<｜tool▁calls▁end｜>"
    "{%- endif -%}"
    "<｜end▁of▁sentence｜>"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if not ns.in_tools %}<｜tool▁outputs▁begin｜>{% set ns.in_tools = true %}{% endif -%}"
    "<｜tool▁output▁begin｜>{{ m['content'] }}<｜tool▁output▁end｜>"
    "{%- elif m['role'] != 'system' -%}"
    "{{ raise_exception('unknown message role: ' ~ m['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.in_tools %}<｜tool▁outputs▁end｜>{% endif -%}"
    "{%- if add_generation_prompt %}<｜Assistant｜>{% endif -%}"
)


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(V3_TEMPLATE, BOS, EOS)


@pytest.fixture(scope="module")
def tok(tiny_md):
    return TextTokenizer.from_model_dir(tiny_md)


def test_system_and_user(renderer):
    out = renderer.render([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}])
    assert out.text == f"{BOS}You are terse.<｜User｜>hi<｜Assistant｜>"
    assert out.system_prefix_bytes == len(f"{BOS}You are terse.".encode())


def test_no_generation_prompt(renderer):
    out = renderer.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert out.text == f"{BOS}<｜User｜>hi"
    assert out.system_prefix_bytes is None


def test_assistant_with_tool_calls_and_tool_turns(renderer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "read"}, {"type": "text", "text": "a.txt"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
            {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": {"path": "日本.txt"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "alpha"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "beta"}]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks"},
    ]
    out = renderer.render(messages, tools=TOOLS)
    assert out.text == (
        f"{BOS}S{TOOLS_TEXT}<｜User｜>read\n\na.txt"          # parts joined as the native encoder joins them
        "<｜Assistant｜><｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "a.txt"}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "日本.txt"}<｜tool▁call▁end｜>'
        f"<｜tool▁calls▁end｜>{EOS}"
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>alpha<｜tool▁output▁end｜>"
        "<｜tool▁output▁begin｜>beta<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
        f"<｜Assistant｜>done{EOS}<｜User｜>thanks<｜Assistant｜>")
    assert out.system_prefix_bytes == len(f"{BOS}S{TOOLS_TEXT}".encode())


def test_tools_without_a_system_message_still_form_a_prefix(renderer):
    out = renderer.render([{"role": "user", "content": "x"}], tools=TOOLS)
    assert out.text.encode()[: out.system_prefix_bytes].decode() == BOS + TOOLS_TEXT


def test_several_system_messages_join(renderer):
    out = renderer.render([{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                           {"role": "user", "content": "u"}])
    assert out.text == f"{BOS}a\n\nb<｜User｜>u<｜Assistant｜>"
    assert out.system_prefix_bytes == len(f"{BOS}a\n\nb".encode())


@pytest.mark.parametrize("system", ["You are a careful agent.", "héllo ✓ 日本", "🙂" * 7])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_system_prefix_is_a_token_boundary(renderer, tok, system, tools):
    out = renderer.render([{"role": "system", "content": system}, {"role": "user", "content": "héllo again ✓"},
                           {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}],
                          tools=tools)
    data = out.text.encode()
    prefix = data[: out.system_prefix_bytes].decode()  # a byte prefix on a character boundary
    assert prefix.startswith(BOS + system)
    ids = tok.encode(out.text)
    n = tok.boundary_for_byte_offset(out.text, out.system_prefix_bytes)
    assert ids[:n] == tok.encode(prefix)
    assert b"".join(tok.token_bytes(t) for t in ids[:n]) == data[: out.system_prefix_bytes]
    # the same system part with another conversation shares exactly these ids
    other = renderer.render([{"role": "system", "content": system}, {"role": "user", "content": "other"}], tools=tools)
    assert other.system_prefix_bytes == out.system_prefix_bytes
    assert tok.encode(other.text)[:n] == ids[:n]


def test_prefix_is_none_when_the_template_does_not_render_it_as_a_prefix():
    # a template that puts the system message after the first user turn
    r = ChatRenderer("{% for m in messages|reverse %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}", "<s>", "</s>")
    out = r.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert out.text == "[user]U[system]S" and out.system_prefix_bytes is None


def test_hf_conventions_in_the_environment():
    r = ChatRenderer(
        "{{ bos_token }}{% for m in messages %}\n"
        "  {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "{{ m | tojson }}\n"
        "{% endfor %}{{ eos_token if add_generation_prompt }}", "<s>", "</s>")
    out = r.render([{"role": "user", "content": "✓"}, {"role": "user", "content": "no"}])
    # trim_blocks + lstrip_blocks drop the template's own layout; tojson keeps non-ASCII; break works
    assert out.text == '<s>{"role": "user", "content": "✓"}\n</s>'


def test_raise_exception_becomes_chat_template_error():
    r = ChatRenderer("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first turn must be user') }}"
                     "{% endif %}ok", "", "")
    with pytest.raises(ChatTemplateError, match="first turn must be user"):
        r.render([{"role": "assistant", "content": "x"}])


def test_template_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatRenderer("{% for %}", "", "")
    r = ChatRenderer("{{ messages[0]['content'] + 1 }}", "", "")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        r.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_attribute_escapes():
    r = ChatRenderer("{{ messages.__class__.__mro__ }}", "", "")
    with pytest.raises(ChatTemplateError):
        r.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("messages, tools, error", [
    ([], None, "messages: expected a non-empty list"),
    ("hi", None, "messages: expected a non-empty list"),
    (["hi"], None, "messages[0]: expected an object"),
    ([{"role": "robot", "content": "x"}], None, "messages[0].role: expected one of system, user, assistant, tool"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": 3}], None,
     "messages[2].content: expected a string or a list of text parts"),
    ([{"role": "user"}], None, "messages[0].content: expected a string or a list of text parts"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None,
     "messages[0].content[0].type: 'image_url' is not supported"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], None, "messages[0].content[0].text: expected a string"),
    ([{"role": "user", "content": "x", "tool_calls": []}], None, "messages[0].tool_calls: only assistant messages"),
    ([{"role": "assistant", "content": None, "tool_calls": {}}], None, "messages[0].tool_calls: expected a list"),
    ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], None,
     "messages[0].tool_calls[0].function: expected an object"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], None,
     "messages[0].tool_calls[0].function.name: expected a non-empty string"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}], None,
     "messages[0].tool_calls[0].function.arguments: expected a JSON string or an object"),
    ([{"role": "tool", "content": "x", "tool_call_id": 7}], None, "messages[0].tool_call_id: expected a string"),
    ([{"role": "user", "content": "x"}], {"type": "function"}, "tools: expected a list"),
    ([{"role": "user", "content": "x"}], [{"type": "function", "function": {"description": "d"}}],
     "tools[0].function.name: expected a non-empty string"),
])
def test_invalid_messages_name_the_field(renderer, messages, tools, error):
    with pytest.raises(ChatTemplateError) as e:
        renderer.render(messages, tools=tools)
    assert str(e.value).startswith(error)


def test_assistant_content_may_be_absent_when_it_calls_tools(renderer):
    out = renderer.render([{"role": "user", "content": "u"},
                           {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
                          add_generation_prompt=False)
    assert out.text.endswith("<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                             f"<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}")


def test_developer_role_renders_exactly_as_system(renderer):
    def conv(role):
        return [{"role": role, "content": "You are terse."}, {"role": "user", "content": "hi"}]
    dev = renderer.render(conv("developer"), tools=TOOLS)
    assert dev == renderer.render(conv("system"), tools=TOOLS)
    assert dev.system_prefix_bytes == len(f"{BOS}You are terse.{TOOLS_TEXT}".encode())


def test_an_unknown_role_names_the_field_and_the_roles_allowed(renderer):
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.role: expected one of .*developer.*'boss'"):
        renderer.render([{"role": "boss", "content": "x"}])


def test_a_trailing_assistant_message_is_continued_with_a_template_too(renderer):
    out = renderer.render([{"role": "user", "content": "Write a haiku"},
                           {"role": "assistant", "content": "Autumn moon,"}])
    assert out.text == f"{BOS}<｜User｜>Write a haiku<｜Assistant｜>Autumn moon,"     # no EOS, no new turn


def test_a_template_that_rewrites_the_prefix_cannot_continue_it_and_says_so():
    r = ChatRenderer("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", BOS, EOS)
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]\.content: .*cannot be continued"):
        r.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "go on"}])


def test_text_parts_join_alike_in_the_template_and_the_native_renderer(renderer):
    from cairn.daemon.protocol.chat_encoding import V4Renderer

    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = [{"role": "system", "content": parts}, {"role": "user", "content": parts}]
    assert f"{BOS}a\n\nb<｜User｜>a\n\nb" in renderer.render(msgs).text
    assert f"{BOS}a\n\nb<｜User｜>a\n\nb" in V4Renderer().render(msgs).text

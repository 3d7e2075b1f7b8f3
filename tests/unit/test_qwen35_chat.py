"""Qwen3.5's chat half (daemon/protocol/qwen35/): rendering against HF's apply_chat_template with the
release template, the output parser (whole = streamed at every split), the forced-call grammar, turn
markers. Pure; the tokenizer is a tiny byte-level BPE with Qwen's special tokens, trained here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cairn.daemon.protocol.chat import ChatTemplateError
from cairn.daemon.protocol.dsv4.encoding import ChatOptions
from cairn.daemon.protocol.qwen35.grammar import Qwen35Grammars
from cairn.daemon.protocol.qwen35.markers import CONTROL_TEXTS, IM_END
from cairn.daemon.protocol.qwen35.output import OutputParser, parse_all
from cairn.daemon.protocol.qwen35.render import Qwen35Renderer
from cairn.daemon.protocol.qwen35.turns import turn_boundaries, turn_markers
from cairn.daemon.protocol.tokenizer import TextTokenizer

_SHIPPED = Path(__file__).resolve().parents[2] / "daemon/modelgen/templates/qwen3_5.jinja"
_SDIST = Path.home() / ".cache/llama-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"
TEMPLATE = (_SHIPPED if _SHIPPED.exists() else _SDIST).read_text()

READ = {"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"},
                                     "deep": {"type": "boolean"}, "opts": {"type": "object"},
                                     "tags": {"type": "array", "items": {"type": "string"}},
                                     "ratio": {"type": "number"}, "note": {"type": ["string", "null"]}},
    "required": ["path", "n"]}}}
LS = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [READ, LS]


@pytest.fixture(scope="module")
def hf_tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(CONTROL_TEXTS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEMPLATE, "user assistant system parameter function read path\n"] * 4, trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def tok(hf_tok):
    return TextTokenizer(hf_tok, bos_token="<|endoftext|>", eos_token=IM_END)


@pytest.fixture(scope="module")
def renderer(tok):
    return Qwen35Renderer(TEMPLATE, protect=tok.control_texts)


def hf_render(hf_tok, messages, tools=None, **kw) -> str:
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=hf_tok, chat_template=TEMPLATE)
    return t.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kw)


def call(cid, name, args, as_string=True):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


ARGS = {"path": "src/a.py", "n": 10, "deep": True, "opts": {"x": [1, "é"]}, "ratio": 0.5, "note": None}
CONVERSATIONS = {
    "one user": ([{"role": "user", "content": "Hi"}], None),
    "system multi-turn": ([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "greet them"},
        {"role": "user", "content": "And?"}], None),
    "tool loop": ([
        {"role": "system", "content": "You read files."}, {"role": "user", "content": "read a"},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "need it",
         "tool_calls": [call("c1", "read", ARGS), call("c2", "ls", {})]},
        {"role": "tool", "tool_call_id": "c1", "content": "text of a"},
        {"role": "tool", "tool_call_id": "c2", "content": "a b"},
        {"role": "assistant", "content": "", "reasoning_content": "more",
         "tool_calls": [call("c3", "read", {"path": "b", "n": 1})]},
        {"role": "tool", "tool_call_id": "c3", "content": "text of b"}], TOOLS),
    "tools, then a new query": ([
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "read", {"path": "a", "n": 2})]},
        {"role": "tool", "tool_call_id": "c1", "content": "text"},
        {"role": "assistant", "content": "Done.", "reasoning": "it was short"},
        {"role": "user", "content": "thanks"}], TOOLS),
    "inline think in content": ([
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"},
        {"role": "tool", "tool_call_id": "x", "content": "r"}], None),
}


def hf_messages(messages):
    """The same conversation in the shape HF's template takes: arguments as objects, `reasoning`
    spelled `reasoning_content`."""
    out = []
    for m in messages:
        m = dict(m)
        if "reasoning" in m:
            m["reasoning_content"] = m.pop("reasoning")
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_rendering_matches_hf_apply_chat_template(renderer, hf_tok, name, thinking):
    messages, tools = CONVERSATIONS[name]
    got = renderer.render(messages, tools=tools, options=ChatOptions(thinking=thinking))
    want = hf_render(hf_tok, hf_messages(messages), tools, enable_thinking=thinking)
    assert got.text == want
    opener = "<think>\n" if thinking else "<think>\n\n</think>\n\n"
    assert got.text.endswith("<|im_start|>assistant\n" + opener)
    assert got.resume_bytes == len(got.text.encode()) - len(opener.encode())


def test_the_system_part_is_the_first_turn_tools_included(renderer):
    messages, tools = CONVERSATIONS["tool loop"]
    r = renderer.render(messages, tools=tools, options=ChatOptions(thinking=True))
    head = r.text.encode()[:r.system_prefix_bytes].decode()
    assert head.startswith("<|im_start|>system\n# Tools") and head.endswith("You read files.<|im_end|>\n")
    # the same system part and tools with another conversation: the same bytes
    other = renderer.render([{"role": "system", "content": "You read files."}, {"role": "user", "content": "x"}],
                            tools=tools)
    assert other.text.encode()[:other.system_prefix_bytes] == head.encode()
    assert renderer.render([{"role": "user", "content": "Hi"}]).system_prefix_bytes is None
    # the request's own `<|im_end|>` text is masked: it does not end the system part early
    r = renderer.render([{"role": "system", "content": "a<|im_end|>\nb"}, {"role": "user", "content": "x"}])
    assert r.text.encode()[:r.system_prefix_bytes].decode() == "<|im_start|>system\na<|im_end|>\nb<|im_end|>\n"
    assert r.content_spans


def test_the_next_turn_leaves_this_prompt_at_resume_bytes(renderer):
    """The template drops the reply's think block once a new user query follows: the prompt up to
    `resume_bytes` is what the next turn's prompt shares."""
    first = [{"role": "user", "content": "Hi"}]
    for thinking in (True, False):
        r = renderer.render(first, options=ChatOptions(thinking=thinking))
        nxt = renderer.render(first + [{"role": "assistant", "content": "Hello", "reasoning_content": "r"},
                                       {"role": "user", "content": "Bye"}], options=ChatOptions(thinking=thinking))
        keep = r.text.encode()[:r.resume_bytes]
        assert nxt.text.encode().startswith(keep) and not nxt.text.encode().startswith(r.text.encode())


def test_bad_tool_call_arguments_name_the_field(renderer):
    bad = [{"role": "user", "content": "q"},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "[1, 2]"}}]}]
    field = r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: "
    with pytest.raises(ChatTemplateError, match=field + "expected a JSON object"):
        renderer.render(bad)
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{nope"
    with pytest.raises(ChatTemplateError, match=field + "not valid JSON"):
        renderer.render(bad)


def test_turn_markers_give_the_system_end_and_the_last_real_user_message(renderer, tok):
    messages, tools = CONVERSATIONS["tools, then a new query"]
    messages = [{"role": "system", "content": "S"}] + messages
    r = renderer.render(messages, tools=tools)
    ids = tok.encode(r.text, r.content_spans)
    m = turn_markers(tok)
    b = turn_boundaries(ids, m)
    assert b.system_end == tok.boundary_for_byte_offset(r.text, r.system_prefix_bytes)
    last_user = r.text.rindex("<|im_start|>user\nthanks")
    assert b.last_user == len(tok.encode(r.text[:last_user]))
    # a tool result is a user turn in this format, but not a user message
    loop, tools = CONVERSATIONS["tool loop"]
    r = renderer.render(loop, tools=tools)
    ids = tok.encode(r.text)
    assert turn_boundaries(ids, m).last_user == len(tok.encode(r.text[:r.text.index("<|im_start|>user\nread a")]))
    # no system turn: no system end; ids without markers: nothing
    assert turn_boundaries(tok.encode(renderer.render([{"role": "user", "content": "x"}]).text), m).system_end is None
    assert turn_boundaries(np.arange(50, 60), m) == turn_boundaries([], None)


# --- the output parser -----------------------------------------------------------------------

def assistant_text(renderer, message, tools=TOOLS) -> str:
    """What the template writes for `message` after `<|im_start|>assistant\\n<think>\\n` (the reply
    a model trained on it would generate), EOS excluded."""
    r = renderer.render([{"role": "user", "content": "q"}, message, {"role": "tool", "content": "r"}], tools=tools)
    start = r.text.index("<|im_start|>assistant\n<think>\n") + len("<|im_start|>assistant\n<think>\n")
    return r.text[start:r.text.index(IM_END, start)]


def test_a_reply_as_the_template_writes_it_parses_back_to_the_message(renderer):
    msg = {"role": "assistant", "content": "Reading both.", "reasoning_content": "need\nboth",
           "tool_calls": [call("c1", "read", ARGS), call("c2", "ls", {})]}
    text = assistant_text(renderer, msg)
    assert "<parameter=deep>\nTrue\n</parameter>" in text          # the template's Python literals
    r = parse_all(text, thinking=True, tools=TOOLS)
    assert (r.reasoning, r.content, r.warnings) == ("need\nboth", "Reading both.", [])
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("read", ARGS), ("ls", {})]


def test_values_are_typed_by_the_schema():
    text = ("<tool_call>\n<function=read>\n<parameter=path>\n10\n</parameter>\n<parameter=n>\n10\n</parameter>\n"
            "<parameter=deep>\nfalse\n</parameter>\n<parameter=note>\nNone\n</parameter>\n"
            "<parameter=tags>\n[\"a\"]\n</parameter>\n<parameter=ratio>\nNaN\n</parameter>\n"
            "<parameter=opts>\nnot json\n</parameter>\n</function>\n</tool_call>")
    args = json.loads(parse_all(text, thinking=False, tools=TOOLS).tool_calls[0].arguments)
    assert args == {"path": "10", "n": 10, "deep": False, "note": None, "tags": ["a"], "ratio": "NaN",
                    "opts": "not json"}


def test_an_unknown_function_is_returned_as_written_with_untyped_values():
    text = ("<tool_call>\n<function=rm>\n<parameter=x>\n5\n</parameter>\n<parameter=y>\nabc\n</parameter>\n"
            "</function>\n</tool_call>")
    r = parse_all(text, thinking=False, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("rm", {"x": 5, "y": "abc"})]
    assert r.warnings == [] and r.content == ""


def test_reasoning_and_chat_modes():
    r = parse_all("step 1\nstep 2\n</think>\n\nThe answer.", thinking=True, tools=None)
    assert (r.reasoning, r.content) == ("step 1\nstep 2", "The answer.")
    r = parse_all("still thinking <tool_call>\n", thinking=True, tools=TOOLS)
    assert (r.reasoning, r.content, r.tool_calls) == ("still thinking <tool_call>\n", "", [])
    r = parse_all("a </think> b", thinking=False, tools=None)
    assert (r.reasoning, r.content) == ("", "a </think> b")


def test_nested_markup_inside_values_and_content_stays_text():
    value = "x <parameter=y>\n</function>\n</tool_call> a</parameter> b\n</paramete"
    text = (f"see <tool_ca and <function=f> here\n\n<tool_call>\n<function=read>\n<parameter=path>\n{value}"
            "\n</parameter>\n"
            "<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>")
    r = parse_all(text, thinking=False, tools=TOOLS)
    assert r.content == "see <tool_ca and <function=f> here" and r.warnings == []
    assert json.loads(r.tool_calls[0].arguments) == {"path": value, "n": 1}


def test_without_tools_call_markup_is_content():
    text = "<tool_call>\n<function=read>\n</function>\n</tool_call>"
    r = parse_all(text, thinking=False, tools=None)
    assert (r.content, r.tool_calls) == (text, [])


@pytest.mark.parametrize("text, content, why", [
    ("Hi\n<tool_call>\n<funct1on=read>\n</function>\n</tool_call>",
     "Hi\n<tool_call>\n<funct1on=read>\n</function>\n</tool_call>", "malformed tool-call block"),
    ("Hi<tool_call>\n<function=read>\n<parameter=n>\n1\n</parameter>\noops\n</function>",
     "Hi<tool_call>\n<function=read>\n<parameter=n>\n1\n</parameter>\noops\n</function>", "malformed"),
    ("<tool_call>\n<function=ls>\n</function>\nthen text", "\nthen text", "malformed"),
    ("<tool_call>\n<function=a\nb>\n", "<tool_call>\n<function=a\nb>\n", "malformed"),
])
def test_malformed_blocks_degrade_to_content_with_a_warning(text, content, why):
    r = parse_all(text, thinking=False, tools=TOOLS)
    assert r.content == content and why in r.warnings[0]
    assert all(c.name == "ls" for c in r.tool_calls)      # only a call closed before the damage stands


def test_a_call_cut_off_is_dropped_and_its_text_is_not_content():
    r = parse_all("Doing it.\n\n<tool_call>\n<function=read>\n<parameter=path>\nsrc/", thinking=False, tools=TOOLS)
    assert (r.content, r.tool_calls, r.dropped_call, r.dropped_why) == ("Doing it.", [], True, "cut_off")
    # ended after `</function>`, before `</tool_call>`: the call is whole
    r = parse_all("<tool_call>\n<function=ls>\n</function>\n", thinking=False, tools=TOOLS)
    assert [c.name for c in r.tool_calls] == ["ls"] and not r.dropped_call and r.warnings == []


def test_garbage_never_crashes_and_streams_as_whole():
    rng = np.random.default_rng(7)
    pieces = ["<tool_call>", "</tool_call>", "<function=", "read", ">", "\n", "<parameter=", "path", "</parameter>",
              "</function>", "</think>", " ", "x", "1", "True", "{", "}", "<", "/"]
    for _ in range(300):
        text = "".join(rng.choice(pieces, size=int(rng.integers(1, 30))))
        thinking = bool(rng.integers(2))
        whole = summary(stream(text, [], thinking=thinking, tools=TOOLS))
        cuts = sorted({int(x) for x in rng.integers(0, len(text) + 1, size=3)})
        assert summary(stream(text, cuts, thinking=thinking, tools=TOOLS)) == whole, (text, cuts)


SAMPLES = [
    ("need\nboth\n\n</think>\n\nReading both.\n\n<tool_call>\n<function=read>\n<parameter=path>\nsrc/a.py\n"
     "</parameter>\n<parameter=n>\n10\n</parameter>\n<parameter=deep>\nTrue\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=ls>\n</function>\n</tool_call>", True),
    ("Plain answer, <b>bold</b> and a <tool_ca lookalike\n\n", False),
    ("<tool_call>\n<function=read>\n<parameter=path>\nline 1\n</param\nline 3\n</parameter>\n<parameter=n>\n"
     "2\n</parameter>\n</function>\n</tool_call>", False),
    ("think </thin k> more </think>Answer<tool_call>\n<function=read>\n<parameter=path>\nx", True),
    ("Hi\n<tool_call>\n<function=read>\n<parameter=n>\n1\n</parameter>\noops", False),
]


def stream(text, cuts, *, thinking, tools, whole_calls=False):
    p = OutputParser(thinking=bool(thinking), tools=tools, new_id=iter(f"id{i}" for i in range(99)).__next__,
                     whole_calls=whole_calls)
    events, at = [], 0
    for c in sorted(cuts) + [len(text)]:
        events += p.feed(text[at:c])
        at = c
    events += p.finish()
    return p.result, events


def summary(res):
    r, events = res
    return (r.reasoning, r.content, [(c.id, c.name, c.arguments) for c in r.tool_calls], r.warnings, r.dropped_why,
            "".join(e.text for e in events if e.kind == "content"),
            "".join(e.text for e in events if e.kind == "reasoning"))


@pytest.mark.parametrize("whole_calls", [False, True])
@pytest.mark.parametrize("k", range(len(SAMPLES)))
def test_streamed_at_every_split_point_equals_the_whole(k, whole_calls):
    text, thinking = SAMPLES[k]
    want = summary(stream(text, [], thinking=thinking, tools=TOOLS, whole_calls=whole_calls))
    assert want[5] == want[1] and want[6] == want[0]
    for cut in range(len(text) + 1):
        assert summary(stream(text, [cut], thinking=thinking, tools=TOOLS, whole_calls=whole_calls)) == want, cut
    for cuts in ([*range(len(text))], [*range(0, len(text), 3)], [*range(1, len(text), 5)]):
        assert summary(stream(text, cuts, thinking=thinking, tools=TOOLS, whole_calls=whole_calls)) == want


def test_the_first_sample_parses_as_meant():
    r, events = stream(SAMPLES[0][0], [*range(len(SAMPLES[0][0]))], thinking=True, tools=TOOLS)
    assert (r.reasoning, r.content) == ("need\nboth", "Reading both.")
    assert [json.loads(c.arguments) for c in r.tool_calls] == [{"path": "src/a.py", "n": 10, "deep": True}, {}]
    assert [e.kind for e in events if e.kind.startswith("tool")] == ["tool_start"] + ["tool_args"] * 4 + \
        ["tool_start", "tool_args"]
    # the fragments of a call concatenate to its arguments
    assert "".join(e.text for e in events if e.kind == "tool_args" and e.index == 0) == r.tool_calls[0].arguments
    _, events = stream(SAMPLES[0][0], [*range(len(SAMPLES[0][0]))], thinking=True, tools=TOOLS, whole_calls=True)
    tools = [e for e in events if e.kind.startswith("tool")]
    assert [(e.kind, e.index) for e in tools] == [("tool_start", 0), ("tool_args", 0),
                                                  ("tool_start", 1), ("tool_args", 1)]


def test_no_partial_marker_is_streamed_as_content():
    text = "Answer.\n\n<tool_call>\n<function=ls>\n</function>\n</tool_call>"
    for cut in range(len(text) + 1):
        p = OutputParser(thinking=False, tools=TOOLS)
        first = "".join(e.text for e in p.feed(text[:cut]) if e.kind == "content")
        assert "Answer.".startswith(first), (cut, first)


def test_a_long_value_fed_token_by_token_is_scanned_in_linear_work():
    value = "word " * 4000
    text = f"<tool_call>\n<function=read>\n<parameter=path>\n{value}\n</parameter>\n</function>\n</tool_call>"
    p = OutputParser(thinking=False, tools=TOOLS)
    for i in range(0, len(text), 3):
        p.feed(text[i:i + 3])
    p.finish()
    assert json.loads(p.result.tool_calls[0].arguments) == {"path": value}
    assert p.scanned < 3 * len(text)


# --- the forced-call grammar -----------------------------------------------------------------

@pytest.fixture(scope="module")
def grammars(tok):
    return Qwen35Grammars(tok.to_json(), tok.vocab_size, tok.eos_id, tok)


def matches(grammars, tok, grammar: str, text: str) -> bool:
    import llguidance

    m = llguidance.LLMatcher(grammars.ll_tokenizer(), grammar, log_level=0)
    ids = tok.encode(text)
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


FORCED = ("<tool_call>\n<function=read>\n<parameter=path>\nsrc/a.py\nline 2 </parameter>\n</parameter>\n"
          "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>")


def test_llguidance_accepts_the_grammar_and_a_forced_call_matches(grammars, tok):
    import llguidance

    named = grammars.grammar_for(json_schema=None, tool_choice={"type": "function", "function": {"name": "read"}},
                                 tools=TOOLS)
    required = grammars.grammar_for(json_schema=None, tool_choice="required", tools=TOOLS)
    for g in (named, required):
        assert llguidance.LLMatcher.validate_grammar(g) == ""
    assert f"<[{tok.token_to_id('<tool_call>')}]>" in grammars.call_lark(TOOLS, None)    # the special token, by id
    assert matches(grammars, tok, named, FORCED)
    assert matches(grammars, tok, named, "\n\n" + FORCED)                         # after `</think>`
    two = FORCED + "\n<tool_call>\n<function=ls>\n</function>\n</tool_call>"
    assert matches(grammars, tok, required, two) and not matches(grammars, tok, named, two)
    # the parser reads what the grammar lets through
    r = parse_all(FORCED, thinking=False, tools=TOOLS)
    assert json.loads(r.tool_calls[0].arguments) == {"path": "src/a.py\nline 2 </parameter>", "n": 3}


@pytest.mark.parametrize("text", [
    "Sure, I will read it.",
    FORCED.replace("function=read", "function=write"),                        # not an offered tool
    FORCED.replace("<parameter=n>\n3\n</parameter>\n", ""),                    # a required parameter missing
    FORCED.replace("\n3\n", "\nthree\n"),                                      # not an integer
    FORCED.replace("src/a.py", "a\n</parameter>\nb"),                         # a value may not hold its end
    "Let me see. " + FORCED,
])
def test_text_that_is_not_a_forced_call_does_not_match(grammars, tok, text):
    g = grammars.grammar_for(json_schema=None, tool_choice={"type": "function", "function": {"name": "read"}},
                             tools=TOOLS)
    assert not matches(grammars, tok, g, text)


BOUNDED = {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {
    "key": {"type": "string", "maxLength": 5}, "mode": {"type": "string", "enum": ["r", "w"]},
    "n": {"type": "integer", "minimum": 0, "maximum": 9}, "on": {"type": "boolean"}},
    "required": ["key", "mode", "n", "on"]}}}


@pytest.mark.parametrize("seed", range(3))
def test_every_path_of_a_forced_call_parses_into_a_valid_call(grammars, tok, seed):
    g = grammars.grammar_for(json_schema=None, tool_choice={"type": "function", "function": {"name": "get"}},
                             tools=[LS, BOUNDED])
    c = grammars.constraint(g, thinking=False)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3000):
        t = int(rng.choice(np.flatnonzero(c.allowed())))
        if t == tok.eos_id:
            break
        c.accept(t)
        out.append(t)
    else:
        raise AssertionError("the grammar never ended")
    r = parse_all(tok.decode(out), thinking=False, tools=[LS, BOUNDED])
    assert r.warnings == [] and r.content == "" and [x.name for x in r.tool_calls] == ["get"]
    args = json.loads(r.tool_calls[0].arguments)
    assert set(args) == {"key", "mode", "n", "on"} and len(args["key"]) <= 5 and "\n</parameter>" not in args["key"]
    assert args["mode"] in ("r", "w") and 0 <= args["n"] <= 9 and isinstance(args["on"], bool)


# --- the family object (docs/design/families.md §1, ChatFamily) ---------------------------------

def test_the_family_object_offers_the_chat_pieces(tok):
    from types import SimpleNamespace

    from cairn.daemon.protocol.qwen35.family import CHAT
    from cairn.daemon.weights.model_dir import ModelDirError

    md = SimpleNamespace(path="m", chat_template=TEMPLATE, bos_token=None, eos_token=IM_END)
    choice = CHAT.choose_renderer(md, protect=tok.control_texts)
    assert isinstance(choice.renderer, Qwen35Renderer) and choice.encoding == "qwen3.5 template"
    assert choice.renderer.render([{"role": "user", "content": "x"}]).text.endswith("<think>\n")
    with pytest.raises(ModelDirError, match="no chat template"):
        CHAT.choose_renderer(SimpleNamespace(path="m", chat_template=None, bos_token=None, eos_token=None))
    assert CHAT.OutputParser is OutputParser and "<tool_call>" in CHAT.reply_markers
    assert tok.token_to_id(CHAT.call_opener) is not None
    assert CHAT.turn_boundaries([1, 2], CHAT.turn_markers(tok)) == turn_boundaries([], None)

"""The family seam's Python half (issue 43; daemon/weights/families.py, daemon/protocol/families.py):
a model's files name their family, DeepSeek-V4 is served through it unchanged, Qwen3.5 directories
are read by the family's own reader, and its GGUF files are refused with their reason."""

from __future__ import annotations

import json

import pytest

from cairn.daemon.weights import families
from cairn.daemon.weights.model_dir import ModelDirError, open_model_dir

def _config_only(path, cfg):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("cfg", [
    {"model_type": "qwen3_5", "hidden_size": 64},
    {"model_type": "qwen3_5_moe_text", "hidden_size": 64},
    # a conditional-generation checkpoint: the text model's type nested under text_config
    {"model_type": "qwen3_5_moe_vl_someday", "text_config": {"model_type": "qwen3_5_moe_text"},
     "vision_config": {}},
], ids=["dense", "moe-text", "nested"])
def test_a_qwen35_directory_is_read_by_its_family(tmp_path, cfg):
    assert families.for_config(cfg).name == "qwen3_5"
    d = _config_only(tmp_path / "q", cfg)
    with pytest.raises(ModelDirError) as e:          # Qwen's own reader: its config checks, by field
        open_model_dir(d)
    assert "issue 43" not in str(e.value) and "config.json" in str(e.value)


def _empty_gguf(path, arch):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_qwen35_gguf_is_read_by_its_family(tmp_path):
    with pytest.raises(ModelDirError) as e:          # Qwen's own reader: its metadata checks, by key
        open_model_dir(_empty_gguf(tmp_path / "q.gguf", "qwen35moe"))
    assert "metadata key 'qwen35moe." in str(e.value) and "issue 43" not in str(e.value)


def test_unknown_types_name_every_family(tmp_path):
    with pytest.raises(ModelDirError, match=r"'llama'; cairn serves DeepSeek-V4 .* and qwen3_5 \('qwen3_5', 'qwen3_5_moe'"):
        families.for_config({"model_type": "llama"})
    with pytest.raises(ModelDirError, match=r"'llama'; cairn serves DeepSeek-V4 GGUF .* and qwen3_5 \('qwen35', 'qwen35moe'\)"):
        families.for_gguf("llama", "f.gguf")


def test_an_unknown_model_type_names_what_is_served(tmp_path):
    d = _config_only(tmp_path / "x", {"model_type": "llama"})
    with pytest.raises(ModelDirError, match="model_type is 'llama'; cairn serves DeepSeek-V4 models"):
        open_model_dir(d)


def test_v4_models_are_the_deepseek_v4_family(tmp_path):
    from cairn.daemon.modelgen.make_model import make_model

    md = open_model_dir(make_model("tiny", 1, tmp_path / "t"))
    assert md.family == "deepseek_v4" and "family" not in md.config   # the config is fingerprinted
    fam = families.by_name(md.family)
    assert fam.refused is None and fam.is_routed_expert("layers.0.ffn.experts.3.w1.weight")
    assert not fam.is_routed_expert("layers.0.ffn.shared_experts.w1.weight")
    assert fam.state_cost(md.config, 0).bytes_at(10) > 0


def test_the_chat_registry_maps_each_family_to_its_chat_half():
    from cairn.daemon.protocol import families as chat
    from cairn.daemon.protocol.dsv4 import output as v4_output
    from cairn.daemon.protocol.dsv4.encoding import DSML
    from cairn.daemon.protocol.qwen35 import family as qwen

    v4 = chat.chat_family("deepseek_v4")
    assert chat.chat_family() is v4 and v4.name == "deepseek_v4"
    assert v4.OutputParser is v4_output.OutputParser and v4.call_opener == DSML
    assert chat.chat_family("qwen3_5") is qwen.CHAT
    with pytest.raises(ValueError, match="no chat format for model family 'llama'"):
        chat.chat_family("llama")


def test_responders_read_replies_with_the_family_parser():
    from cairn.daemon.api.responders import reply_parser
    from cairn.daemon.protocol.qwen35 import family as qwen

    assert isinstance(reply_parser(False, None, chat=qwen.CHAT), qwen.CHAT.OutputParser)
    v4 = reply_parser(False, None)
    assert type(v4).__module__ == "cairn.daemon.protocol.dsv4.output"


def test_tool_choice_none_bans_the_family_call_opener():
    from types import SimpleNamespace

    import trio

    from cairn.daemon.api.app import API
    from cairn.daemon.protocol.qwen35 import family as qwen
    from cairn.daemon.service.logs import get_logger

    vocab = {"｜DSML｜": 7, "<tool_call>": 9}
    tok = SimpleNamespace(token_to_id=vocab.get, template_markers=lambda: None)
    req = SimpleNamespace(tools=[{"type": "function"}], callable_tools=None)
    inbox, _ = trio.open_memory_channel(1)
    kw = dict(inbox=inbox, tokenizer=tok, renderer=None, model_id="m", context_length=64, vocab_size=16,
              max_tokens_default=8, fingerprint="f" * 16, log=get_logger())
    assert API(**kw)._no_tool_calls(req) == (7,)
    assert API(**kw, chat=qwen.CHAT)._no_tool_calls(req) == (9,)


def test_forced_calls_and_modes_come_from_the_family():
    from types import SimpleNamespace

    from cairn.daemon.protocol.agent_protocol import AgentProtocol
    from cairn.daemon.protocol.dsv4.grammar import Dsv4Grammars
    from cairn.daemon.protocol.qwen35 import family as qwen
    from cairn.daemon.protocol.qwen35.grammar import Qwen35Grammars
    from cairn.daemon.service.logs import get_logger

    tok = SimpleNamespace(to_json=lambda: "{}", eos_id=0, token_to_id=lambda text: None)
    assert type(AgentProtocol(tok, 16, get_logger()).grammars()) is Dsv4Grammars      # V4's DSML grammar
    assert type(AgentProtocol(tok, 16, get_logger(), chat=qwen.CHAT).grammars()) is Qwen35Grammars


def test_a_qwen35_directory_opens_through_its_family(tmp_path):
    """The load path asks the family (open_dir, kernel_inputs), not the model_type string: the
    conditional-generation layout's vision tower and MTP head are ignored with one log line."""
    import numpy as np

    from cairn.daemon.modelgen.make_model import make_model
    from cairn.daemon.weights.model_dir import FileMaps

    class Log:
        def __init__(self):
            self.events = []

        def info(self, event, **kw):
            self.events.append((event, kw))

    log = Log()
    md = open_model_dir(make_model("qwen35moe-tiny-cond", 1, tmp_path / "q"), log=log)
    assert md.family == "qwen3_5" and "family" not in md.config
    ignored = [kw for e, kw in log.events if e == "model_tensors_ignored"]
    assert len(ignored) == 1 and "vision tower" in ignored[0]["names"] and ignored[0]["tensors"] > 0
    config, weights = families.by_name(md.family).kernel_inputs(md, FileMaps())
    assert config == {**md.config, "model_type": "qwen3_5_moe"}
    assert set(weights) == set(md.tensors) and all(a.dtype == np.float32 for a in weights.values())
    assert not any(n.startswith(("model.", "mtp.")) for n in weights)


def test_speculation_is_off_for_a_model_without_verify():
    from types import SimpleNamespace

    from cairn.daemon.service.main import choose_speculation

    on, off = SimpleNamespace(speculate="on"), SimpleNamespace(speculate="off")
    assert choose_speculation(on, SimpleNamespace(supports_verify=True, family="deepseek_v4")) == (True, "")
    assert choose_speculation(off, SimpleNamespace(supports_verify=False)) == (False, "")
    ok, why = choose_speculation(on, SimpleNamespace(supports_verify=False, family="qwen3_5"))
    assert not ok and "qwen3_5" in why and "speculative decoding is off" in why


def test_the_memory_plan_charges_speculation_only_for_a_family_that_verifies(tmp_path):
    """The plan is made before the load: the family says whether drafts will be verified (Qwen3.5's
    kernel has no journal), so its plan with --speculate on is the plan with it off; V4's is not."""
    from cairn.daemon.modelgen.make_model import make_model
    from cairn.daemon.service.config import load_settings
    from cairn.daemon.service.main import plan_for
    from cairn.daemon.service.memory_probe import LimitSource

    roomy = LimitSource("MemAvailable", 64 << 30)
    for preset, verifies in (("qwen35moe-tiny", False), ("tiny", True)):
        md = open_model_dir(make_model(preset, 1, tmp_path / preset))
        assert families.by_name(md.family).verifies is verifies
        on, off = (plan_for(load_settings({"model": "x", "speculate": s}, {}), md, roomy) for s in ("on", "off"))
        assert (on != off) is verifies, preset
        assert on.journal_bytes == 0 or verifies

"""Padded vocabularies through the daemon (issue 22, item 5.6): config vocab_size past the
tokenizer's size. Ids in the padding (a prompt given as ids, logit_bias, a sampled token) are
accepted and have no text; never a 500."""

from __future__ import annotations

import dataclasses

import trio
from structlog.testing import capture_logs

import fake_kernel
from daemon_harness import daemon, fake_loaded, request

PAD = 64


async def test_padding_ids_in_prompt_logit_bias_and_output_are_served(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    n_tok = loaded.tokenizer.vocab_size
    padded = dataclasses.replace(loaded, model=fake_kernel.Model(vocab_size=n_tok + PAD,
                                                                 eos_id=loaded.tokenizer.eos_id))
    pad_id = n_tok + 3                     # a row of the embedding with no token in the tokenizer
    bias = {"logit_bias": {str(pad_id): 100}, "temperature": 0}   # greedy then samples only pad_id
    sock = tmp_path / "p.sock"
    with trio.fail_after(60), capture_logs() as logs:
        async with daemon(padded, sock):
            r = await request(sock, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": [5, pad_id, 300], "max_tokens": 3, "echo": True,
                               "logprobs": 2, **bias})
            assert r.status == 200, r.body
            choice = r.json()["choices"][0]
            assert choice["logprobs"]["tokens"][1] == ""          # the padding id has no text
            assert r.json()["usage"]["completion_tokens"] == 3
            s = await request(sock, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": "hello", "max_tokens": 3, "stream": True,
                               "stop": ["x"], **bias})
            assert s.status == 200 and s.events()[-1] == "[DONE]", s.body
            c = await request(sock, "POST", "/v1/chat/completions",
                              {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                               "logprobs": True, "top_logprobs": 2, **bias})
            assert c.status == 200, c.body
            j = await request(sock, "POST", "/v1/chat/completions",
                              {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                               "response_format": {"type": "json_object"}})
            assert j.status == 200, j.body
            out = await request(sock, "POST", "/v1/completions",
                                {"model": "tiny", "prompt": [5, n_tok + PAD], "max_tokens": 1})
            assert out.status == 400 and out.json()["error"]["param"] == "prompt"   # past the config's vocab
    assert not [e for e in logs if e["event"] == "handler_failed"]

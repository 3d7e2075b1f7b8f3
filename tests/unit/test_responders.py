"""Responders: what they compute on the event loop before the first token."""

from types import SimpleNamespace

from cairn.daemon.api.responders import CompletionOut


class CountingTokenizer:
    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, ids, **kw) -> str:
        self.decoded += 1
        return "text"


def completion_out(echo: bool, tok: CountingTokenizer) -> CompletionOut:
    api = SimpleNamespace(tok=tok, model_id="m", fingerprint="fp")
    req = SimpleNamespace(common=SimpleNamespace(stream=True, include_usage=False), prompt_text=None,
                          echo=echo, logprobs=None)
    return CompletionOut(api, "cmpl-1", req, list(range(3000)))


def test_completion_without_echo_does_not_decode_the_prompt_ids():
    tok = CountingTokenizer()
    completion_out(False, tok)
    assert tok.decoded == 0
    out = completion_out(True, tok)
    assert tok.decoded == 1 and out.prompt_text == "text"

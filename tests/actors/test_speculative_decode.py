"""The decode loop with drafts (actors/decode.py run_decode), against a toy model with the kernel's
verify / rewind semantics: whatever way a reply ends (length, EOS, a stop string, a client that
goes, inside a draft or not), the reply is the one plain decoding gives and the state holds the
prompt and every reply token but the last — nothing a rejected or unused draft fed is left in it.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import trio

from cairn.actors import decode
from cairn.actors.lifecycle import ClientGone
from cairn.actors.messages import Prefilled, RequestControl, Sampling, Submit, TokenOut

V = 12
EOS = 11


def toy_logits(history: list[int]) -> np.ndarray:
    """A deterministic 'model' that mostly repeats a period-5 pattern and sometimes breaks it."""
    rng = np.random.default_rng(hash(tuple(history[-3:])) % (2**32))
    x = rng.standard_normal(V) * 0.5
    x[(history[-5] if len(history) >= 5 else 3) % (V - 1)] += 2.5      # the pattern: copy from 5 back
    return x.astype(np.float32)


class ToyFeed:
    """The verify step on a list of tokens; `fed` records every call as (token, draft, rewind)."""

    def __init__(self, prompt, speculative: bool):
        self.state = list(prompt)
        self.rewindable = 0
        self.fed: list = []
        self.picked: list = []
        self.speculative = speculative

    def feed(self) -> decode.Feed:
        return decode.Feed(self.submit, self.wait, self.let_go, self.rewind, speculative=self.speculative)

    def submit(self, tok, tally, draft=(), rewind=0):
        return types.SimpleNamespace(tok=tok, draft=tuple(draft), rewind=rewind, ran=False, call_s=1.0, plain_s=1.0)

    def _run(self, h):
        if not h.ran:
            h.ran = True
            assert h.rewind <= self.rewindable
            del self.state[len(self.state) - h.rewind:]
            rows = []
            for t in (h.tok, *h.draft):
                self.state.append(t)
                rows.append(toy_logits(self.state))
            self.rewindable = 1 + len(h.draft)
            self.fed.append((h.tok, h.draft, h.rewind))
            h.out = np.stack(rows) if h.draft or h.rewind else rows[0]

    async def wait(self, h):
        await trio.lowlevel.checkpoint()
        self._run(h)
        return h.out

    async def let_go(self, h):
        return h.ran

    async def rewind(self, k):
        assert k <= self.rewindable
        del self.state[len(self.state) - k:]
        self.rewindable -= k


class _Text:
    def __init__(self):
        self.out = []

    def push(self, tok):
        return f"<{tok}>"

    def hidden_text(self, tok):      # no control token is dropped from this text
        return None

    def flush(self):
        return ""


async def _run(prompt, sampling, speculative, *, gone_after=None):
    """(reply tokens, the toy state, the feed) of one run_decode; `gone_after`: the client stops
    reading after that many tokens (ClientGone)."""
    engine = types.SimpleNamespace(model=types.SimpleNamespace(vocab_size=V),
                                   tokenizer=types.SimpleNamespace(eos_id=EOS), context_length=10_000)
    toy = ToyFeed(prompt, speculative)
    send, recv = trio.open_memory_channel(1000)
    sub = Submit("r", tuple(prompt), None, sampling, False, send, RequestControl())
    got = []

    async def sender_patch(sub_, msg):
        if isinstance(msg, TokenOut):
            toy.picked.append(msg.token_id)
            if gone_after is not None and len(got) >= gone_after:
                raise ClientGone(stalled=False)
            got.append(msg.token_id)

    real_send = decode._send
    decode._send = sender_patch
    try:
        pre = Prefilled(sub, toy_logits(list(prompt)), 0, None, 0.0)
        try:
            await decode.run_decode(engine, pre, _Text(), {}, toy.feed())
        except ClientGone:
            pass
    finally:
        decode._send = real_send
    return got, toy.state, toy


PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


@pytest.mark.parametrize("sampling", [
    Sampling(max_tokens=40, temperature=0, ignore_eos=True),
    Sampling(max_tokens=37, temperature=0.8, seed=3, ignore_eos=True),
    Sampling(max_tokens=60, temperature=0.7, seed=5),                         # may end at EOS
    Sampling(max_tokens=60, temperature=0, stop=("<4><5>",), ignore_eos=True),  # ends at a stop string
])
async def test_replies_and_the_state_left_are_those_of_plain_decoding(sampling):
    plain, plain_state, plain_toy = await _run(PROMPT, sampling, speculative=False)
    spec, spec_state, toy = await _run(PROMPT, sampling, speculative=True)
    assert spec == plain
    # the last token sent is never fed (an EOS is not sent at all, and the tokens before it are fed)
    assert spec_state == plain_state == (PROMPT + plain)[:len(plain_state)]
    assert len(plain_state) >= len(PROMPT) + len(plain) - 1
    assert any(draft for _, draft, _ in toy.fed), "drafts were sent"
    if len(plain) > 20:
        assert len(toy.fed) < len(plain_toy.fed), "accepted drafts saved calls"


@pytest.mark.parametrize("after", [1, 3, 7, 12, 20])
async def test_a_client_that_goes_leaves_no_draft_behind(after):
    """The client stops reading after `after` tokens: the state holds the prompt and the reply's
    tokens so far — the one being sent when the client went fed or not, as in plain decoding (a
    step handed in may or may not have started) — and none of a draft's tokens beyond them."""
    s = Sampling(max_tokens=40, temperature=0, ignore_eos=True)
    plain, _, _ = await _run(PROMPT, s, speculative=False, gone_after=after)
    spec, spec_state, toy = await _run(PROMPT, s, speculative=True, gone_after=after)
    assert spec == plain and len(spec) == after
    picked = toy.picked                     # the sent tokens and the one whose send failed
    assert picked[:after] == spec and len(picked) == after + 1
    assert spec_state == (PROMPT + picked)[:len(spec_state)]
    assert len(PROMPT) + after <= len(spec_state) <= len(PROMPT) + after + 1

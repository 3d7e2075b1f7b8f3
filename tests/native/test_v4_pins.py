"""DeepSeek-V4's bits, pinned (issue 43 step 0; docs/design/families.md §4): golden sha256 values of
what the family seam refactor must not change — a `tiny` model's fingerprint, the packed cache layout
key, its logits after prefill and after decode, a snapshot's bytes and its page bytes.

The numeric goldens are keyed by `cairn.isa.numeric_class`: fused-multiply-add builds (v3, v4,
aarch64: "fma", pinned on x86-64-v3) give the same bits; x86-64-v2 ("nofma", pinned with CAIRN_ISA=v2)
rounds its own way. A class without goldens fails (pin it on purpose).
The fingerprint and the layout key are the same on every build. If one of these fails after a
refactor, a bit changed: find why; do not re-pin unless the change is meant (and say so in the commit).
The ISA harnesses' digests (test_isa_paths.py: forward_harness.cpp's V4 logits, isa_harness.cpp's
products) are pinned per x86-64 level as well: test_isa_paths only compares levels with each other.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights.model_dir import load_model, open_model_dir
from cairn.isa import cpu_flags, numeric_class, runnable

SEED = 11
PAGE_TOKENS = 16                      # small groups: the prompt fills two and leaves a partial one
PROMPT = (np.arange(41, dtype=np.int64) * 37 % 509 + 2).astype(np.int32)   # [41] token ids < vocab 512
DECODE = (5, 77, 300)                 # tokens decoded one at a time after the prompt
CHUNK = 7

FINGERPRINT = "19763b2186530bfc7958a2329198134978c22997b438eb5d93812bdcd0fe3ea0"
LAYOUT_KEY = 6756875973954244246       # _kernel.packed_layout_key({}): every build
PACKED_LAYOUT_KEY = 5430655717789621764  # the tiny model's packed panels (Model.packed_layout_key)
NUMERIC = {                          # numeric_class -> sha256 of each byte string
    "fma": {                         # x86-64-v3 (pinned here), v4, aarch64
        "prefill_logits": "5860523d9561ac52b42060d02d761058cc15366f6f46d190d1996b7decf60ef8",
        "decode_logits": "578d7c3c4d0e602c05d00f5625a4a4600991eb0ac470d427cc5124a1989290ab",
        "snapshot": "6226e646f3168a502605be2999fc62dd82bf173884086b14584654aa4d5d24e9",
        "pages": "514c780f393e839d89eb1ef6e67b8cb0749bcb0cc7a983d174b27163d57b1d2d",
    },
    "nofma": {                       # x86-64-v2 (pinned here with CAIRN_ISA=v2)
        "prefill_logits": "09aa768926c1dbef80e4fdbf29b10db45d459fc434af2b96b47e4130d8631622",
        "decode_logits": "bd5da91a97b21f6bf8f6f608730b71638df9a01ab4b34b83c4952e5168b5a1c2",
        "snapshot": "e84ff99f7e6e1c6d6f135c862bc3c4a8983c8c65573b574aac23b9645fbea44a",
        "pages": "e725b31cc50ff4308a66e9b8a257abd46b92632a72c6abde4cc5dc0d46135df1",
    },
}

# test_isa_paths._build_and_run's digests for one -march level (FNV-1a of the harness outputs)
ISA_DIGESTS = {
    "x86-64-v3": {"products": "b5ef28583284a1bd", "logits": "8c3c9ff9442f717f"},   # numeric class fma
    "x86-64-v2": {"products": "7766d30c7423bb13", "logits": "fbede4aac885196a"},   # numeric class nofma
}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return open_model_dir(make_model("tiny", SEED, tmp_path_factory.mktemp("v4pin")))


@pytest.fixture(scope="module")
def run(tiny):
    """Prefill the prompt in chunks, snapshot, decode a few tokens: every byte string pinned."""
    m = load_model(tiny, page_tokens=PAGE_TOKENS)
    st = K.State(m)
    n, logits = K.prefill(st, PROMPT, chunk=CHUNK, all_logits=True)   # [41, V] float32
    assert n == len(PROMPT)
    snap = st.snapshot()
    assert snap.n_full_pages == len(PROMPT) // PAGE_TOKENS   # the pages below are really hashed
    pages = b"".join(snap.page(k).tobytes() for k in range(snap.n_full_pages))
    decoded = np.stack([K.decode(st, t) for t in DECODE])       # [3, V] float32
    return {"model": m, "prefill_logits": _sha(np.ascontiguousarray(logits, np.float32).tobytes()),
            "decode_logits": _sha(np.ascontiguousarray(decoded, np.float32).tobytes()),
            "snapshot": _sha(snap.to_bytes()), "pages": _sha(pages)}


def _numeric(name: str) -> str:
    cls = numeric_class(K.ISA)
    assert cls in NUMERIC, f"no V4 goldens for numeric class {cls!r} (kernel {K.ISA}): pin them on such a build"
    return NUMERIC[cls][name]


def test_fingerprint_of_a_tiny_model_is_pinned(tiny):
    assert tiny.fingerprint == FINGERPRINT


def test_packed_layout_keys_are_pinned(run):
    assert K.packed_layout_key({}) == LAYOUT_KEY
    assert run["model"].packed_layout_key == PACKED_LAYOUT_KEY


@pytest.mark.parametrize("name", ["prefill_logits", "decode_logits", "snapshot", "pages"])
def test_tiny_model_bytes_are_pinned(run, name):
    assert run[name] == _numeric(name)


@pytest.mark.parametrize("level", list(ISA_DIGESTS))
def test_isa_harness_digests_are_pinned(level, tmp_path):
    import shutil

    from test_isa_paths import _build_and_run

    assert level.removeprefix("x86-64-") in runnable(cpu_flags()), f"this CPU cannot run {level}"
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed to build the kernel, and so this test"
    got = _build_and_run([cxx, f"-march={level}"], tmp_path, [])
    assert {k: got[k] for k in ("products", "logits")} == ISA_DIGESTS[level]   # V4's (the Qwen3.5 digest: test_isa_paths)

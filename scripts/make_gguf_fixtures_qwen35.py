"""Write the Qwen3.5 GGUF test fixtures (tests/fixtures/gguf/qwen35*.gguf; issue 43 step 10): tiny models
made by `cairn make-model` (presets qwen35moe-tiny and qwen35-tiny, seed 0, F32) converted by llama.cpp's
own converter (`Qwen3_5MoeTextModel` / `Qwen3_5TextModel`: arch qwen35moe / qwen35), --outtype f32.

    .venv/bin/python scripts/make_gguf_fixtures_qwen35.py [--llama-cpp SRC] [--out tests/fixtures/gguf]

SRC as in make_gguf_fixtures.py (the llama-cpp-python sdist's vendored tree by default). The V4 shim
is not used: Qwen3.5 needs no patch but one, the tokenizer's pre-tokenizer hash (make_model's trained
BPE is unknown to llama.cpp; the presets split text with Qwen's regex, so "qwen35", llama.cpp's name for
it), and --no-mtp (the causal presets have no MTP head, and the converter would otherwise count one).

Then block-format mixes by llama.cpp's `llama-quantize` (BIN: SRC/build/bin, or --llama-bin;
../shared/tools/llama-peer/build.sh builds it): Q8_0, Q4_0 and Q4_K_M of the tiny MoE model, whose rows
are 32 to 128 wide, so where a type needs 256-value blocks llama-quantize falls back by its own rules;
and Q4_K_M, Q6_K and IQ4_XS of `qwen35moe-k256` (K256_PRESET: every row 256 or 512 wide, so those
blocks are what the file holds). The mix each file got is in MANIFEST.json, `tensor_types`. MANIFEST.json gains one entry per file;
SHA256SUMS is rewritten over every fixture, as make_gguf_fixtures.py does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_fixtures import REPO, SDIST_VERSION, _run, llama_cpp_source, tensor_types  # noqa: E402

SEED = 0
FIXTURES = {"qwen35moe-tiny-f32": "qwen35moe-tiny", "qwen35-tiny-f32": "qwen35-tiny"}   # file stem -> preset
# K-quant and IQ blocks hold 256 weights: a MoE model every one of whose rows is 256 (or 512) wide,
# two layers (Gated DeltaNet, then attention). Its F32 file is only a source (not kept).
K256 = "qwen35moe-k256"
K256_PRESET = dict(layer_types=("linear_attention", "full_attention"), hidden_size=256, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=32, linear_value_head_dim=64, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=256, shared_expert_intermediate_size=256)
# file stem -> (the F32 file it is made from, llama-quantize type)
QUANT_FIXTURES = {"qwen35moe-tiny-q8_0": ("qwen35moe-tiny-f32", "Q8_0"),
                  "qwen35moe-tiny-q4_0": ("qwen35moe-tiny-f32", "Q4_0"),
                  "qwen35moe-tiny-q4_k_m": ("qwen35moe-tiny-f32", "Q4_K_M"),
                  "qwen35moe-k256-q4_k_m": (f"{K256}-f32", "Q4_K_M"),
                  "qwen35moe-k256-q6_k": (f"{K256}-f32", "Q6_K"),
                  "qwen35moe-k256-iq4_xs": (f"{K256}-f32", "IQ4_XS")}


def convert_one(src: str, hf_dir: str, out: str) -> None:
    """In a child process: llama.cpp's converter main() with the pre-tokenizer fallback."""
    sys.path[:0] = [src, str(Path(src) / "gguf-py")]
    import convert_hf_to_gguf as conv
    from conversion import base

    orig = base.TextModel.get_vocab_base_pre

    def pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            return "qwen35"

    base.TextModel.get_vocab_base_pre = pre
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", "--outfile", out, "--no-mtp"]
    conv.main()


def convert_in_child(src, hf: Path, target: Path) -> None:
    """convert_one in a child process (the converter patches module state); raises SystemExit naming the file."""
    r = subprocess.run([sys.executable, __file__, "--convert-one", str(src), str(hf), str(target)],
                       capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"converting {target.stem} failed:\n{(r.stdout + r.stderr)[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (default: the PyPI sdist's, downloaded once)")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "gguf"))
    ap.add_argument("--llama-bin", help="directory of llama-quantize (default: SRC/build/bin)")
    ap.add_argument("--convert-one", nargs=3, metavar=("SRC", "HF", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.convert_one:
        convert_one(*a.convert_one)
        return
    from cairn.daemon.modelgen.make_model import make_model
    from cairn.daemon.modelgen.qwen35 import Qwen35Preset

    src = llama_cpp_source(a.llama_cpp)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((out / "MANIFEST.json").read_text()) if (out / "MANIFEST.json").exists() else {}
    fixtures = manifest.setdefault("fixtures", {})
    with tempfile.TemporaryDirectory() as tmp:
        for stem, preset in FIXTURES.items():
            hf = Path(tmp) / preset   # the directory name becomes general.name: keep it fixed
            make_model(preset, SEED, hf)
            convert_in_child(src, hf, out / f"{stem}.gguf")
            fixtures[stem] = {"preset": preset, "seed": SEED, "dtype": "float32", "outtype": "f32",
                              "converter": f"llama-cpp-python {SDIST_VERSION} sdist convert_hf_to_gguf.main() "
                                           "--no-mtp, unknown pre-tokenizer hash -> qwen35 "
                                           "(scripts/make_gguf_fixtures_qwen35.py)"}
    quantize = Path(a.llama_bin or Path(src) / "build" / "bin") / "llama-quantize"
    if not quantize.is_file():
        raise SystemExit(f"{quantize}: missing; build it with ../shared/tools/llama-peer/build.sh or name it with --llama-bin")
    with tempfile.TemporaryDirectory() as tmp:
        k256 = Path(tmp) / K256
        make_model(Qwen35Preset(**K256_PRESET), SEED, k256)
        convert_in_child(src, k256, Path(tmp) / f"{K256}-f32.gguf")
        fixtures_src = {f"{K256}-f32": {"preset": "scripts/make_gguf_fixtures_qwen35.py K256_PRESET", "seed": SEED,
                                        "dtype": "float32", "outtype": "f32"}}
        for stem, (source, qtype) in QUANT_FIXTURES.items():
            target = out / f"{stem}.gguf"
            where = Path(tmp) if source in fixtures_src else out
            _run([str(quantize), str(where / f"{source}.gguf"), str(target), qtype, "1"], f"llama-quantize {qtype}")
            types = tensor_types(target)
            counts: dict[str, int] = {}
            for t in types.values():
                counts[t] = counts.get(t, 0) + 1
            fixtures[stem] = {**(fixtures_src.get(source) or fixtures[source]),
                              "llama_quantize": {"type": qtype, "from": f"{source}.gguf"},
                              "tensor_types": types, "type_counts": counts}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sums = []
    for f in sorted(out.glob("*.gguf")):
        sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}")
        if f.stem in FIXTURES or f.stem in QUANT_FIXTURES:
            print(f"{f.stat().st_size:>9}  {f.name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")


if __name__ == "__main__":
    main()

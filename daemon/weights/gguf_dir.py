"""GGUF files as llama.cpp writes them, read into the same model description a model directory gives
(model_dir.ModelDir; docs/model-format.md, "GGUF"). The family (families.py, from
general.architecture) maps the metadata and names: DeepSeek-V4's (arch `deepseek4`) in dsv4/gguf.py.

Design notes
 * Parsing is the `gguf` package's (llama.cpp's own reader): metadata and the tensor table. Tensor bytes
   are not read here: each tensor becomes a TensorInfo (file, byte range, dtype tag, shape) like a
   safetensors tensor, and map_weights hands the kernel views of one memory map per file. F32 is used
   in place; BF16 and F16 go to the kernel as stored, the pairs a BF16/F16 safetensors directory gives.
   A block-quantized tensor (Q4_0-Q8_0, the K-quants, the IQ types, MXFP4: ggml_types.SUPPORTED) goes
   as its bytes, tag `GGML:<TYPE>`, uint8 [rows..., row_bytes]; its TensorInfo keeps the logical shape,
   so the shape checks are the float ones. Any other GGML type is refused by name.
 * llama.cpp's names map back one to one to the canonical (official) names, with no transform of the
   bytes: a GGUF shape is the row-major shape reversed (ggml's ne0 is the fastest axis), so a [out, in]
   matrix is stored exactly as in safetensors, and the routed experts, stacked by the converter into
   one [n_expert, out, in] tensor per projection and layer, are n_expert contiguous byte ranges: one
   view each (no copy, no transpose).
 * The config comes from the `<arch>.*` metadata, mapped to the HF field names resolve_config reads,
   so every default and check is the directory's. Float metadata is stored as float32: each value is
   read back as the shortest decimal that gives the same float32 (1e-06, not 9.99999997e-07), which is
   what a config.json written for the same model holds.
 * The tokenizer is rebuilt from tokenizer.ggml.* (tokens, merges, token types, the pre-tokenizer name)
   as a `tokenizers` BPE with the pre-tokenizer llama.cpp means by that name.
 * The fingerprint hashes the resolved config, every byte of every file (weight_digest.py, cached),
   the tokenizer and the template, as the directory's does.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from . import families, ggml_types
from .errors import ModelDirError
from .model_dir import ModelDir, check_tensors, hash_weight_files, log_ignored
from .safetensors_io import TensorInfo
from .weight_digest import DigestCache

# GGML type name -> the dtype tag the kernel takes (safetensors_io.DTYPES; the block-quantized types
# are ggml_types.SUPPORTED, tag `GGML:<TYPE>`).
FLOAT_TYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16"}
INT_TYPES = {"I32": "I32", "I64": "I64"}   # the hash-routing table (ffn_gate_tid2eid)
SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

def gguf_model_name(first: Path) -> str:
    """The model's name from its (first) file: the stem without `-0000K-of-0000N`."""
    m = SPLIT_RE.match(first.name)
    return m.group("stem") if m else first.name.removesuffix(".gguf")


# --------------------------------------------------------------------------------------------
# files


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names (a .gguf file, or a directory without config.json that holds one
    GGUF set); None when path is not a GGUF model (a model directory, or nothing)."""
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelDirError(f"{path}: GGUF file does not exist")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(path.glob("*.gguf"))
    if not files:
        return None
    sets = {(m.group("stem") if (m := SPLIT_RE.match(f.name)) else f.name) for f in files}
    if len(sets) > 1:
        raise ModelDirError(f"{path}: holds {len(sets)} GGUF models ({', '.join(sorted(sets))}); "
                            "serve one: --model DIR/FILE.gguf")
    return files[0]


def split_files(first: Path) -> list[Path]:
    """Every file of the set `first` belongs to, in order (one file when it is not split)."""
    m = SPLIT_RE.match(first.name)
    if not m:
        return [first]
    count = int(m.group("count"))
    if count < 1:
        raise ModelDirError(f"{first}: split count 0 in the file name")
    files = [first.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ModelDirError(f"{first}: part of a {count}-file GGUF set; missing {', '.join(missing)}")
    return files


class _PartialRows(Exception):
    """A quantized tensor whose rows are not whole blocks: (tensor name, GGML type, row length, block)."""


def _row_error(file: Path, name: str, gtype: str, ncols: int, block: int) -> ModelDirError:
    return ModelDirError(f"{file}: tensor {name!r} is {gtype} with rows of {ncols} values, not a whole number "
                         f"of its {block}-value blocks")


def _reader_class():
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    class Reader(GGUFReader):
        # gguf's reader refuses such a tensor too, but without its name: look first.
        def _build_tensors(self, start_offs, fields):
            for field in fields:
                try:
                    _, name, _, dims, raw_dtype, _ = field.parts
                    qtype = GGMLQuantizationType(int(raw_dtype[0]))
                except (ValueError, TypeError, IndexError):
                    continue   # an unknown type id (or another gguf version's layout): the reader's checks stand
                block = GGML_QUANT_SIZES[qtype][0]
                if len(dims) and int(dims[0]) % block:   # dims[0] is ne0, the row
                    raise _PartialRows(bytes(name).decode("utf-8", "replace"), qtype.name, int(dims[0]), block)
            super()._build_tensors(start_offs, fields)

    return Reader


def _read(file: Path):
    try:
        return _reader_class()(file)   # memory-maps the file; reads only the header here
    except _PartialRows as e:
        raise _row_error(file, *e.args) from None
    except (ValueError, OSError, KeyError, IndexError) as e:
        raise ModelDirError(f"{file}: not a readable GGUF file ({e})") from None


def _fields(reader) -> dict:
    """Metadata key -> value (float32 values as their shortest float32 decimal)."""
    from gguf import GGUFValueType

    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        v = f.contents()
        if f.types and GGUFValueType.FLOAT32 in (f.types[0], f.types[-1]):
            v = [_f32(x) for x in v] if isinstance(v, list) else _f32(v)
        out[key] = v
    return out


def _f32(x: float) -> float:
    return float(np.format_float_positional(np.float32(x), unique=True))


# --------------------------------------------------------------------------------------------
# tokenizer

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the Hugging Face pre-tokenizer it stands for
# (src/llama-vocab.cpp's regexes are those of the model's tokenizer.json).
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
# Qwen3.5's (tokenizer.json's Split regex; llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 spells the (?i:) out)
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = ("gpt-2", "deepseek-v3", "qwen35")
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4   # gguf.TokenType


def _pre_tokenizer(name: str, where: str):
    from tokenizers import Regex, pre_tokenizers

    if name == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "deepseek-v3":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in _DEEPSEEK_V3_SPLITS]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if name == "qwen35":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN35_SPLIT), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ModelDirError(f"{where}: tokenizer.ggml.pre is {name!r}; supported: {', '.join(PRE_TOKENIZERS)}")


def tokenizer_from_metadata(meta: dict, where: str):
    """A `tokenizers` Tokenizer equivalent to the one llama.cpp's converter read (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelDirError(f"{where}: tokenizer.ggml.model is {model!r}; cairn reads byte-level BPE "
                            "tokenizers ('gpt2', as DeepSeek-V4's)")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not isinstance(merges, list):
        raise ModelDirError(f"{where}: tokenizer.ggml.tokens and tokenizer.ggml.merges are needed (a vocabulary "
                            "and its BPE merges)")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ModelDirError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if vocab.setdefault(t, i) != i:
            raise ModelDirError(f"{where}: tokenizer.ggml.tokens lists {t!r} twice (ids {vocab[t]} and {i})")
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelDirError(f"{where}: tokenizer.ggml.merges entry {m!r} is not two tokens")
        pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", ""), where)
    tok.decoder = decoders.ByteLevel()
    # CONTROL tokens are the special ones, USER_DEFINED the other added ones; both are matched as
    # whole tokens before the BPE (as the directory's added_tokens are).
    tok.add_tokens([AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL,
                               normalized=types[i] != TOKEN_CONTROL)
                    for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)])
    return tok


# --------------------------------------------------------------------------------------------
# tensors


def _dtype_tag(file: Path, name: str, gtype: str, shape: tuple[int, ...]) -> str:
    """The kernel's dtype tag for a tensor of GGML type `gtype`: a float type as stored, a supported
    block-quantized type as `GGML:<TYPE>` (its bytes, ggml_types.py); anything else is refused."""
    if name.endswith("ffn_gate_tid2eid.weight"):
        if gtype not in INT_TYPES:
            raise ModelDirError(f"{file}: tensor {name!r} has GGML type {gtype}; cairn loads {', '.join(INT_TYPES)} "
                                "for this integer table")
        return INT_TYPES[gtype]
    if gtype in FLOAT_TYPES:
        return FLOAT_TYPES[gtype]
    if gtype not in ggml_types.SUPPORTED:
        raise ModelDirError(
            f"{file}: tensor {name!r} has GGML type {gtype}; cairn loads weights of the float types "
            f"{', '.join(FLOAT_TYPES)} and the quantized types {', '.join(ggml_types.SUPPORTED)} "
            "(requantize with llama-quantize to one of these, or serve an unquantized file)")
    tag = ggml_types.tag(gtype)
    block, _ = ggml_types.block_of(tag)
    if not shape or shape[-1] % block:   # (_read has looked already; this keeps the mapping safe without it)
        raise _row_error(file, name, gtype, shape[-1] if shape else 0, block)
    return tag


def _tensor_infos(file: Path, reader, cfg: dict, tensors: dict[str, TensorInfo], ignored: list[int],
                  family: families.WeightFamily) -> None:
    """Add the file's tensors to `tensors` by canonical name (the family's mapping; stacked experts: one
    view per expert); count the speculative heads' blocks past the last layer (MTP, a drafter) into
    ignored [tensors, bytes]."""
    for t in reader.tensors:
        name = t.name
        kind, canon, layer = family.gguf_tensor(name, cfg["num_hidden_layers"])
        if kind == "ignored":
            ignored[0] += 1
            ignored[1] += int(t.n_bytes)
            continue
        if kind == "skip":
            continue   # not one of ours (a vision bias, a name llama.cpp added)
        gtype = t.tensor_type.name
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))   # ggml ne (fastest first) -> row-major
        tag = _dtype_tag(file, name, gtype, shape)
        start = int(t.data_offset)
        if kind == "tensor":
            if canon in tensors:
                raise ModelDirError(f"{file}: tensor {name!r} duplicates one in {tensors[canon].file.name}")
            tensors[canon] = TensorInfo(file, name, tag, shape, start, start + int(t.n_bytes))
            continue
        want, names = family.gguf_experts(cfg, layer, canon)
        E = len(names)
        if shape != want:
            raise ModelDirError(f"{file}: tensor {name!r} has shape {list(shape)} (ggml ne {list(shape[::-1])}), "
                                f"expected {list(want)} ([n_expert, out, in]) from the GGUF metadata")
        each = int(t.n_bytes) // E
        for e, canon in enumerate(names):
            if canon in tensors:
                raise ModelDirError(f"{file}: tensor {name!r} duplicates one in {tensors[canon].file.name}")
            tensors[canon] = TensorInfo(file, f"{name}[{e}]", tag, want[1:], start + e * each, start + (e + 1) * each)


# --------------------------------------------------------------------------------------------
# the model


def open_gguf(first: str | Path, *, digest_cache: str | Path | None = None, log=None) -> ModelDir:
    """Read and check a GGUF model (one file or a split set named by its first file)."""
    first = Path(first).expanduser().resolve()
    m = SPLIT_RE.match(first.name)
    if m and int(m.group("no")) != 1:
        first = first.with_name(f"{m.group('stem')}-00001-of-{m.group('count')}.gguf")
    files = split_files(first)
    readers = [_read(f) for f in files]
    meta = _fields(readers[0])
    where = str(first)
    if len(files) > 1 or "split.count" in meta:
        _check_split(files, readers, meta)
    family = families.for_gguf(meta.get("general.architecture"), where)   # refused families stop here
    if family.open_dir is not None:   # a family with its own reader (as for directories, model_dir.py)
        del readers
        return family.open_dir(first, digest_cache=digest_cache, log=log)
    cfg = family.resolve_config(family.gguf_config(meta, where), f"{where} (GGUF metadata)")
    tok = tokenizer_from_metadata(meta, where)
    tensors: dict[str, TensorInfo] = {}
    ignored = [0, 0]
    for f, r in zip(files, readers):
        _tensor_infos(f, r, cfg, tensors, ignored, family)
    log_ignored(log, *ignored, f"blk.{cfg['num_hidden_layers']}+")
    del readers   # their maps close: the kernel's views come from FileMaps (one map per file)
    tensors = check_tensors(first, cfg, tensors, source="the GGUF metadata", spell=family.gguf_name, family=family)

    template = meta.get("tokenizer.chat_template") or None
    tokens = meta["tokenizer.ggml.tokens"]
    bos = tokens[cfg["bos_token_id"]] if 0 <= cfg["bos_token_id"] < len(tokens) else ""
    eos = tokens[cfg["eos_token_id"]] if 0 <= cfg["eos_token_id"] < len(tokens) else ""
    tok_json = tok.to_str()

    digests = DigestCache(digest_cache)
    file_digests = hash_weight_files(digests, files, log)
    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True).encode())
    # Each part by its place in the set, not its name (a renamed copy is the same model); a GGUF's
    # header is inside its file's digest.
    for i, d in enumerate(file_digests):
        h.update(f"gguf part {i + 1} of {len(files)}".encode() + b"\0" + bytes.fromhex(d))
    h.update(hashlib.sha256(tok_json.encode()).digest())
    h.update(json.dumps([template, bos, eos]).encode())
    return ModelDir(path=first, config=cfg, tensors=tensors, fingerprint=h.hexdigest(), tokenizer_file=first,
                    chat_template=template, bos_token=bos, eos_token=eos, tokenizer_json=tok_json,
                    family=family.name)


def _check_split(files: list[Path], readers: list, meta: dict) -> None:
    """split.no / split.count / split.tensors.count as llama.cpp's gguf-split (and converter) write them."""
    total = 0
    for i, (f, r) in enumerate(zip(files, readers)):
        kv = _fields(r) if i else meta
        no, count = kv.get("split.no"), kv.get("split.count")
        if no != i or count != len(files):
            raise ModelDirError(f"{f}: split.no {no} / split.count {count}, expected {i} / {len(files)} for "
                                f"file {i + 1} of {len(files)}")
        total += len(r.tensors)
    want = meta.get("split.tensors.count")
    if want is not None and want != total:
        raise ModelDirError(f"{files[0]}: split.tensors.count is {want} but the {len(files)} files hold {total} "
                            "tensors (a file of the set is from another conversion?)")

"""The model-directory contract (docs/model-format.md): read, check, and hand to the kernel.

A DeepSeek-V4 directory as Hugging Face publishes one: config.json (model_type deepseek_v4),
safetensors weights (one file or shards + model.safetensors.index.json), tokenizer.json and
tokenizer_config.json carrying the chat template (or chat_template.jinja). Weights are
memory-mapped, never copied here. Both weight spellings are accepted — HF's save_pretrained
layout and the official DeepSeek one — and normalised to one canonical spelling (the official
names without a `model.` prefix). Every shape is checked against the config; each error names
the file, the tensor and what was expected. The directory is only ever read.

What differs by model family (config fields, tensor names and shapes, quantized layout) comes from
the family's `WeightFamily` (families.py; DeepSeek-V4's in dsv4/); this module is the shared flow.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import families
from .errors import ModelDirError
from .safetensors_io import FileMaps, SafetensorsError, TensorInfo, read_header
from .weight_digest import DigestCache


@dataclass(frozen=True)
class ModelDir:
    path: Path
    config: dict                      # resolved: every field the kernel reads, defaults applied
    tensors: dict[str, TensorInfo]    # canonical name -> where its bytes are
    fingerprint: str                  # config + every weight byte + tokenizer (hex sha256)
    tokenizer_file: Path
    chat_template: str | None         # None: no template shipped (the native V4 encoding is used)
    bos_token: str
    eos_token: str
    tokenizer_json: str | None = None  # a GGUF's tokenizer, built from its metadata (else: tokenizer_file)
    family: str = "deepseek_v4"       # families.py; chosen from model_type, not in config or fingerprint

    @property
    def name(self) -> str:
        if self.path.suffix == ".gguf":   # a GGUF file (the first of a split set): its stem, no split suffix
            from .gguf_dir import gguf_model_name

            return gguf_model_name(self.path)
        return self.path.name

    def tokenizer_text(self) -> str:
        """The tokenizer as tokenizer.json text."""
        return self.tokenizer_json if self.tokenizer_json is not None else self.tokenizer_file.read_text()


# --------------------------------------------------------------------------------------------
# the directory


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelDirError(f"{index}: not a valid safetensors index ({e})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelDirError(f"{index}: weight_map must map tensor names to shard file names")
        # one Path per shard, not per tensor (the release lists ~70,000 tensors in 48 shards)
        files = sorted(path / f for f in set(weight_map.values()))
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelDirError(f"{index}: lists shard(s) that do not exist: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{path}: no weights (expected model.safetensors or model.safetensors.index.json)")
    return files


def _chat_template(path: Path, tok_cfg: dict) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    tmpl = tok_cfg.get("chat_template")
    if isinstance(tmpl, list):  # HF's list of named templates
        tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
    if not isinstance(tmpl, str) or not tmpl:
        return None   # as the first DeepSeek-V4 release: the native V4 encoding is used (chat_encoding.py)
    return tmpl


def _read_json(file: Path, missing: str) -> dict:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ModelDirError(missing) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v


def check_tensors(path: Path, cfg: dict, tensors: dict[str, TensorInfo], *, source: str = "config.json",
                  spell=None, family: families.WeightFamily | None = None) -> dict[str, TensorInfo]:
    """Check every tensor the config needs against it (present, shape, float or integer dtype, quantized
    layout); return the ones the model uses. source: where the expected shapes come from (for the
    message); spell: canonical name -> the name to report a missing tensor by (the file's spelling);
    family: whose names and shapes (default DeepSeek-V4)."""
    fam = family or families.by_name("deepseek_v4")
    want = fam.expected_shapes(cfg)
    missing = sorted(set(want) - set(tensors))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        names = [spell(m) if spell else m for m in missing[:5]]
        raise ModelDirError(f"{path}: missing tensor(s) {', '.join(names)}{more}")
    quant = cfg.get("quantization")
    scales: set[str] = set()
    for name, shape in want.items():
        info = tensors[name]
        if info.dtype in fam.quantized_dtypes:
            scales.add(fam.check_quantized(name, info, shape, tensors, quant))
            continue
        if info.shape != shape:
            raise ModelDirError(
                f"{info.file}: tensor {info.name!r} has shape {list(info.shape)}, expected {list(shape)} from {source}")
        is_int = name.endswith("tid2eid")
        if is_int != (info.dtype in ("I64", "I32")):
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has dtype {info.dtype}, "
                                f"expected {'an integer' if is_int else 'a float'} dtype")
    return {k: v for k, v in tensors.items() if k in want or k in scales}


def open_model_dir(path: str | Path, *, digest_cache: str | Path | None = None, log=None) -> ModelDir:
    """Read and check a model directory. Weight bytes are read once, for the fingerprint (every
    byte of every shard, weight_digest.py); with ``digest_cache`` (a file outside the model
    directory) a restart of an unchanged model reads none of them."""
    path = Path(path).expanduser().resolve()
    from .gguf_dir import find_gguf, open_gguf

    gguf = find_gguf(path)   # a .gguf file, or a directory holding one GGUF set and no config.json
    if gguf is not None:
        return open_gguf(gguf, digest_cache=digest_cache, log=log)
    if not path.is_dir():
        if path.exists():        # a file, but not a .gguf one
            raise ModelDirError(f"{path}: not a model directory or GGUF file (--model takes a directory with "
                                "config.json, or a .gguf file; docs/model-format.md)")
        raise ModelDirError(f"{path}: model directory does not exist")
    cfg_file = path / "config.json"
    raw = _read_json(cfg_file, f"{cfg_file}: missing (a model directory needs config.json)")
    family = families.for_config(raw, str(cfg_file))   # a family the kernel cannot run yet stops here
    if family.open_dir is not None:
        return family.open_dir(path, digest_cache=digest_cache, log=log)
    cfg = family.resolve_config(raw, str(cfg_file))

    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise ModelDirError(f"{path}: missing tokenizer.json (the tokenizer ships with the model directory)")
    tok_cfg = _read_json(path / "tokenizer_config.json",
                         f"{path}: missing tokenizer_config.json (bos/eos tokens and chat template)")
    template = _chat_template(path, tok_cfg)

    headers: list[bytes] = []
    tensors: dict[str, TensorInfo] = {}
    ignored = [0, 0]   # tensors, bytes: the release's speculative heads (mtp.*: MTP, or 0731's DSpark drafter)
    digests = DigestCache(digest_cache)
    files = _weight_files(path)
    for f in files:
        try:
            raw, infos = read_header(f)
        except SafetensorsError as e:
            raise ModelDirError(str(e)) from None
        headers.append(f.name.encode() + b"\0" + raw)
        for name, info in infos.items():
            canon = family.canonical_name(name)
            if canon is None:
                ignored[0] += 1
                ignored[1] += info.end - info.start
                continue
            if canon in tensors:
                raise ModelDirError(f"{f}: tensor {name!r} duplicates one in {tensors[canon].file.name}")
            tensors[canon] = info

    tensors = check_tensors(path, cfg, tensors, family=family)
    log_ignored(log, *ignored, family.ignored_names)

    # Only a directory that passed every check is hashed (every byte; cached: weight_digest.py).
    headers = [h + bytes.fromhex(d) for h, d in zip(headers, hash_weight_files(digests, files, log))]

    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for raw in headers:
        h.update(raw)
    h.update(hashlib.sha256(tok_file.read_bytes()).digest())
    bos, eos = _token_text(tok_cfg.get("bos_token")) or "", _token_text(tok_cfg.get("eos_token")) or ""
    h.update(json.dumps([template, bos, eos]).encode())
    return ModelDir(path=path, config=cfg, tensors=tensors, fingerprint=h.hexdigest(),
                    tokenizer_file=tok_file, chat_template=template,
                    bos_token=bos, eos_token=eos, family=family.name)


IGNORED_WHY = "speculative-decoding heads (MTP, or V4-Flash-0731's DSpark drafter): not run by cairn"


def log_ignored(log, tensors: int, nbytes: int, where: str, why: str = IGNORED_WHY) -> None:
    """One line for the tensors a model carries that cairn does not run (the speculative heads; a
    conditional-generation checkpoint's vision tower)."""
    if tensors and log is not None:
        log.info("model_tensors_ignored", tensors=tensors, bytes=nbytes, names=where, why=why)


def map_weights(md: ModelDir, maps: FileMaps | None = None) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor as a view of its file's one memory map (FileMaps): canonical name -> (array,
    dtype tag). BF16 arrives as uint16 bits, FP8 and ue8m0 scales as uint8 bytes, FP4 as int8 pairs
    of nibbles: the kernel reads the stored bytes (no widening here)."""
    maps = maps if maps is not None else FileMaps()
    try:
        return {name: (maps.tensor(info), info.dtype) for name, info in md.tensors.items()}
    except SafetensorsError as e:
        raise ModelDirError(str(e)) from None


PACKED_CACHE_MIN_BYTES = 256 << 20  # smaller models pack in well under a second: not worth a file


def packed_cache_file(md: ModelDir, cache_dir: str | Path, widen_bf16: bool = False) -> Path:
    """Where a model's packed panels are cached: named by the model directory (packed_cache.source_key,
    so the trim knows an older version of the same model's file) and its fingerprint (the file's header
    repeats it, with the panel layout, and a mismatch re-packs)."""
    from .packed_cache import source_key

    return Path(cache_dir) / f"{source_key(md.path)}-{md.fingerprint[:32]}{'-widened' if widen_bf16 else ''}.pack"


def hash_weight_files(digests, files, log=None) -> list[str]:
    """Every file's digest (weight_digest.DigestCache: cached by size and mtime), one log line for
    what had to be read, the cache saved (a failure costs a rehash at the next start, nothing else)."""
    t0 = time.perf_counter()
    out = digests.digest_all(files)
    if digests.hashed and log is not None:
        secs = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in digests.hashed)
        log.info("model_weights_hashed", files=len(digests.hashed), bytes=size, seconds=round(secs, 2),
                 mb_s=round(size / max(secs, 1e-9) / 1e6), cache=str(digests.file) if digests.file else None)
    try:
        digests.save()
    except OSError as e:
        if log is not None:
            log.warning("weight_digest_cache_not_saved", file=str(digests.file), error=f"{e.strerror or e}")
    return out


def load_model(path: str | Path | ModelDir, threads: int = 0, *, widen_bf16: bool = False,
               packed_cache: str | Path | None = None, packed_cache_min_bytes: int = PACKED_CACHE_MIN_BYTES,
               expert_cache_bytes: int | None = None, packed_cache_budget: int | None = None,
               page_tokens: int = 0):
    """Open a model directory and build the kernel's immutable Model from it. packed_cache: a
    directory for the packed panels of models of at least packed_cache_min_bytes of weights: the
    first start packs and writes them there (atomically), later starts map them instead of packing
    (no weight matrix is read until used). An unusable directory only costs the cache.
    expert_cache_bytes: a byte budget for routed experts paged from the packed file (None: all
    resident); it needs packed_cache (any model size), and the kernel says so when it is missing.
    packed_cache_budget: after the load, the packed_cache directory is trimmed (packed_cache.py): older
    versions of this model's file go, and other models' files, least recently used first, while the
    directory holds more than this many bytes (0: no cap; None: no trimming at all). page_tokens:
    the size of a state's page groups (0: the kernel's default)."""
    from cairn import _kernel

    md = path if isinstance(path, ModelDir) else open_model_dir(path)
    cache = ""
    paging = bool(expert_cache_bytes)
    big = sum(t.end - t.start for t in md.tensors.values()) >= packed_cache_min_bytes
    if packed_cache is not None and (big or paging):
        try:
            Path(packed_cache).mkdir(parents=True, exist_ok=True)
            cache = str(packed_cache_file(md, packed_cache, widen_bf16))
        except OSError:
            cache = ""
    maps = FileMaps()
    fam = families.by_name(md.family)
    config, weights = fam.kernel_inputs(md, maps) if fam.kernel_inputs is not None else (md.config, map_weights(md, maps))
    model = _kernel.Model(config, weights, md.fingerprint, threads, widen_bf16=widen_bf16,
                          packed_cache=cache, expert_cache_bytes=expert_cache_bytes or 0, page_tokens=page_tokens)
    # The kernel has packed (or mapped from the cache) every matrix and released their sources; what
    # it keeps in place (norms, biases, the BF16 embedding) pins its file's map: drop the pages packing
    # touched from the resident set (the maps of files no kept tensor uses close with `maps`).
    maps.drop_resident()
    if cache:
        from .packed_cache import trim_packed_cache

        try:
            os.utime(cache)  # its last use: trimming removes the least recently used files first
        except OSError:
            pass
        if packed_cache_budget is not None:
            trim_packed_cache(packed_cache, cache, packed_cache_budget)
    return model

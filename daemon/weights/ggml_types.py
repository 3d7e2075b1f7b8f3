"""The GGML block-quantized tensor types cairn takes from GGUF files (docs/model-format.md, "GGUF").

A tensor of one of these types goes to the kernel as its stored bytes, tag `GGML:<TYPE>` (for example
`GGML:Q4_K`), a uint8 array [rows..., row_bytes]: each row of the logical [rows..., in] matrix is
in / block blocks of `bytes` bytes, in ggml's layout (the kernel decodes them; nothing is widened here).

The list is the kernel's when it says which it decodes (`_kernel.codec_types()`: (name, ggml type id,
block, bytes per block) tuples), else QUANT_TYPES: one list, so the loader never accepts a type the
kernel would refuse, and a test keeps the two equal (tests/unit/test_gguf_quant.py).
"""

from __future__ import annotations

PREFIX = "GGML:"

# name, ggml type id (gguf.GGMLQuantizationType), values per block, bytes per block
# (gguf.constants.GGML_QUANT_SIZES)
QUANT_TYPES: tuple[tuple[str, int, int, int], ...] = (
    ("Q4_0", 2, 32, 18),
    ("Q4_1", 3, 32, 20),
    ("Q5_0", 6, 32, 22),
    ("Q5_1", 7, 32, 24),
    ("Q8_0", 8, 32, 34),
    ("Q2_K", 10, 256, 84),
    ("Q3_K", 11, 256, 110),
    ("Q4_K", 12, 256, 144),
    ("Q5_K", 13, 256, 176),
    ("Q6_K", 14, 256, 210),
    ("IQ2_XXS", 16, 256, 66),
    ("IQ2_XS", 17, 256, 74),
    ("IQ3_XXS", 18, 256, 98),
    ("IQ1_S", 19, 256, 50),
    ("IQ4_NL", 20, 32, 18),
    ("IQ3_S", 21, 256, 110),
    ("IQ2_S", 22, 256, 82),
    ("IQ4_XS", 23, 256, 136),
    ("IQ1_M", 29, 256, 56),
    ("MXFP4", 39, 32, 17),
)


def _kernel_types() -> tuple[tuple[str, int, int, int], ...] | None:
    try:
        from cairn import _kernel
    except ImportError:   # the extension is not built (a tool that only reads files)
        return None
    codec_types = getattr(_kernel, "codec_types", None)
    if codec_types is None:
        return None
    # block-quantized ones only: F32/F16/BF16 (block 1) load as the float types they are
    return tuple((str(n), int(t), int(b), int(s)) for n, t, b, s in codec_types() if b > 1)


SUPPORTED: dict[str, tuple[int, int, int]] = {n: (t, b, s) for n, t, b, s in (_kernel_types() or QUANT_TYPES)}


def tag(name: str) -> str:
    """GGML type name -> the dtype tag the kernel takes."""
    return PREFIX + name


def is_ggml(dtype_tag: str) -> bool:
    return dtype_tag.startswith(PREFIX)


def block_of(dtype_tag: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a `GGML:<TYPE>` tag."""
    _, block, nbytes = SUPPORTED[dtype_tag[len(PREFIX):]]
    return block, nbytes


def stored_shape(dtype_tag: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The uint8 array shape of a `GGML:<TYPE>` tensor of logical shape [rows..., in]: [rows..., row_bytes]
    (the caller has checked that `in` is a whole number of blocks)."""
    block, nbytes = block_of(dtype_tag)
    return (*shape[:-1], shape[-1] // block * nbytes)

"""How a Qwen3.5 kernel State's bytes grow with its tokens (docs/design/families.md §3; the interface
is memory_plan.StateCost's, which the memory plan, the capture guard and the disk budget call).

A fixed tail per Gated DeltaNet layer -- the conv rows `(K-1) x conv_dim` and the recurrent state
`nv x dk x dv` -- whatever the token count once n > 0; per full-attention layer one K and one V row of
`Hkv x Dh` floats a token, in page groups of `page_tokens`; plus the token ids and the last logits.
Speculation is off for the family (no verify journal: journal_bytes is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import FULL, LIN, conv_dim

PAGE_TOKENS = 64            # the family's default page group (families.md §3: 2.5 MiB at 35B-A3B)
BOOKKEEPING_PER_LAYER = 256  # a LayerState and its vectors' headers, as memory_plan's


@dataclass(frozen=True)
class Qwen35StateCost:
    layer_types: tuple[str, ...]
    conv_rows: int            # K - 1: the conv tail's rows (raw pre-conv rows, oldest first)
    conv_dim: int             # floats a conv row: q | k | v channels
    recurrent_floats: int     # nv x dk x dv
    kv_row_floats: int        # 2 x Hkv x Dh: one token's K and V rows in one attention layer
    vocab: int
    page_tokens: int = PAGE_TOKENS

    @classmethod
    def from_config(cls, cfg: dict, page_tokens: int = 0) -> "Qwen35StateCost":
        return cls(tuple(cfg["layer_types"]), cfg["linear_conv_kernel_dim"] - 1, conv_dim(cfg),
                   cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"],
                   2 * cfg["num_key_value_heads"] * cfg["head_dim"], cfg["vocab_size"],
                   page_tokens if page_tokens > 0 else PAGE_TOKENS)

    def _counts(self) -> tuple[int, int]:
        return self.layer_types.count(LIN), self.layer_types.count(FULL)

    def fixed_bytes(self) -> int:
        """The tail at full size: every GDN layer's K-1 conv rows and its recurrent state."""
        lin, _ = self._counts()
        return 4 * lin * (self.conv_rows * self.conv_dim + self.recurrent_floats)

    def bytes_at(self, n_tokens: int) -> int:
        """Bytes of a snapshot of n tokens: the tail (min(n, K-1) conv rows; the recurrent state once
        n > 0), the KV rows, the token ids and the last logits."""
        n = max(0, int(n_tokens))
        lin, full = self._counts()
        tail = lin * (min(n, self.conv_rows) * self.conv_dim + (self.recurrent_floats if n else 0))
        return 4 * (tail + full * n * self.kv_row_floats + n + self.vocab)

    def group_bytes(self) -> int:
        """Bytes of one page group (K and V rows of every attention layer for page_tokens tokens)."""
        _, full = self._counts()
        return 4 * full * self.page_tokens * self.kv_row_floats

    def snapshot_bytes_at(self, n_tokens: int) -> int:
        return self.bytes_at(n_tokens) + self.group_bytes() + BOOKKEEPING_PER_LAYER * len(self.layer_types)

    def resident_at(self, n_tokens: int) -> int:
        """A live state: its tail at full size from the first token, its rows, its last group whole."""
        n = max(0, int(n_tokens))
        _, full = self._counts()
        return (self.fixed_bytes() + 4 * (full * n * self.kv_row_floats + n + self.vocab) + self.group_bytes()
                + BOOKKEEPING_PER_LAYER * len(self.layer_types))

    def journal_bytes(self, n_tokens: int) -> int:
        return 0   # speculation is off for the family (families.md §3, phase 1)

    @property
    def per_token(self) -> int:
        """Bytes a token adds: its KV rows in every attention layer and its id."""
        _, full = self._counts()
        return 4 * (full * self.kv_row_floats + 1)

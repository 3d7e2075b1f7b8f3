"""The `cairn` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys


def _make_model(args: argparse.Namespace) -> int:
    from cairn.daemon.modelgen.make_model import PRESETS, make_model
    from cairn.daemon.modelgen.qwen35 import PRESETS as QWEN35_PRESETS

    if args.preset not in PRESETS and args.preset not in QWEN35_PRESETS:
        print(f"cairn make-model: unknown preset {args.preset!r}; choose from "
              f"{', '.join([*PRESETS, *QWEN35_PRESETS])}", file=sys.stderr)
        return 2
    try:
        out = make_model(args.preset, args.seed, args.out_dir, dtype=args.dtype,
                         shard_bytes=args.shard_mb * 1024 * 1024 if args.shard_mb else None,
                         official_names=None if args.names is None else args.names == "official",
                         layers=args.layers, first_layer=args.first_layer,
                         progress=lambda msg: print(msg, file=sys.stderr))
    except ValueError as e:  # e.g. flash-slice without --layers
        print(f"cairn make-model: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.preset} model (seed {args.seed}, {args.dtype}) to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cairn", description="Local serving daemon for DeepSeek-V4 agent workloads.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mk = sub.add_parser("make-model", help="write a deterministic random-weight model directory")
    mk.add_argument("--preset", default="tiny",
                    help="tiny (tests), small (benchmarks, demo), tiny-fp4 / tiny-fp8 (the official quantized format), "
                         "flash-slice (V4-Flash's dimensions and format, with --layers N), flash-shape (V4-Flash-0731's "
                         "structure at toy width: 43 layers, 256 experts, 48 shards with the drafter, ~70k tensors, "
                         "~40 MB: loader tests), flash-attn (V4-Flash's attention widths in fp32, small experts "
                         "and vocabulary: bench/depth.py), experts-fp4 (FP4, routed experts "
                         "~95 %% of the weights: paged-expert tests); Qwen3.5 (issue 43): "
                         "qwen35-tiny (dense, tied), qwen35moe-tiny, qwen35moe-tiny-cond (the release's "
                         "conditional-generation layout), qwen35moe-tiny-fused (3-D experts)")
    mk.add_argument("--names", choices=["official", "hf"], default=None,
                    help="tensor spelling: official DeepSeek (scales W.scale) or HF's (model.…, W.weight_scale_inv); "
                         "default official for quantized presets, hf otherwise")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "fp8"], default="float32",
                    help="fp8: Qwen3.5 presets only, the FP8 release's layout (e4m3fn codes, a BF16 scale per 128x128 "
                         "block in W_scale_inv, the release's BF16 modules)")
    mk.add_argument("--layers", type=int, default=None,
                    help="keep N layers of the preset, from --first-layer (required for flash-slice, V4-Flash's "
                         "real dimensions)")
    mk.add_argument("--first-layer", type=int, default=0, metavar="K",
                    help="the first layer kept (default 0): --first-layer 2 --layers 2 is V4-Flash's layers 2-3 "
                         "(CSA, HCA), renumbered 0-1; K + N <= the preset's layer count")
    mk.add_argument("--shard-mb", type=int, default=0, help="split the weights into shards of about this size")
    mk.add_argument("out_dir")
    mk.set_defaults(func=_make_model)

    for register in _subcommand_registrars():
        register(sub)
    return parser


def _subcommand_registrars():
    """Subcommands that live beside the code they drive: serve (service), chat/status/checkpoints (client)."""
    from cairn.daemon.cli import client
    from cairn.daemon.service import main as service

    return [service.register_cli, client.register_cli]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

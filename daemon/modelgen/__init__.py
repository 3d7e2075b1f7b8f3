"""Generated models for tests and benchmarks (`cairn make-model`): deterministic random-weight DeepSeek-V4
directories at tiny to V4-Flash widths, the official FP8/FP4 quantization in numpy, and V4-Flash
slices. Not on the serving path: the daemon never imports this room to serve."""

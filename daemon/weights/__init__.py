"""Model directories and their formats: the directory contract (config, tokenizer, shards, HF and
official names, FP8/FP4/BF16/fp32 layouts), the safetensors reader (one map per file, tensors as
views), and the weight digest behind the model fingerprint. Hands the kernel its immutable Model."""

"""cairn: a local serving daemon for DeepSeek-V4 agent workloads."""

__version__ = "0.1.0"

"""The daemon's Python side, one room per job: `api` (HTTP and its schemas), `protocol` (DeepSeek-V4's
chat encoding, output parser, grammar), `weights` (model directories and their formats), `service`
(settings, systemd, sockets, logs, metrics, the memory plan, `cairn serve`), `cli` (the `cairn`
command and its client), and `modelgen` (generated test and bench models, off the serving path)."""

"""The `cairn` command: one entry point with a subcommand per job, and the operator client (`cairn
chat`, `cairn status`, `cairn checkpoints`) that talks to a running daemon over its Unix socket."""

"""The daemon as a local service: `cairn serve` (trio.run, signals, the nursery that wires the actors
and the server), settings from flags / CAIRN_* / TOML, systemd (notify, watchdog, socket activation),
socket-directory trust, structured logs, Prometheus metrics, and the memory plan that sizes slots,
paged experts and checkpoint memory from the machine's limit."""

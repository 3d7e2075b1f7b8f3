"""configure_logging: JSON lines with request context, level filtering."""

from __future__ import annotations

import json

import structlog

from cairn.daemon.service.logs import bind_request, configure_logging, get_logger


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_json_lines_carry_request_context_and_iso_timestamps(capsys):
    configure_logging(json=True, level="info")
    try:
        log = get_logger("cairn.test")
        with bind_request(request_id="r1", session="s"):
            log.info("prefill_done", tokens=300)
        log.info("after")
        log.debug("hidden")
        first, second = _lines(capsys)
    finally:
        structlog.reset_defaults()
    assert first["event"] == "prefill_done" and first["tokens"] == 300
    assert (first["request_id"], first["session"], first["level"], first["logger"]) == ("r1", "s", "info", "cairn.test")
    assert first["timestamp"].endswith("Z") and "T" in first["timestamp"]
    assert second["event"] == "after" and "request_id" not in second


def test_level_filter(capsys):
    configure_logging(json=True, level="warning")
    try:
        get_logger().info("no")
        get_logger().warning("yes")
        assert [e["event"] for e in _lines(capsys)] == ["yes"]
    finally:
        structlog.reset_defaults()

"""actors/checkpoints/write_backoff.py: when the disk tier tries a write again after a failure."""

from cairn.actors.checkpoints.write_backoff import WriteBackoff


def test_the_pause_doubles_from_one_second_to_five_minutes_and_a_success_ends_it():
    b = WriteBackoff()
    assert b.allows(0.0) and not b.paused
    assert b.failed(10.0) is True                 # the pause starts: the caller logs this one
    assert not b.allows(10.5) and b.allows(11.0)
    delays = []
    now = 11.0
    for _ in range(12):
        assert b.failed(now) is False             # a failed retry: no new log line
        delays.append(b.delay_s)
        now = b.retry_at
    assert delays[:9] == [2, 4, 8, 16, 32, 64, 128, 256, 300] and set(delays[9:]) == {300}
    assert b.succeeded() is True and b.allows(now) and not b.paused
    assert b.succeeded() is False                 # nothing to end: no log line

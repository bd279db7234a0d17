"""close() ends the subscription at once, whichever way it is read: nothing more is handed out,
as the Rust client's close() says. The event iterator, next_event() and batches() (an iterator
made before the close or after it) all end as at the end of a stream, with StopIteration."""

from __future__ import annotations

import pytest

import mdrelay
from conftest import tcp_publisher


def test_close_ends_iteration_next_event_and_batches_at_once(publishers) -> None:
    # A whole day paced at the capture's speed: far more than the test reads before it closes.
    publisher = tcp_publisher(publishers, "DEEP10", "sbe", ["--pacing", "original"])
    sub = mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30)
    batches = sub.batches(max_messages=100, timeout=5.0)
    message_type, batch = next(batches)
    assert isinstance(message_type, str) and batch.num_rows > 0
    # Messages of other types are collected and not handed out yet; and events wait.
    assert sub.next_event(timeout=5) is not None
    sub.close()
    left = list(batches)
    assert left == [], f"{len(left)} batches after close()"
    assert list(sub.batches()) == [], "a batches() iterator made after close()"
    with pytest.raises(StopIteration):
        sub.next_event(timeout=1)
    with pytest.raises(StopIteration):
        sub.next_event()
    with pytest.raises(StopIteration):
        next(sub)
    assert sub.counters()["frames"] > 0, "what was counted stays readable"

"""Many subscribers in one process, each on a thread of its own: the GIL is released while
they wait, and each receives the whole stream."""

from __future__ import annotations

import threading
import time

import mdrelay
from conftest import Aggregates, expected, tcp_publisher

SUBSCRIBERS = 4


def test_subscribers_on_threads_each_receive_everything(publishers) -> None:
    publisher = tcp_publisher(publishers, "TOPS16", "sbe", ["--wait-subscribers", str(SUBSCRIBERS)])
    address = publisher.tcp_address()
    results = [None] * SUBSCRIBERS
    errors = []

    def receive(i: int) -> None:
        try:
            agg = Aggregates()
            with mdrelay.Subscriber(tcp=address, idle_timeout=30) as sub:
                if i % 2:
                    agg.batches(sub.batches(timeout=0.2))
                else:
                    for event in sub:
                        agg.event(event)
            results[i] = agg
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(SUBSCRIBERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a subscriber did not finish"
    assert not errors, errors
    assert publisher.finish() == 0
    for i, agg in enumerate(results):
        agg.assert_reference(expected("TOPS16"), f"subscriber {i} of {SUBSCRIBERS}")
    assert time.monotonic() - started < 120

"""DEEP10 and TOPS16 over TCP in every wire format: the aggregates computed here, from the
typed events and from the Arrow batches, equal the reference outputs."""

from __future__ import annotations

import time

import pytest

import mdrelay
from conftest import FORMATS, RUN, Aggregates, expected, tcp_publisher

CAPTURES = ["DEEP10", "TOPS16"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", CAPTURES)
def test_events_equal_the_reference(publishers, name: str, fmt: str) -> None:
    publisher = tcp_publisher(publishers, name, fmt)
    agg = Aggregates()
    end = None
    started = time.monotonic()
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        for event in sub:
            assert time.monotonic() - started < RUN, "no end of stream in time"
            if isinstance(event, mdrelay.End):
                end = event
            else:
                agg.event(event)
        counters = sub.counters()
    assert publisher.finish() == 0, publisher.text()
    assert end is not None and end.complete, end
    assert counters["matches_publisher"], counters
    assert counters["lost"] == 0 and counters["decode_errors"] == 0, counters
    agg.assert_reference(expected(name), f"{name} in {fmt}, events")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", CAPTURES)
def test_arrow_batches_equal_the_reference(publishers, name: str, fmt: str) -> None:
    publisher = tcp_publisher(publishers, name, fmt)
    agg = Aggregates()
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        agg.batches(sub.batches(max_messages=50_000, timeout=0.5))
        totals = sub.counters()["publisher_totals"]
    assert publisher.finish() == 0, publisher.text()
    assert totals is not None and totals["messages"] == expected(name)["messages"]
    agg.assert_reference(expected(name), f"{name} in {fmt}, Arrow batches")


@pytest.mark.parametrize("name", CAPTURES)
def test_a_capture_read_into_batches_equals_the_reference(name: str) -> None:
    from conftest import capture

    agg = Aggregates()
    batches = mdrelay.read_capture(capture(name), max_messages=20_000)
    agg.batches(batches)
    stats = batches.stats()
    assert stats["messages"] == expected(name)["messages"], stats
    agg.assert_reference(expected(name), f"{name} read from the capture")


def test_batches_convert_to_polars_and_pandas_without_a_loop(publishers) -> None:
    import polars as pl
    import pyarrow as pa

    publisher = tcp_publisher(publishers, "TOPS16", "sbe")
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        trades = [b for label, b in sub.batches(timeout=0.2) if label == "trade"]
    publisher.finish()
    frame = pl.from_arrow(pa.Table.from_batches(trades))
    assert frame.height == expected("TOPS16")["message_types"]["T"]
    assert frame["size"].sum() == expected("TOPS16")["total_trade_volume"]
    assert str(frame.schema["timestamp"]).startswith("Datetime")

"""Books in Python: a symbol's book as a small object and every symbol's levels as one Arrow
batch, equal to the independent reference reader's books (iexbook.py's expected/DEEP10.book.json),
for a subscriber that took the whole day and for one that joined mid-stream with a snapshot."""

from __future__ import annotations

import time
from typing import List, Tuple

import pyarrow
import pytest

import mdrelay
from conftest import RUN, expected, tcp_publisher


def reference_rows(books: dict) -> List[Tuple[str, str, int, int]]:
    """The reference's levels as (symbol, side, price, size) rows, in the order books() gives."""
    rows = []
    for symbol in sorted(books["symbols"]):
        state = books["symbols"][symbol]
        rows += [(symbol, "buy", p, q) for p, q in state["bids"]]
        rows += [(symbol, "sell", p, q) for p, q in state["asks"]]
    return rows


def assert_books_equal_the_reference(sub: mdrelay.Subscriber, books: dict) -> None:
    batch = sub.books()
    assert isinstance(batch, pyarrow.RecordBatch)
    assert batch.schema.names == ["symbol", "side", "price", "size"]
    got = list(zip(*(batch.column(name).to_pylist() for name in batch.schema.names)))
    assert got == reference_rows(books)
    for symbol, state in books["symbols"].items():
        book = sub.book(symbol)
        assert book is not None, symbol
        assert book.symbol == symbol
        assert [list(level) for level in book.bids] == state["bids"], symbol
        assert [list(level) for level in book.asks] == state["asks"], symbol
        assert book.consistent == state.get("book_consistent"), symbol
        assert book.trading_status == state.get("trading_status"), symbol
        assert book.operational_halt == state.get("operational_halt"), symbol
        short_sale = state.get("short_sale_test")
        assert book.short_sale_test == (None if short_sale is None else bool(short_sale)), symbol
        last = state.get("last_trade")
        assert book.last_trade == (None if last is None else tuple(last)), symbol


def run_to_end(sub: mdrelay.Subscriber) -> List[object]:
    """Every event but the messages, to the end."""
    events = [e for e in sub if isinstance(e, (mdrelay.Snapshot, mdrelay.End))]
    assert isinstance(events[-1], mdrelay.End) and events[-1].complete, events[-1]
    return events


def test_a_whole_days_books_equal_the_reference(publishers) -> None:
    pub = tcp_publisher(publishers, "DEEP10", "sbe")
    with mdrelay.Subscriber(tcp=pub.tcp_address(), idle_timeout=RUN, books=True) as sub:
        assert sub.book("AA") is None, "no state before any message"
        run_to_end(sub)
        assert_books_equal_the_reference(sub, expected("DEEP10.book"))
        assert sub.book("NOPE") is None
    assert pub.finish() == 0


def test_books_are_kept_only_when_asked_for(publishers) -> None:
    pub = tcp_publisher(publishers, "DEEP10", "sbe")
    with mdrelay.Subscriber(tcp=pub.tcp_address(), idle_timeout=RUN) as sub:
        rows = sum(batch.num_rows for _, batch in sub.batches())
        assert rows == expected("DEEP10")["messages"], "the stream itself is whole"
        for ask in (lambda: sub.book("AA"), sub.books):
            with pytest.raises(mdrelay.ConfigError) as error:
                ask()
            assert error.value.setting == "books", error.value
            assert "books=True" in str(error.value), error.value
    assert pub.finish() == 0


def test_a_late_joiner_with_a_snapshot_has_the_days_books(publishers) -> None:
    # Paced, and started with no subscriber: the stream is under way (for about 2 s) when the
    # subscriber connects and asks for the snapshot.
    extra = ["--pacing", "rate", "--rate", "200000", "--wait-subscribers", "0"]
    pub = tcp_publisher(publishers, "DEEP10", "flatbuffers", extra)
    address = pub.tcp_address()
    time.sleep(0.3)
    with mdrelay.Subscriber(tcp=address, snapshot=True, idle_timeout=RUN) as late:
        events = run_to_end(late)
        snapshot = events[0]
        assert isinstance(snapshot, mdrelay.Snapshot), events
        assert snapshot.as_of > 1 and snapshot.messages > 0 and snapshot.symbols > 0, snapshot
        assert_books_equal_the_reference(late, expected("DEEP10.book"))
    assert pub.finish() == 0


def test_snapshot_needs_a_recovery_service_over_udp_and_is_not_beside_from_start() -> None:
    for settings in ({"udp": "127.0.0.1:0"}, {"tcp": "127.0.0.1:1", "from_start": True}):
        try:
            mdrelay.Subscriber(snapshot=True, **settings)
        except mdrelay.ConfigError as error:
            assert "snapshot" in str(error), error
        else:
            raise AssertionError(f"{settings}: accepted")

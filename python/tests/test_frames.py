"""Prices as exact decimals (or floats, or IEX's integers) and DataFrames of batches: the
aggregates computed here with pyarrow, polars and pandas on the columns `prices=` chose equal
the reference outputs, whose prices the independent reader in ../shared gives in 1/10,000
dollars; the frames' columns have the types the README promises."""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import pytest

import mdrelay
from conftest import RUN, Aggregates, capture, expected, tcp_publisher

PRICES = ["decimal", "float", "integer"]
#: Every price column of every message type.
PRICE_COLUMNS = {
    "trade": ["price"],
    "trade_break": ["price"],
    "price_level_update": ["price"],
    "quote_update": ["bid_price", "ask_price"],
    "security_directory": ["adjusted_poc_price"],
    "official_price": ["price"],
    "auction_information": [
        "reference_price", "indicative_clearing_price", "auction_book_clearing_price",
        "collar_reference_price", "lower_auction_collar", "upper_auction_collar",
    ],
}


def price_type(prices: str):
    """The Arrow type the README gives for a `prices=` choice."""
    import pyarrow as pa

    return {"decimal": pa.decimal128(18, 4), "float": pa.float64(), "integer": pa.int64()}[prices]


def polars_aggregates(frames: dict) -> Aggregates:
    """The reference's figures, computed with polars on DataFrames by message type."""
    import polars as pl

    agg = Aggregates()
    agg.count_types(frames, lambda df: df.filter(pl.col("side") == "buy").height, lambda df: df.height)
    if "trade" in frames:
        g = frames["trade"].group_by("symbol").agg(
            pl.col("size").sum().alias("volume"), pl.len().alias("count"),
            pl.col("price").max().alias("high"), pl.col("price").min().alias("low"),
        )
        for row in g.iter_rows(named=True):
            agg.trade(row["symbol"], row["volume"], row["count"], row["high"], row["low"])
    if "trade_break" in frames:
        for row in frames["trade_break"].group_by("symbol").len().iter_rows(named=True):
            agg.broken(row["symbol"], row["len"])
    if "price_level_update" in frames:
        g = frames["price_level_update"].group_by("symbol", "side").agg(
            pl.col("price").max().alias("high"), pl.col("price").min().alias("low")
        )
        for row in g.iter_rows(named=True):
            agg.side(row["symbol"], "bid" if row["side"] == "buy" else "ask", row["high"], row["low"])
    if "quote_update" in frames:
        q = frames["quote_update"]
        for side in ("bid", "ask"):
            g = q.filter(pl.col(side + "_size") > 0).group_by("symbol").agg(
                pl.col(side + "_price").max().alias("high"), pl.col(side + "_price").min().alias("low")
            )
            for row in g.iter_rows(named=True):
                agg.side(row["symbol"], side, row["high"], row["low"])
    return agg


def pandas_aggregates(frames: dict) -> Aggregates:
    """The reference's figures, computed with pandas on DataFrames by message type."""
    agg = Aggregates()
    agg.count_types(frames, lambda df: int((df["side"] == "buy").sum()))
    if "trade" in frames:
        g = frames["trade"].groupby("symbol", observed=True).agg(
            volume=("size", "sum"), count=("size", "count"), high=("price", "max"), low=("price", "min")
        )
        for symbol, row in g.iterrows():
            agg.trade(str(symbol), int(row["volume"]), int(row["count"]), plain(row["high"]), plain(row["low"]))
    if "trade_break" in frames:
        for symbol, count in frames["trade_break"].groupby("symbol", observed=True).size().items():
            agg.broken(str(symbol), int(count))
    if "price_level_update" in frames:
        g = frames["price_level_update"].groupby(["symbol", "side"], observed=True)["price"].agg(["max", "min"])
        for (symbol, side), row in g.iterrows():
            agg.side(str(symbol), "bid" if side == "buy" else "ask", plain(row["max"]), plain(row["min"]))
    if "quote_update" in frames:
        q = frames["quote_update"]
        for side in ("bid", "ask"):
            g = q[q[side + "_size"] > 0].groupby("symbol", observed=True)[side + "_price"].agg(["max", "min"])
            for symbol, row in g.iterrows():
                agg.side(str(symbol), side, plain(row["max"]), plain(row["min"]))
    return agg


def plain(value: object) -> object:
    """A pandas scalar as a Python number (numpy's float64 and int64 as float and int)."""
    if isinstance(value, Decimal):
        return value
    item = getattr(value, "item", None)
    return item() if item else value


@pytest.mark.parametrize("prices", PRICES)
@pytest.mark.parametrize("name", ["DEEP10", "TOPS16"])
def test_capture_prices_of_each_type_equal_the_reference_through_pyarrow(name: str, prices: str) -> None:
    batches = mdrelay.read_capture(capture(name), max_messages=50_000, prices=prices)
    assert batches.prices == prices
    pairs = list(batches)
    for label, batch in pairs:
        for column in PRICE_COLUMNS.get(label, []):
            assert batch.schema.field(column).type == price_type(prices), (label, column)
            assert batch.column(column).null_count == 0, (label, column)
        assert batch.schema == mdrelay.schema(label, prices), label
    agg = Aggregates()
    agg.batches(pairs)
    agg.assert_reference(expected(name), f"{name} read with prices={prices}, pyarrow")


@pytest.mark.parametrize("name", ["DEEP10", "TOPS16"])
def test_decimal_prices_equal_the_reference_through_polars(name: str) -> None:
    import polars as pl

    frames = mdrelay.read_capture(capture(name)).to_polars()
    assert set(frames) <= set(mdrelay.MESSAGE_TYPES) and frames
    for label, df in frames.items():
        assert isinstance(df, pl.DataFrame), type(df)
        assert df.schema["timestamp"] == pl.Datetime("ns", "UTC"), label
        for column in PRICE_COLUMNS.get(label, []):
            assert df.schema[column] == pl.Decimal(18, 4), (label, column)
        if "symbol" in df.columns:
            assert df.schema["symbol"] == pl.String, label
    polars_aggregates(frames).assert_reference(expected(name), f"{name}, polars on decimal prices")


@pytest.mark.parametrize("prices", ["decimal", "float"])
def test_a_live_stream_to_pandas_equals_the_reference(publishers, prices: str) -> None:
    import pandas as pd

    publisher = tcp_publisher(publishers, "TOPS16", "sbe")
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        frames = sub.batches(max_messages=20_000, timeout=0.5, prices=prices).to_pandas()
        totals = sub.counters()["publisher_totals"]
    assert publisher.finish() == 0, publisher.text()
    assert totals is not None and totals["messages"] == expected("TOPS16")["messages"]
    price_dtype = pd.ArrowDtype(price_type("decimal")) if prices == "decimal" else "float64"
    for label, df in frames.items():
        assert isinstance(df, pd.DataFrame), type(df)
        assert str(df["timestamp"].dtype) == "datetime64[ns, UTC]", label
        for column in PRICE_COLUMNS.get(label, []):
            assert df[column].dtype == price_dtype, (label, column, df[column].dtype)
        if "symbol" in df.columns:
            assert isinstance(df["symbol"].dtype, pd.CategoricalDtype), label
    pandas_aggregates(frames).assert_reference(expected("TOPS16"), f"TOPS16 live, pandas on {prices} prices")


def test_one_message_type_makes_one_frame_with_the_types_schema_even_when_empty() -> None:
    import pandas as pd
    import polars as pl

    reference = expected("DEEP10")
    trades = mdrelay.read_capture(capture("DEEP10"), prices="integer").to_polars("trade")
    assert trades.height == reference["message_types"]["T"]
    assert trades["size"].sum() == reference["total_trade_volume"]
    assert trades.schema["price"] == pl.Int64
    # DEEP10 carries no auction information: an empty frame with the type's columns.
    schema = mdrelay.schema("auction_information")
    for empty in (
        mdrelay.read_capture(capture("DEEP10")).to_polars("auction_information"),
        mdrelay.read_capture(capture("DEEP10")).to_pandas("auction_information"),
    ):
        assert len(empty) == 0 and list(empty.columns) == schema.names
    assert isinstance(mdrelay.read_capture(capture("DEEP10")).to_pandas("system_event"), pd.DataFrame)
    with pytest.raises(mdrelay.ConfigError) as e:
        mdrelay.read_capture(capture("DEEP10")).to_polars("trades")
    assert e.value.setting == "message_type"


def test_an_unknown_prices_choice_is_a_configuration_error(publishers) -> None:
    with pytest.raises(mdrelay.ConfigError) as e:
        mdrelay.read_capture(capture("TOPS16"), prices="cents")
    assert e.value.setting == "prices" and "decimal" in e.value.message
    with pytest.raises(mdrelay.ConfigError):
        mdrelay.schema("trade", prices="cents")
    publisher = tcp_publisher(publishers, "TOPS16", "sbe")
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        with pytest.raises(mdrelay.ConfigError) as e:
            sub.batches(prices="double")
        assert e.value.setting == "prices"


def test_seconds_bounds_a_live_collection_and_the_rest_still_comes(publishers) -> None:
    # DEEP10 at 5,000 messages a second lasts minutes, and sends from the start (paced as
    # recorded, its first seconds may bring nothing).
    publisher = tcp_publisher(publishers, "DEEP10", "sbe", ["--pacing", "rate", "--rate", "5000"])
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=30) as sub:
        batches = sub.batches(max_messages=1_000, timeout=0.2)
        started = time.monotonic()
        first = batches.to_polars(seconds=2.0)
        took = time.monotonic() - started
        assert took < 20, f"to_polars(seconds=2.0) took {took:.1f} s"
        assert sum(df.height for df in first.values()) > 0, first
        # What came after is still handed out by the same iterator.
        later = batches.next_batch(timeout=RUN)
        assert later is not None and later[1].num_rows > 0


def write_pcap(path: Path, messages: list) -> None:
    """A pcap of one Ethernet/IPv4/UDP packet carrying a TOPS 1.6 segment of `messages`
    (../shared/data/iex/README.md gives the layouts)."""
    blocks = b"".join(struct.pack("<H", len(m)) + m for m in messages)
    segment = struct.pack("<BBHIIHHqqq", 1, 0, 0x8003, 1, 1, len(blocks), len(messages), 0, 1, 0) + blocks
    udp = struct.pack("!HHHH", 10000, 10000, 8 + len(segment), 0) + segment
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, bytes([10, 0, 0, 1]), bytes([233, 215, 21, 1])) + udp
    frame = b"\x01\x00\x5e\x57\x15\x01" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    record = struct.pack("<IIII", 0, 0, len(frame), len(frame))
    path.write_bytes(header + record + frame)


def trade(symbol: bytes, size: int, price: int, trade_id: int) -> bytes:
    """A trade report (T), 38 bytes."""
    return struct.pack("<BBq8sIqq", ord("T"), 0, 1_493_132_621_826_542_542, symbol.ljust(8), size, price, trade_id)


def test_a_price_beyond_eighteen_digits_is_null_in_a_decimal_column_and_kept_elsewhere() -> None:
    huge = 2**63 - 1
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hostile.pcap"
        write_pcap(path, [trade(b"AAPL", 100, 1_490_000, 1), trade(b"ZVZZT", 5, huge, 2), trade(b"MSFT", 7, 650_000, 3)])
        decimal = mdrelay.read_capture(path).to_polars("trade")
        integer = mdrelay.read_capture(path, prices="integer").to_polars("trade")
    assert decimal["symbol"].to_list() == ["AAPL", "ZVZZT", "MSFT"]
    assert decimal["price"].to_list() == [Decimal("149.0000"), None, Decimal("65.0000")]
    assert integer["price"].to_list() == [1_490_000, huge, 650_000]


@pytest.mark.parametrize("module, method", [("pandas", "to_pandas"), ("polars", "to_polars")])
def test_a_missing_dataframe_library_is_named_with_how_to_install_it(module: str, method: str) -> None:
    # The library made unimportable in a fresh interpreter, as on a machine without it.
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "import mdrelay\n"
        f"try:\n    mdrelay.read_capture({capture('TOPS16')!r}).{method}('trade')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN)
    assert run.returncode == 0, run.stderr
    assert f"{method}() needs {module}" in run.stdout and f"pip install {module}" in run.stdout, run.stdout

"""What the tests share: real mdrelay-pub processes on loopback, the reference outputs in
../shared, and per-symbol aggregates computed here from the rules in
../shared/data/iex/README.md (never from the code under test)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

import pytest

#: The project root: python/tests/conftest.py is two folders below it.
PROJECT = Path(__file__).resolve().parents[2]
#: The shared captures and reference outputs, beside the project root.
IEX = PROJECT.parent / "shared" / "data" / "iex"
#: The longest a stream may take before a test fails (seconds; a few when all is well).
RUN = 120.0
#: The eight wire formats.
FORMATS = ["raw", "sbe", "flatbuffers", "capnp", "capnp-packed", "protobuf", "brec", "json"]


def publisher_bin() -> str:
    """The mdrelay-pub binary: $MDRELAY_PUB (.ci/python.sh sets it), else the quick build."""
    path = os.environ.get("MDRELAY_PUB", str(PROJECT / "target" / "quick" / "mdrelay-pub"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"no mdrelay-pub at {path}: build it with cargo build --profile quick -p mdrelay-publisher")
    return path


def capture(name: str) -> str:
    """A capture in ../shared."""
    return str(IEX / f"{name}.pcap.gz")


def expected(name: str) -> dict:
    """A reference output in ../shared."""
    return json.loads((IEX / "expected" / f"{name}.json").read_text())


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port free now (bound, then closed)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Publisher:
    """An mdrelay-pub process; its log goes to a temporary file, read for its address."""

    def __init__(self, args: List[str]):
        self.log = tempfile.NamedTemporaryFile(prefix="mdrelay-pub-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [publisher_bin(), "run", *args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        """Its output so far."""
        return Path(self.log.name).read_text(errors="replace")

    def wait_for(self, pattern: str, limit: float = 30.0) -> re.Match:
        """The first match of `pattern` in its output, waiting up to `limit` seconds."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {pattern!r} from mdrelay-pub (exit {self.proc.poll()}):\n{self.text()}")

    def tcp_address(self) -> str:
        """Where it serves subscribers over TCP, from its log."""
        return self.wait_for(r"serving subscribers over TCP listen=(\S+)").group(1)

    def finish(self, limit: float = RUN) -> int:
        """Waits for its exit (killing it after `limit` seconds) and returns the status."""
        try:
            return self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"mdrelay-pub did not exit within {limit} s:\n{self.text()}")

    def kill(self) -> None:
        """Ends it if it still runs, and removes its log."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture
def publishers():
    """Starts publishers (`publishers(args)`) and kills whatever still runs after the test."""
    started: List[Publisher] = []

    def start(args: List[str]) -> Publisher:
        p = Publisher(args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def tcp_publisher(start, name: str, fmt: str, extra: Optional[List[str]] = None) -> Publisher:
    """A publisher replaying capture `name` in `fmt` over TCP on a port of its choosing, losslessly,
    once one subscriber (or `--wait-subscribers` in `extra`) has connected."""
    args = ["--capture", capture(name), "--format", fmt, "--tcp", "127.0.0.1:0", "--slow-subscriber", "block"]
    if not extra or "--wait-subscribers" not in extra:
        args += ["--wait-subscribers", "1"]
    return start(args + (extra or []))


# The IEX type character of each event class, as the reference counts messages.
TYPE_OF_CLASS = {
    "SystemEvent": "S",
    "SecurityDirectory": "D",
    "TradingStatus": "H",
    "RetailLiquidityIndicator": "I",
    "OperationalHaltStatus": "O",
    "ShortSalePriceTestStatus": "P",
    "SecurityEvent": "E",
    "QuoteUpdate": "Q",
    "Trade": "T",
    "TradeBreak": "B",
    "OfficialPrice": "X",
    "AuctionInformation": "A",
}

# The IEX type character of each message type label (Arrow batches and DataFrames).
TYPE_OF_LABEL = {
    "trade": "T", "trade_break": "B", "quote_update": "Q", "system_event": "S",
    "security_directory": "D", "trading_status": "H", "retail_liquidity_indicator": "I",
    "operational_halt_status": "O", "short_sale_price_test_status": "P",
    "security_event": "E", "official_price": "X", "auction_information": "A",
}


def ticks(price: object) -> int:
    """A price as the reference gives it, in 1/10,000 dollars, from any of the Arrow price types:
    an integer as it is, a decimal only when exactly a whole number of ticks, a float only when
    it is the double nearest a whole number of ticks."""
    if isinstance(price, Decimal):
        scaled = price.scaleb(4)
        assert scaled == scaled.to_integral_value(), f"{price} is not a whole number of 1/10,000 dollars"
        return int(scaled)
    if isinstance(price, float):
        whole = round(price * 10_000)
        assert price == whole / 10_000, f"{price!r} is not the double nearest {whole} / 10,000"
        return whole
    assert isinstance(price, int), type(price)
    return price


class Aggregates:
    """Per-symbol figures by the reference's rules, and messages by type."""

    def __init__(self) -> None:
        self.symbols: Dict[str, dict] = {}
        self.types: Counter = Counter()

    def _fig(self, symbol: str) -> dict:
        f = self.symbols.get(symbol)
        if f is None:
            f = self.symbols[symbol] = {
                "trade_volume": 0, "trades": 0, "broken_trades": 0,
                "trade_high": None, "trade_low": None, "bid_high": None,
                "bid_low": None, "ask_high": None, "ask_low": None,
            }
        return f

    def _extend(self, f: dict, side: str, high: object, low: object) -> None:
        high, low = ticks(high), ticks(low)
        h, lo = f[side + "_high"], f[side + "_low"]
        f[side + "_high"] = high if h is None else max(h, high)
        f[side + "_low"] = low if lo is None else min(lo, low)

    def trade(self, symbol: str, volume: int, count: int, high: int, low: int) -> None:
        """Adds `count` trade reports."""
        f = self._fig(symbol)
        f["trade_volume"] += volume
        f["trades"] += count
        self._extend(f, "trade", high, low)

    def broken(self, symbol: str, count: int) -> None:
        """Adds trade breaks."""
        self._fig(symbol)["broken_trades"] += count

    def side(self, symbol: str, side: str, high: int, low: int) -> None:
        """Adds bid or ask prices (`side` "bid" or "ask")."""
        self._extend(self._fig(symbol), side, high, low)

    def event(self, e: object) -> None:
        """Adds one message event (others are ignored)."""
        name = type(e).__name__
        if name == "PriceLevelUpdate":
            self.types["8" if e.side == "buy" else "5"] += 1
            self.side(e.symbol, "bid" if e.side == "buy" else "ask", e.price, e.price)
            return
        t = TYPE_OF_CLASS.get(name)
        if t is None:
            return
        self.types[t] += 1
        if t == "T":
            self.trade(e.symbol, e.size, 1, e.price, e.price)
        elif t == "B":
            self.broken(e.symbol, 1)
        elif t == "Q":
            if e.bid_size > 0:
                self.side(e.symbol, "bid", e.bid_price, e.bid_price)
            if e.ask_size > 0:
                self.side(e.symbol, "ask", e.ask_price, e.ask_price)

    def count_types(self, frames: dict, buys: Callable, rows: Callable = len) -> None:
        """Counts the rows of `frames` (tables by message type label) by IEX type character, a
        price level update's by side: `rows(frame)` of a frame, `buys(frame)` of them on the buy side."""
        for label, frame in frames.items():
            if label == "price_level_update":
                bought = buys(frame)
                self.types["8"] += bought
                self.types["5"] += rows(frame) - bought
            else:
                self.types[TYPE_OF_LABEL[label]] += rows(frame)

    def batches(self, pairs: Iterable) -> None:
        """Adds `(message_type, pyarrow.RecordBatch)` pairs, computing with pyarrow's kernels."""
        import pyarrow as pa
        import pyarrow.compute as pc

        by_label: Dict[str, list] = {}
        for label, batch in pairs:
            assert isinstance(batch, pa.RecordBatch), type(batch)
            by_label.setdefault(label, []).append(batch)
        tables = {k: pa.Table.from_batches(v) for k, v in by_label.items()}
        self.count_types(
            tables, lambda t: int(pc.sum(pc.equal(t["side"], "buy")).as_py() or 0), lambda t: t.num_rows
        )
        if "trade" in tables:
            g = tables["trade"].group_by("symbol").aggregate(
                [("size", "sum"), ("size", "count"), ("price", "max"), ("price", "min")]
            )
            for row in g.to_pylist():
                self.trade(row["symbol"], row["size_sum"], row["size_count"], row["price_max"], row["price_min"])
        if "trade_break" in tables:
            for row in tables["trade_break"].group_by("symbol").aggregate([("size", "count")]).to_pylist():
                self.broken(row["symbol"], row["size_count"])
        if "price_level_update" in tables:
            g = tables["price_level_update"].group_by(["symbol", "side"]).aggregate(
                [("price", "max"), ("price", "min")]
            )
            for row in g.to_pylist():
                self.side(row["symbol"], "bid" if row["side"] == "buy" else "ask", row["price_max"], row["price_min"])
        if "quote_update" in tables:
            q = tables["quote_update"]
            for side in ("bid", "ask"):
                t = q.filter(pc.greater(q[side + "_size"], 0))
                if t.num_rows:
                    g = t.group_by("symbol").aggregate([(side + "_price", "max"), (side + "_price", "min")])
                    for row in g.to_pylist():
                        self.side(row["symbol"], side, row[side + "_price_max"], row[side + "_price_min"])

    def assert_reference(self, reference: dict, context: str) -> None:
        """The messages by type, every listed symbol's figures and the total volume equal the
        reference's (as the Rust harness's assert_aggregates compares them)."""
        assert sum(self.types.values()) == reference["messages"], f"{context}: messages"
        assert dict(self.types) == reference["message_types"], f"{context}: message types"
        listed = {
            s: f for s, f in sorted(self.symbols.items())
            if f["trades"] or f["bid_high"] is not None or f["ask_high"] is not None
        }
        if listed != reference["symbols"]:
            differ = [
                f"{s}: {listed.get(s)} against the reference's {reference['symbols'].get(s)}"
                for s in sorted(set(listed) | set(reference["symbols"]))
                if listed.get(s) != reference["symbols"].get(s)
            ][:5]
            raise AssertionError(f"{context}: symbols differ: {differ}")
        assert len(listed) == reference["symbols_with_trades_or_quotes"], context
        volume = sum(f["trade_volume"] for f in listed.values())
        assert volume == reference["total_trade_volume"], f"{context}: volume"

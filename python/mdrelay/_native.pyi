"""Type stubs of the native module (re-exported by ``mdrelay``)."""

from os import PathLike
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Optional, Tuple, Union, overload

import pyarrow

if TYPE_CHECKING:
    import pandas
    import polars

Prices = Literal["decimal", "float", "integer"]
"""The Arrow type of price columns: `decimal128(18, 4)` dollars (exact), `float64` dollars (the
nearest double) or `int64` in 1/10,000 dollars (as IEX sends them)."""

#: The message type names batches carry.
MESSAGE_TYPES: List[str]

class Error(Exception):
    """Base class of every error this package raises."""

    kind: str
    """The kind of error, in snake case (`wrong_key`, `config`, ...)."""
    message: str
    """What went wrong, naming the peer, address or setting."""
    setting: Optional[str]
    """The setting a configuration error is about."""

class WrongKeyError(Error):
    """The publisher encrypts with another key."""

class ProtectionMismatchError(Error):
    """The publisher protects its frames otherwise."""

class VersionError(Error):
    """The publisher speaks a protocol version this library does not."""

class RefusedError(Error):
    """The publisher refused the subscription."""

class NotAPublisherError(Error):
    """The peer is not an mdrelay publisher."""

class UnreachableError(Error):
    """The publisher could not be reached."""

class AddrInUseError(Error):
    """Another socket holds the local address."""

class BindError(Error):
    """A local address could not be bound or a group joined."""

class ConfigError(Error):
    """A setting is out of range or does not fit the transport."""

class EndedError(Error):
    """The stream ended for a reason another connection would not mend."""

class TransportIoError(Error):
    """The system failed (a socket option, the runtime)."""

class CaptureError(Error):
    """A capture file could not be read."""

class IdleTimeoutError(Error):
    """Nothing arrived within the subscriber's idle_timeout."""

class SystemEvent:
    """S: a system event (start and end of messages, system hours, regular hours)."""

    timestamp: int
    event: str
    def __init__(self, *, timestamp: int, event: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class SecurityDirectory:
    """D: a security directory entry."""

    timestamp: int
    symbol: str
    flags: int
    round_lot_size: int
    adjusted_poc_price: int
    luld_tier: int
    def __init__(self, *, timestamp: int, symbol: str, flags: int, round_lot_size: int, adjusted_poc_price: int, luld_tier: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class TradingStatus:
    """H: a trading status change."""

    timestamp: int
    symbol: str
    status: str
    reason: str
    def __init__(self, *, timestamp: int, symbol: str, status: str, reason: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class RetailLiquidityIndicator:
    """I: a retail liquidity indicator."""

    timestamp: int
    symbol: str
    indicator: str
    def __init__(self, *, timestamp: int, symbol: str, indicator: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class OperationalHaltStatus:
    """O: an operational halt status."""

    timestamp: int
    symbol: str
    status: str
    def __init__(self, *, timestamp: int, symbol: str, status: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class ShortSalePriceTestStatus:
    """P: a short-sale price test status."""

    timestamp: int
    symbol: str
    in_effect: bool
    detail: str
    def __init__(self, *, timestamp: int, symbol: str, in_effect: bool, detail: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class SecurityEvent:
    """E: a security event (opening or closing process complete)."""

    timestamp: int
    symbol: str
    event: str
    def __init__(self, *, timestamp: int, symbol: str, event: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class PriceLevelUpdate:
    """8 / 5: a price level update on the buy or sell side of the book."""

    timestamp: int
    symbol: str
    side: str
    event_flags: int
    size: int
    price: int
    def __init__(self, *, timestamp: int, symbol: str, side: str, event_flags: int, size: int, price: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class QuoteUpdate:
    """Q: a top-of-book quote update."""

    timestamp: int
    symbol: str
    flags: int
    bid_size: int
    bid_price: int
    ask_price: int
    ask_size: int
    def __init__(self, *, timestamp: int, symbol: str, flags: int, bid_size: int, bid_price: int, ask_price: int, ask_size: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Trade:
    """T: a trade report."""

    timestamp: int
    symbol: str
    sale_condition: int
    size: int
    price: int
    trade_id: int
    def __init__(self, *, timestamp: int, symbol: str, sale_condition: int, size: int, price: int, trade_id: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class TradeBreak:
    """B: a trade break (a trade reported earlier is void)."""

    timestamp: int
    symbol: str
    sale_condition: int
    size: int
    price: int
    trade_id: int
    def __init__(self, *, timestamp: int, symbol: str, sale_condition: int, size: int, price: int, trade_id: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class OfficialPrice:
    """X: an official opening or closing price."""

    timestamp: int
    symbol: str
    price_type: str
    price: int
    def __init__(self, *, timestamp: int, symbol: str, price_type: str, price: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class AuctionInformation:
    """A: auction information."""

    timestamp: int
    symbol: str
    auction_type: str
    paired_shares: int
    reference_price: int
    indicative_clearing_price: int
    imbalance_shares: int
    imbalance_side: str
    extension_number: int
    scheduled_auction_time: int
    auction_book_clearing_price: int
    collar_reference_price: int
    lower_auction_collar: int
    upper_auction_collar: int
    def __init__(self, *, timestamp: int, symbol: str, auction_type: str, paired_shares: int, reference_price: int, indicative_clearing_price: int, imbalance_shares: int, imbalance_side: str, extension_number: int, scheduled_auction_time: int, auction_book_clearing_price: int, collar_reference_price: int, lower_auction_collar: int, upper_auction_collar: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class UnknownMessage:
    """A message of a type this package does not model: its type byte and length."""

    kind: int
    length: int
    def __init__(self, *, kind: int, length: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Gap:
    """Frames found missing: `count` frames from `first` have not arrived (yet)."""

    first: int
    count: int
    def __init__(self, *, first: int, count: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class GivenUp:
    """Missing frames were given up: they will not come."""

    frames: int
    def __init__(self, *, frames: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Recovered:
    """The messages that follow are a frame retransmitted by the recovery service."""

    sequence: int
    messages: int
    def __init__(self, *, sequence: int, messages: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class FormatChanged:
    """The stream's wire format changed (`from_format` is None for the first one)."""

    from_format: Optional[str]
    to_format: str
    def __init__(self, *, from_format: Optional[str], to_format: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Restarted:
    """The publisher restarted: a new session, sequence numbers start over."""

    old_session: int
    new_session: int
    def __init__(self, *, old_session: int, new_session: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Connected:
    """TCP: a connection to the publisher was made."""

    peer: str
    reconnect: bool
    def __init__(self, *, peer: str, reconnect: bool) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class Notice:
    """Something else that happened to the stream; `kind` names it, `detail` says the rest."""

    kind: str
    detail: str
    def __init__(self, *, kind: str, detail: str) -> None: ...
    def __eq__(self, other: object) -> bool: ...

class End:
    """The end of the stream: nothing follows."""

    complete: bool
    next_sequence: int
    publisher_frames: Optional[int]
    publisher_messages: Optional[int]
    def __init__(self, *, complete: bool, next_sequence: int, publisher_frames: Optional[int], publisher_messages: Optional[int]) -> None: ...
    def __eq__(self, other: object) -> bool: ...

Message = Union[
    SystemEvent, SecurityDirectory, TradingStatus, RetailLiquidityIndicator, OperationalHaltStatus,
    ShortSalePriceTestStatus, SecurityEvent, PriceLevelUpdate, QuoteUpdate, Trade, TradeBreak,
    OfficialPrice, AuctionInformation, UnknownMessage,
]
"""Any IEX message."""
StreamEvent = Union[Gap, GivenUp, Recovered, FormatChanged, Restarted, Connected, Notice, End]
"""Anything that happened to the stream."""

class BatchIterator(Iterator[Tuple[str, pyarrow.RecordBatch]]):
    """The iterator `Subscriber.batches()` returns: `(message_type, pyarrow.RecordBatch)` pairs."""

    def __iter__(self) -> "BatchIterator": ...
    def __next__(self) -> Tuple[str, pyarrow.RecordBatch]: ...
    def next_batch(self, timeout: Optional[float] = None) -> Optional[Tuple[str, pyarrow.RecordBatch]]:
        """The next pair, waiting at most `timeout` seconds; None when the time ran out,
        StopIteration once the stream is over."""
    @property
    def prices(self) -> Prices:
        """The Arrow type of price columns."""
    @overload
    def to_pandas(self, message_type: str, *, seconds: Optional[float] = None) -> "pandas.DataFrame":
        """The batches still to come, until the end of the stream or for `seconds` at most, as
        a pandas DataFrame of `message_type`'s rows, or a dict of one per message type."""
    @overload
    def to_pandas(self, message_type: None = None, *, seconds: Optional[float] = None) -> Dict[str, "pandas.DataFrame"]: ...
    @overload
    def to_polars(self, message_type: str, *, seconds: Optional[float] = None) -> "polars.DataFrame":
        """The batches still to come, until the end of the stream or for `seconds` at most, as
        a polars DataFrame of `message_type`'s rows, or a dict of one per message type."""
    @overload
    def to_polars(self, message_type: None = None, *, seconds: Optional[float] = None) -> Dict[str, "polars.DataFrame"]: ...

class CaptureBatches(Iterator[Tuple[str, pyarrow.RecordBatch]]):
    """The iterator `read_capture` returns: `(message_type, pyarrow.RecordBatch)` pairs."""

    def __iter__(self) -> "CaptureBatches": ...
    def __next__(self) -> Tuple[str, pyarrow.RecordBatch]: ...
    @property
    def prices(self) -> Prices:
        """The Arrow type of price columns."""
    @overload
    def to_pandas(self, message_type: str) -> "pandas.DataFrame":
        """What is still to read, as a pandas DataFrame of `message_type`'s rows, or a dict of
        one per message type."""
    @overload
    def to_pandas(self, message_type: None = None) -> Dict[str, "pandas.DataFrame"]: ...
    @overload
    def to_polars(self, message_type: str) -> "polars.DataFrame":
        """What is still to read, as a polars DataFrame of `message_type`'s rows, or a dict of
        one per message type."""
    @overload
    def to_polars(self, message_type: None = None) -> Dict[str, "polars.DataFrame"]: ...
    def stats(self) -> Dict[str, Any]:
        """What was read so far: packets, segments, messages, other packets, bad messages."""

class Subscriber(Iterator[Union[Message, StreamEvent]]):
    """A subscription to an mdrelay publisher's stream; iterate for events, or `batches()`."""

    def __init__(
        self,
        *,
        tcp: Optional[str] = None,
        udp: Optional[str] = None,
        multicast: Optional[str] = None,
        interface: str = "0.0.0.0",
        nats: Optional[str] = None,
        nats_subject: Optional[str] = None,
        nats_stream: Optional[str] = None,
        line_b: Optional[str] = None,
        interface_b: Optional[str] = None,
        recovery: Optional[str] = None,
        recovery_delay: Optional[float] = None,
        recovery_retry: Optional[float] = None,
        recovery_attempts: Optional[int] = None,
        recovery_linger: Optional[float] = None,
        resume: Optional[bool] = None,
        from_start: bool = False,
        symbols: Optional[List[str]] = None,
        crc: bool = False,
        key_file: Optional[Union[str, "PathLike[str]"]] = None,
        reconnect_max: Optional[float] = None,
        give_up_after: Optional[float] = None,
        connect_timeout: Optional[float] = None,
        receive_buffer: Optional[int] = None,
        echo_every: Optional[int] = None,
        profile: Optional[str] = None,
        idle: Optional[str] = None,
        busy_poll: Optional[bool] = None,
        nats_creds_file: Optional[Union[str, "PathLike[str]"]] = None,
        nats_nkey_file: Optional[Union[str, "PathLike[str]"]] = None,
        nats_user: Optional[str] = None,
        nats_password_file: Optional[Union[str, "PathLike[str]"]] = None,
        nats_tls_ca_file: Optional[Union[str, "PathLike[str]"]] = None,
        nats_pending_messages: Optional[int] = None,
        idle_timeout: Optional[float] = None,
    ) -> None: ...
    def __iter__(self) -> "Subscriber": ...
    def __next__(self) -> Union[Message, StreamEvent]: ...
    def next_event(self, timeout: Optional[float] = None) -> Optional[Union[Message, StreamEvent]]:
        """The next event, waiting at most `timeout` seconds; None when the time ran out,
        StopIteration once the stream is over (or closed)."""
    def batches(self, max_messages: int = 65536, timeout: float = 1.0, *, prices: Prices = "decimal") -> BatchIterator:
        """Arrow record batches of the stream's messages, per message type."""
    def counters(self) -> Dict[str, Any]:
        """What was counted so far, and the publisher's totals once its end of stream came."""
    @property
    def local_addrs(self) -> List[str]:
        """UDP and multicast: the local addresses the lines receive on."""
    def close(self) -> None:
        """Ends the subscription now: nothing more is handed out, and iteration, `next_event()`
        and `batches()` end at once with StopIteration; `counters()` stays readable."""
    def __enter__(self) -> "Subscriber": ...
    def __exit__(self, *exc: object) -> bool: ...

def read_capture(
    path: Union[str, "PathLike[str]"], max_messages: int = 65536, *, prices: Prices = "decimal"
) -> CaptureBatches:
    """Reads a capture or a subscriber's recording into `(message_type, pyarrow.RecordBatch)` pairs."""

def schema(message_type: str, prices: Prices = "decimal") -> pyarrow.Schema:
    """The Arrow schema of a message type's batches, with price columns of the type `prices` names."""

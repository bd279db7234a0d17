"""Type stubs of the native module (re-exported by ``mdrelay``)."""

from os import PathLike
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union, final, overload

import pyarrow

if TYPE_CHECKING:
    import pandas
    import polars

Prices = Literal["decimal", "float", "integer"]
"""The Arrow type of price columns: `decimal128(18, 4)` dollars (exact), `float64` dollars (the
nearest double) or `int64` in 1/10,000 dollars (as IEX sends them)."""

#: The message type names batches carry.
MESSAGE_TYPES: List[str]

# The module's names, as it lists them (the message and record classes' are added where they are
# generated).
# The type aliases (Prices, Message, StreamEvent) are not among them: they exist for type
# checkers only.
__all__ = [
    "Error", "WrongKeyError", "ProtectionMismatchError", "VersionError", "RefusedError", "NotAPublisherError",
    "UnreachableError", "AddrInUseError", "BindError", "ConfigError", "EndedError", "TransportIoError",
    "CaptureError", "IdleTimeoutError", "Subscriber", "BatchIterator", "CaptureBatches", "read_capture",
    "schema", "MESSAGE_TYPES",
]

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

# Generated from the model's table (for_each_message_type! in iex/src/message.rs) and
# for_each_python_class! and python_field! in python/src/messages.rs by
# python/generate_stub.py: do not edit.
@final
class Trade:
    """T: a trade report."""

    timestamp: int
    symbol: str
    sale_condition: int
    size: int
    price: int
    trade_id: int
    def __new__(cls, *, timestamp: int, symbol: str, sale_condition: int, size: int, price: int, trade_id: int) -> Trade: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class TradeBreak:
    """B: a trade break (a trade reported earlier is void)."""

    timestamp: int
    symbol: str
    sale_condition: int
    size: int
    price: int
    trade_id: int
    def __new__(cls, *, timestamp: int, symbol: str, sale_condition: int, size: int, price: int, trade_id: int) -> TradeBreak: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class PriceLevelUpdate:
    """8 / 5: a price level update on the buy or sell side of the book."""

    timestamp: int
    symbol: str
    side: str
    event_flags: int
    size: int
    price: int
    def __new__(cls, *, timestamp: int, symbol: str, side: str, event_flags: int, size: int, price: int) -> PriceLevelUpdate: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class QuoteUpdate:
    """Q: a top-of-book quote update."""

    timestamp: int
    symbol: str
    flags: int
    bid_size: int
    bid_price: int
    ask_price: int
    ask_size: int
    def __new__(cls, *, timestamp: int, symbol: str, flags: int, bid_size: int, bid_price: int, ask_price: int, ask_size: int) -> QuoteUpdate: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class SystemEvent:
    """S: a system event (start and end of messages, system hours, regular hours)."""

    timestamp: int
    event: str
    def __new__(cls, *, timestamp: int, event: str) -> SystemEvent: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class SecurityDirectory:
    """D: a security directory entry."""

    timestamp: int
    symbol: str
    flags: int
    round_lot_size: int
    adjusted_poc_price: int
    luld_tier: int
    def __new__(cls, *, timestamp: int, symbol: str, flags: int, round_lot_size: int, adjusted_poc_price: int, luld_tier: int) -> SecurityDirectory: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class TradingStatus:
    """H: a trading status change."""

    timestamp: int
    symbol: str
    status: str
    reason: str
    def __new__(cls, *, timestamp: int, symbol: str, status: str, reason: str) -> TradingStatus: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class RetailLiquidityIndicator:
    """I: a retail liquidity indicator."""

    timestamp: int
    symbol: str
    indicator: str
    def __new__(cls, *, timestamp: int, symbol: str, indicator: str) -> RetailLiquidityIndicator: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class OperationalHaltStatus:
    """O: an operational halt status."""

    timestamp: int
    symbol: str
    status: str
    def __new__(cls, *, timestamp: int, symbol: str, status: str) -> OperationalHaltStatus: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class ShortSalePriceTestStatus:
    """P: a short-sale price test status."""

    timestamp: int
    symbol: str
    in_effect: bool
    detail: str
    def __new__(cls, *, timestamp: int, symbol: str, in_effect: bool, detail: str) -> ShortSalePriceTestStatus: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class SecurityEvent:
    """E: a security event (opening or closing process complete)."""

    timestamp: int
    symbol: str
    event: str
    def __new__(cls, *, timestamp: int, symbol: str, event: str) -> SecurityEvent: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class OfficialPrice:
    """X: an official opening or closing price."""

    timestamp: int
    symbol: str
    price_type: str
    price: int
    def __new__(cls, *, timestamp: int, symbol: str, price_type: str, price: int) -> OfficialPrice: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
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
    def __new__(cls, *, timestamp: int, symbol: str, auction_type: str, paired_shares: int, reference_price: int, indicative_clearing_price: int, imbalance_shares: int, imbalance_side: str, extension_number: int, scheduled_auction_time: int, auction_book_clearing_price: int, collar_reference_price: int, lower_auction_collar: int, upper_auction_collar: int) -> AuctionInformation: ...
    def __eq__(self, other: object, /) -> bool: ...

Message = Union[
    Trade, TradeBreak, PriceLevelUpdate, QuoteUpdate, SystemEvent, SecurityDirectory,
    TradingStatus, RetailLiquidityIndicator, OperationalHaltStatus, ShortSalePriceTestStatus,
    SecurityEvent, OfficialPrice, AuctionInformation, UnknownMessage,
]
"""Any IEX message."""

__all__ += [
    "Trade", "TradeBreak", "PriceLevelUpdate", "QuoteUpdate", "SystemEvent",
    "SecurityDirectory", "TradingStatus", "RetailLiquidityIndicator", "OperationalHaltStatus",
    "ShortSalePriceTestStatus", "SecurityEvent", "OfficialPrice", "AuctionInformation",
]
# End of the generated message classes.

# Generated from py_record! and stream_events! in python/src/messages.rs by
# python/generate_stub.py: do not edit.
@final
class UnknownMessage:
    """A message of a type this package does not model: its type byte and length."""

    kind: int
    length: int
    def __new__(cls, *, kind: int, length: int) -> UnknownMessage: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Gap:
    """Frames found missing: `count` frames from `first` have not arrived (yet)."""

    first: int
    count: int
    def __new__(cls, *, first: int, count: int) -> Gap: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class GivenUp:
    """Missing frames were given up: they will not come."""

    frames: int
    def __new__(cls, *, frames: int) -> GivenUp: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Recovered:
    """The messages that follow are a frame retransmitted by the recovery service, filling a gap."""

    sequence: int
    messages: int
    def __new__(cls, *, sequence: int, messages: int) -> Recovered: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class FormatChanged:
    """The stream's wire format changed (`from_format` is None for the first one)."""

    from_format: Optional[str]
    to_format: str
    def __new__(cls, *, from_format: Optional[str], to_format: str) -> FormatChanged: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Restarted:
    """The publisher restarted: a new session, sequence numbers start over."""

    old_session: int
    new_session: int
    def __new__(cls, *, old_session: int, new_session: int) -> Restarted: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Connected:
    """TCP: a connection to the publisher was made."""

    peer: str
    reconnect: bool
    def __new__(cls, *, peer: str, reconnect: bool) -> Connected: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Notice:
    """Something else that happened to the stream (a reconnection, a retransmission service's
    answer, a datagram refused); `kind` names it, `detail` says the rest."""

    kind: str
    detail: str
    def __new__(cls, *, kind: str, detail: str) -> Notice: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class End:
    """The end of the stream: nothing follows."""

    complete: bool
    next_sequence: int
    publisher_frames: Optional[int]
    publisher_messages: Optional[int]
    def __new__(cls, *, complete: bool, next_sequence: int, publisher_frames: Optional[int], publisher_messages: Optional[int]) -> End: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Snapshot:
    """The snapshot asked for (`snapshot=True`) came: the books (`Subscriber.book`,
    `Subscriber.books`) and the day's counts are as of frame `as_of`, and the messages that
    follow are the stream's from the frame after it."""

    as_of: int
    symbols: int
    messages: int
    def __new__(cls, *, as_of: int, symbols: int, messages: int) -> Snapshot: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Book:
    """One symbol's book and status, as the messages received so far leave them (a snapshot's
    included): price levels as `(price, size)` pairs, best first, prices in 1/10,000
    dollars."""

    symbol: str
    bids: List[Tuple[int, int]]
    asks: List[Tuple[int, int]]
    consistent: Optional[bool]
    trading_status: Optional[str]
    operational_halt: Optional[str]
    short_sale_test: Optional[bool]
    last_trade: Optional[Tuple[int, int]]
    def __new__(cls, *, symbol: str, bids: List[Tuple[int, int]], asks: List[Tuple[int, int]], consistent: Optional[bool], trading_status: Optional[str], operational_halt: Optional[str], short_sale_test: Optional[bool], last_trade: Optional[Tuple[int, int]]) -> Book: ...
    def __eq__(self, other: object, /) -> bool: ...

StreamEvent = Union[Gap, GivenUp, Recovered, FormatChanged, Restarted, Connected, Notice, End, Snapshot]
"""Anything that happened to the stream."""

__all__ += [
    "UnknownMessage", "Gap", "GivenUp", "Recovered", "FormatChanged", "Restarted", "Connected",
    "Notice", "End", "Snapshot", "Book",
]
# End of the generated record classes.

@final
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

@final
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

@final
class Subscriber(Iterator[Union[Message, StreamEvent]]):
    """A subscription to an mdrelay publisher's stream; iterate for events, or `batches()`."""

    def __new__(
        cls,
        *,
        # Generated from mdrelay_client::Settings by python/generate_stub.py: do not edit.
        # TCP: the publisher's host:port (the name is resolved at each connection attempt). A lost
        # connection is made again, waiting from 100 ms doubling up to reconnect_max, and resumes
        # after the last frame received.
        tcp: Optional[str] = None,
        # UDP: the local addr:port the datagrams are sent to (port 0 picks a free port, see
        # Subscriber::local_addrs).
        udp: Optional[str] = None,
        # Multicast: the IPv4 group:port to join.
        multicast: Optional[str] = None,
        # Multicast: the address of the local interface to join the group on (default 0.0.0.0, the
        # system's choice).
        interface: Optional[str] = None,
        # NATS: the servers' URLs, comma-separated (nats://host:port; the client fails over among them
        # and reconnects for ever), of a publisher's [nats] output.
        nats: Optional[str] = None,
        # NATS: the subject the stream is published to (default mdrelay.1), each message one relay
        # datagram.
        nats_subject: Optional[str] = None,
        # NATS: the JetStream stream that stores the subject (the publisher's nats.stream), from which
        # from_start and nats_start_at replay and from which gaps in the live subject are repaired
        # (the recovery_* timings apply, with NATS's defaults: 20 ms, 250 ms, 12 reads, 10 s).
        nats_stream: Optional[str] = None,
        # NATS with nats_stream: start with the stream's first message stored at or after this time
        # (RFC 3339), replayed and then handed over to the live subject without a gap or a duplicate.
        # The frames before it are not owed (the subscriber joined late).
        nats_start_at: Optional[str] = None,
        # NATS: authenticate with a .creds file (JWT and nkey seed).
        nats_creds_file: Optional[Union[str, "PathLike[str]"]] = None,
        # NATS: authenticate with the nkey seed in this file.
        nats_nkey_file: Optional[Union[str, "PathLike[str]"]] = None,
        # NATS: authenticate as this user, with nats_password_file.
        nats_user: Optional[str] = None,
        # NATS: the file holding nats_user's password (white space around it is trimmed).
        nats_password_file: Optional[Union[str, "PathLike[str]"]] = None,
        # NATS: check the servers' TLS certificates with the CA certificates (PEM) in this file, and
        # require TLS.
        nats_tls_ca_file: Optional[Union[str, "PathLike[str]"]] = None,
        # NATS: messages the client holds for the subscription, at most, while the program does not
        # read them (16 to 16 Mi, default 65,536); past it they are dropped as a slow consumer's and
        # repaired from nats_stream (or counted lost). Lower it to bound memory when the program may
        # stall.
        nats_pending_messages: Optional[int] = None,
        # NATS: the connection's name, as the servers' monitoring lists it (default mdrelay-client).
        nats_name: Optional[str] = None,
        # A second line (A/B) carrying the same datagrams: a local addr:port for UDP, a group:port for
        # multicast. Each frame is taken from whichever line delivers it first.
        line_b: Optional[str] = None,
        # Multicast: the local interface to join line B's group on (default 0.0.0.0).
        interface_b: Optional[str] = None,
        # UDP and multicast: the publisher's retransmission service (host:port, its
        # retransmit.listen), asked for missing frames.
        recovery: Optional[str] = None,
        # Recovery: wait this long after a gap is seen before asking (0 to 10 s, default 5 ms).
        recovery_delay: Optional[Union[float, str]] = None,
        # Recovery: ask again after this long without an answer (1 ms to 60 s, default 50 ms); the
        # wait doubles with each further unanswered request for the same frames, up to 8 times.
        recovery_retry: Optional[Union[float, str]] = None,
        # Recovery: requests per gap before it is given up (1 to 1,000, default 10).
        recovery_attempts: Optional[int] = None,
        # Recovery: after the end of the stream, wait this long at most for frames still missing (0 to
        # 600 s, default 2 s).
        recovery_linger: Optional[Union[float, str]] = None,
        # TCP: whether a reconnection to the same publisher run asks for the frames after the last one
        # received (default true), or takes the stream live from where it is.
        resume: Optional[bool] = None,
        # The session from its first frame: over TCP asked of the publisher (replayed from its ring),
        # over UDP owed (frames before the first received count as missing, and recovery asks for
        # them), over NATS replayed from nats_stream.
        from_start: bool = False,
        # Join with a snapshot of the state (every symbol's book and status, the day's aggregates and
        # counts) as of a frame, then the stream from the frame after it, with no gap and no duplicate
        # (Event::Snapshot). Over TCP it is asked on the first connection only (a reconnection
        # resumes); over UDP and multicast it comes from the retransmission service (recovery), and
        # the frames between it and the first datagram are recovered from the ring; over NATS it is
        # asked of the publisher by request.
        snapshot: bool = False,
        # Decode only these symbols' messages (1 to 8 ASCII characters each); the others are skipped
        # while decoding, as early as the format allows, and only counted by type (see
        # Frame::skipped).
        symbols: Optional[Sequence[str]] = None,
        # The publisher adds a CRC-32C to every frame (its [protection] crc = true).
        crc: bool = False,
        # The publisher encrypts every frame with the key in this file (64 hex digits, readable by its
        # owner only, as the publisher's [protection] key_file).
        key_file: Optional[Union[str, "PathLike[str]"]] = None,
        # Round-trip latency: echo every nth frame's publish time back to the publisher, which
        # measures the round trip on its own clock (at least 1).
        echo_every: Optional[int] = None,
        # TCP: the longest wait between connection attempts (10 ms to 1 day, default 5 s).
        reconnect_max: Optional[Union[float, str]] = None,
        # Give up when nothing comes for this long: over TCP, no connection made (default: never);
        # over NATS, once started, no frame on the subject nor in nats_stream's tail (default 30 s).
        # TCP: the subscriber ends with ErrorKind::Unreachable when no connection could be made, or
        # every one was told BUSY, for this long (10 ms to 1 day), counted from the first attempt that
        # failed since the last connection whose stream started. NATS: it gives up on the stream with
        # ErrorKind::Ended when nothing new came for this long, on the subject nor in nats_stream's
        # tail, which is read whenever the subject is quiet (a server out of reach answers nothing and
        # is waited for; one that answers after more than a quarter of this limit was stalled, and the
        # limit starts again from its answer). What is missing then is given up, and counted. An end
        # of stream far ahead of the frames the stream holds (frames a publisher dropped) is taken at
        # that point instead, unless a frame of its session came after it.
        give_up_after: Optional[Union[float, str]] = None,
        # TCP: time for a connection to be made, the name resolved included (10 ms to 1 day, default
        # 10 s).
        connect_timeout: Optional[Union[float, str]] = None,
        # The receive buffer asked of the kernel for each socket (4 KiB to 1 GiB; default 16 MiB for
        # UDP and multicast, the system's for TCP). Above net.core.rmem_max it is granted only to a
        # process with CAP_NET_ADMIN.
        receive_buffer: Optional[int] = None,
        # A set of choices made together: low-latency busy-polls the sockets (idle = "spin",
        # SO_BUSY_POLL); settings given explicitly override it.
        profile: Optional[Literal["default", "low-latency"]] = None,
        # How waiting for data is done: sleep (the default) waits for the kernel to say a socket is
        # readable; spin and yield read the non-blocking sockets over and over (a core), backoff does
        # so for a few dozen empty reads after data, then waits.
        idle: Optional[Literal["spin", "yield", "backoff", "sleep"]] = None,
        # SO_BUSY_POLL on the sockets (default: on with the low-latency profile); a kernel that
        # refuses it is counted in Counters::busy_poll_refused.
        busy_poll: Optional[bool] = None,
        # Keep each frame's bytes (opened, as the format encodes them) for Frame::bytes, as a recorder
        # needs them: one copy per frame.
        frame_bytes: bool = False,
        # End of the generated keywords.
        idle_timeout: Optional[float] = None,
        # Keep every symbol's book and status for book() and books() (default: with snapshot).
        books: Optional[bool] = None,
    ) -> Subscriber: ...
    def __iter__(self) -> "Subscriber": ...
    def __next__(self) -> Union[Message, StreamEvent]: ...
    def next_event(self, timeout: Optional[float] = None) -> Optional[Union[Message, StreamEvent]]:
        """The next event, waiting at most `timeout` seconds; None when the time ran out,
        StopIteration once the stream is over (or closed)."""
    def batches(self, max_messages: int = 65536, timeout: float = 1.0, *, prices: Prices = "decimal") -> BatchIterator:
        """Arrow record batches of the stream's messages, per message type."""
    def counters(self) -> Dict[str, Any]:
        """What was counted so far, and the publisher's totals once its end of stream came."""
    def book(self, symbol: str) -> Optional[Book]:
        """One symbol's book and status as the messages received so far leave them (a
        snapshot's included), or None when it has none. Needs `books=True` (or `snapshot=True`)."""
    def books(self) -> pyarrow.RecordBatch:
        """Every symbol's price levels: `symbol`, `side` ("buy" or "sell"), `price` (int64,
        1/10,000 dollars) and `size`, by symbol, each side best first. Needs `books=True` (or
        `snapshot=True`)."""
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

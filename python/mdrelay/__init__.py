"""Receive an mdrelay publisher's IEX market data: typed events and Apache Arrow record batches.

Built on the Rust client library ``mdrelay-client``: TCP, UDP, multicast and NATS transports, gap
detection and recovery, A/B lines, frame protection and every wire format come from it.
"""

from typing import TYPE_CHECKING

from ._native import *  # noqa: F401,F403
from ._native import MESSAGE_TYPES, Subscriber, read_capture, schema  # noqa: F401

if TYPE_CHECKING:
    # The stub's type aliases, which the module does not have at run time (so its __all__, and
    # the star import above, leave them out).
    from ._native import Message as Message, Prices as Prices, StreamEvent as StreamEvent  # noqa: F401

__all__ = [
    "Subscriber",
    "BatchIterator",
    "CaptureBatches",
    "read_capture",
    "schema",
    "MESSAGE_TYPES",
    "Error",
    "WrongKeyError",
    "ProtectionMismatchError",
    "VersionError",
    "RefusedError",
    "NotAPublisherError",
    "UnreachableError",
    "AddrInUseError",
    "BindError",
    "ConfigError",
    "EndedError",
    "TransportIoError",
    "CaptureError",
    "IdleTimeoutError",
    "SystemEvent",
    "SecurityDirectory",
    "TradingStatus",
    "RetailLiquidityIndicator",
    "OperationalHaltStatus",
    "ShortSalePriceTestStatus",
    "SecurityEvent",
    "PriceLevelUpdate",
    "QuoteUpdate",
    "Trade",
    "TradeBreak",
    "OfficialPrice",
    "AuctionInformation",
    "UnknownMessage",
    "Gap",
    "GivenUp",
    "Recovered",
    "FormatChanged",
    "Restarted",
    "Connected",
    "Notice",
    "End",
    "Snapshot",
    "Book",
]

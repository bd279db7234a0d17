"""Receive an mdrelay publisher's IEX market data: typed events and Apache Arrow record batches.

Built on the Rust client library ``mdrelay-client``: TCP, UDP, multicast and NATS transports, gap
detection and recovery, A/B lines, frame protection and every wire format come from it.
"""

from typing import TYPE_CHECKING, List

from . import _native
from ._native import *  # noqa: F401,F403
from ._native import MESSAGE_TYPES, Subscriber, read_capture, schema  # noqa: F401

if TYPE_CHECKING:
    # The stub's type aliases, which the module does not have at run time (so its __all__, and
    # the star import above, leave them out).
    from ._native import Message as Message, Prices as Prices, StreamEvent as StreamEvent  # noqa: F401

# The extension's names, as it lists them (pyo3 adds each class, function and exception to the
# module's __all__; the stub lists the same, generated where the classes are).
__all__: List[str] = []
__all__ += _native.__all__

"""The event classes: constructors, repr, equality, and the exception hierarchy."""

from __future__ import annotations

import mdrelay


def test_events_compare_by_value_and_repr_as_their_constructor() -> None:
    a = mdrelay.Trade(timestamp=1, symbol="AAPL", sale_condition=0, size=100, price=1490000, trade_id=7)
    b = mdrelay.Trade(timestamp=1, symbol="AAPL", sale_condition=0, size=100, price=1490000, trade_id=7)
    c = mdrelay.Trade(timestamp=1, symbol="AAPL", sale_condition=0, size=101, price=1490000, trade_id=7)
    assert a == b and a != c
    assert repr(a) == "Trade(timestamp=1, symbol='AAPL', sale_condition=0, size=100, price=1490000, trade_id=7)"
    assert eval(repr(a), vars(mdrelay)) == a
    gap = mdrelay.Gap(first=10, count=3)
    assert repr(gap) == "Gap(first=10, count=3)" and gap == mdrelay.Gap(first=10, count=3)
    assert repr(mdrelay.FormatChanged(from_format=None, to_format="sbe")) == "FormatChanged(from_format=None, to_format='sbe')"


def test_every_exception_is_an_mdrelay_error() -> None:
    for name in mdrelay.__all__:
        if name.endswith("Error") and name != "Error":
            cls = getattr(mdrelay, name)
            assert issubclass(cls, mdrelay.Error), name
    assert issubclass(mdrelay.Error, Exception)


def test_every_public_name_is_documented() -> None:
    for name in mdrelay.__all__:
        obj = getattr(mdrelay, name)
        if not isinstance(obj, list):
            assert (obj.__doc__ or "").strip(), name

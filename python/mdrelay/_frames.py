"""DataFrames of the Arrow batches ``Subscriber.batches()`` and ``read_capture`` give: what their
``to_pandas()`` and ``to_polars()`` methods do.

pandas and polars are imported when first asked for, so neither is needed to use the rest of
the package. Columns keep the types of the batches (``mdrelay.schema`` lists them): timestamps
are UTC, in nanoseconds; prices are decimal, float or integer as ``prices=`` chose.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from ._native import schema


def _require(module: str, method: str) -> Any:
    """Imports `module`, or says plainly that `method` needs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{method} needs {module}, which is not installed here: pip install {module}"
        ) from e


def _tables(batches: Any, message_type: Optional[str], seconds: Optional[float]) -> Any:
    """The batches still to come as pyarrow Tables: one of `message_type` (empty, with its
    schema, when none came), or a dict of one per message type that came."""
    import pyarrow as pa

    prices = batches.prices
    wanted = None if message_type is None else schema(message_type, prices)
    parts: Dict[str, List[Any]] = {}

    def keep(pair: Any) -> None:
        label, batch = pair
        if message_type is None or label == message_type:
            parts.setdefault(label, []).append(batch)

    if seconds is None:
        for pair in batches:
            keep(pair)
    else:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                pair = batches.next_batch(left)
            except StopIteration:
                break
            if pair is None:
                break
            keep(pair)
    if message_type is not None:
        return pa.Table.from_batches(parts.get(message_type, []), schema=wanted)
    return {label: pa.Table.from_batches(got) for label, got in parts.items()}


def _pandas_frame(table: Any) -> Any:
    """A pandas DataFrame of `table`: timestamps datetime64[ns, UTC], symbols categorical,
    decimal prices exact (pandas' Arrow-backed decimal dtype), everything else as pyarrow
    converts it by default."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pd = _require("pandas", "to_pandas()")
    index = table.schema.get_field_index("symbol")
    if index >= 0:
        # A dictionary column becomes a pandas Categorical: a few hundred symbols over
        # millions of rows.
        table = table.set_column(index, "symbol", pc.dictionary_encode(table["symbol"]))

    def types(arrow_type: Any) -> Any:
        return pd.ArrowDtype(arrow_type) if pa.types.is_decimal(arrow_type) else None

    return table.to_pandas(types_mapper=types)


def _polars_frame(table: Any) -> Any:
    """A polars DataFrame of `table`, its columns of the batches' types (symbols stay strings:
    polars keeps strings of up to 12 bytes inline, which every symbol is)."""
    pl = _require("polars", "to_polars()")
    return pl.from_arrow(table)


def _frames(batches: Any, message_type: Optional[str], seconds: Optional[float], library: str, frame: Any) -> Any:
    """The tables of ``batches`` as DataFrames of ``library``, each made by ``frame``: one of
    ``message_type``'s rows, or (with no type) a dict of one per message type."""
    _require(library, f"to_{library}()")
    got = _tables(batches, message_type, seconds)
    if message_type is not None:
        return frame(got)
    return {label: frame(table) for label, table in got.items()}


def to_pandas(batches: Any, message_type: Optional[str] = None, seconds: Optional[float] = None) -> Any:
    """``to_pandas()`` of ``batches`` (a BatchIterator or CaptureBatches)."""
    return _frames(batches, message_type, seconds, "pandas", _pandas_frame)


def to_polars(batches: Any, message_type: Optional[str] = None, seconds: Optional[float] = None) -> Any:
    """``to_polars()`` of ``batches`` (a BatchIterator or CaptureBatches)."""
    return _frames(batches, message_type, seconds, "polars", _polars_frame)

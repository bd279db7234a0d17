"""python/README.md's notebook session runs as written: its Python blocks in order, in one
interpreter, against a publisher on a port of its choosing instead of 9100, with the minute of
step 2 cut to a few seconds (the publisher here sends as fast as it can) and without the plot
itself (matplotlib is not a dependency)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import PROJECT, RUN, expected, tcp_publisher


def test_the_notebook_session_runs(publishers) -> None:
    readme = (PROJECT / "python" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 4, "the README's notebook session has four steps"
    code = "\n".join(blocks)
    assert 'to_polars("trade", seconds=60)' in code
    code = code.replace('to_polars("trade", seconds=60)', 'to_polars("trade", seconds=10)')
    code = code[: code.index("import matplotlib")] + code[code.index("plt.show()") + len("plt.show()"):]
    code += (
        "\nassert df.height > 0 and str(df.schema['price']) == 'Decimal(precision=18, scale=4)', df.schema"
        "\nassert vwap.schema['vwap'] == pl.Float64 and vwap.height > 0, vwap.schema"
        "\nprint(df.height, df['size'].sum(), subscriber.counters()['lost'])"
    )
    publisher = tcp_publisher(publishers, "DEEP10", "sbe")
    code = code.replace("127.0.0.1:9100", publisher.tcp_address())
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN)
    assert run.returncode == 0, run.stderr
    rows, volume, lost = (int(x) for x in run.stdout.split()[-3:])
    # Trades of the stream's start: no more than the capture holds, none lost.
    assert 0 < rows <= expected("DEEP10")["message_types"]["T"]
    assert 0 < volume <= expected("DEEP10")["total_trade_volume"]
    assert lost == 0

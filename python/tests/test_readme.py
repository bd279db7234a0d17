"""The README's Python example runs as written (against a publisher on a port of its choosing
instead of 9100, which another program may hold)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import PROJECT, expected, tcp_publisher


def test_the_readme_example_runs(publishers) -> None:
    readme = (PROJECT / "README.md").read_text()
    section = readme[readme.index("## In Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10, "the README promises a ten-line example"
    publisher = tcp_publisher(publishers, "DEEP10", "sbe")
    code = code.replace("127.0.0.1:9100", publisher.tcp_address())
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    # The five symbols of most volume, as the reference counts it, and a whole stream.
    reference = expected("DEEP10")["symbols"]
    top = sorted(((s, f["trade_volume"]) for s, f in reference.items()), key=lambda kv: -kv[1])[:5]
    assert run.stdout.strip() == f"{top} True", run.stdout
    assert publisher.finish() == 0

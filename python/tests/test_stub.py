"""The type stub against the compiled module: mypy's stubtest checks every class, attribute and
signature of the installed mdrelay._native against the installed _native.pyi."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_the_stub_matches_the_compiled_module(tmp_path: Path) -> None:
    settings = ["--mypy-config-file", str(HERE / "stubtest.ini"), "--allowlist", str(HERE / "stubtest_allowlist.txt")]
    command = [sys.executable, "-m", "mypy.stubtest", *settings, "mdrelay._native"]
    # From an empty folder, which also takes mypy's cache: `mdrelay` is then the installed wheel,
    # not the sources in python/, which lack the compiled module.
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"stubtest found the stub and the module disagree:\n{run.stdout}{run.stderr}"

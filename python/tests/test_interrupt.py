"""Ctrl-C while a subscriber waits: the wait ends promptly with KeyboardInterrupt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import capture

WAITER = """
import sys, mdrelay
sub = mdrelay.Subscriber(tcp=sys.argv[1])
print("waiting", flush=True)
for event in sub:
    pass
"""


def test_sigint_interrupts_a_blocking_wait(publishers) -> None:
    # It waits for two subscribers, so the one below gets nothing and blocks.
    publisher = publishers(["--capture", capture("TOPS16"), "--tcp", "127.0.0.1:0", "--wait-subscribers", "2"])
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, publisher.tcp_address()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert "KeyboardInterrupt" in stderr, stderr
    assert took < 1.0, f"{took:.3f} s to stop"

"""Against a peer made here (a socket on loopback) that greets as a publisher and then
misbehaves: FORMAT records sent without end, which produce nothing, must hold up neither
next_event(timeout) nor Ctrl-C; and a refusal whose reason holds a forged log line and terminal
escapes must reach the exception escaped. The greeting and records are built from
docs/protocol.md, byte by byte."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

import pytest

import mdrelay

SESSION = 0x5E55
SBE = 1
FORMAT, REFUSE = 2, 4
#: The longest a flood goes on: far longer than any wait below should take.
FLOOD = 10.0


def hello() -> bytes:
    """A version-2 greeting of session SESSION whose next frame is 1 (docs/protocol.md)."""
    return b"MDRELAY\0" + struct.pack("<HBBHHQI4sQ", 2, SBE, 0, 1, 0, SESSION, 1, b"\0" * 4, 1)


def record(tag: int, sequence: int, payload: bytes = b"") -> bytes:
    """A record: tag, format, frame count 0, length, sequence, then the payload."""
    return struct.pack("<BBHIQ", tag, SBE, 0, len(payload), sequence) + payload


class Peer:
    """A peer on a loopback port that greets one subscriber, reads its 32-byte answer and then
    runs `then(connection)`; what `then` returns is kept in `result`."""

    def __init__(self, then: Callable[[socket.socket], object]):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(30)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.result: object = None
        self.thread = threading.Thread(target=self._serve, args=(then,), daemon=True)
        self.thread.start()

    def _serve(self, then: Callable[[socket.socket], object]) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(30)
            conn.sendall(hello())
            answer = b""
            while len(answer) < 32:
                chunk = conn.recv(32 - len(answer))
                if not chunk:
                    return
                answer += chunk
            assert answer.startswith(b"MDRSUBS\0"), answer
            self.result = then(conn)

    def join(self) -> object:
        self.thread.join(timeout=FLOOD + 30)
        self.listener.close()
        return self.result


def flood(conn: socket.socket) -> Tuple[int, bool]:
    """Sends FORMAT records of the format in use until the subscriber leaves or FLOOD passes:
    the bytes sent, and whether it ran out of time with the subscriber still there."""
    burst = record(FORMAT, 1) * (1 << 16)
    sent, started = 0, time.monotonic()
    while time.monotonic() - started < FLOOD:
        try:
            conn.sendall(burst)
        except OSError:
            return sent, False
        sent += len(burst)
    return sent, True


def test_next_event_returns_within_its_timeout_while_records_producing_nothing_pour_in() -> None:
    peer = Peer(flood)
    sub = mdrelay.Subscriber(tcp=peer.address)
    took: List[float] = []
    started = time.monotonic()
    while len(took) < 3 and time.monotonic() - started < FLOOD:
        asked = time.monotonic()
        event = sub.next_event(timeout=1)
        if event is None:
            took.append(time.monotonic() - asked)
    received = sub.counters()["bytes"]
    sub.close()
    sent, ran_out = peer.join()
    assert len(took) == 3 and max(took) < 2.0, f"next_event(timeout=1) took {took} s; {sent >> 20} MB sent"
    assert not ran_out and received > 1 << 20, f"the waits ended during the flood: {sent}, {received}"


WAITER = """
import sys, mdrelay
sub = mdrelay.Subscriber(tcp=sys.argv[1])
print("waiting", flush=True)
for event in sub:
    pass
"""


def test_sigint_interrupts_a_subscriber_flooded_with_records_producing_nothing() -> None:
    peer = Peer(flood)
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, peer.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    took: Optional[float] = None
    try:
        assert proc.stdout.readline().strip() == "waiting"
        # The flood has begun once the greeting was answered; give it a moment.
        time.sleep(0.5)
        sent_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=FLOOD + 10)
        took = time.monotonic() - sent_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    sent, ran_out = peer.join()
    assert "KeyboardInterrupt" in stderr, stderr
    assert took is not None and took < 2.0 and not ran_out, f"{took:.3f} s to stop; {sent >> 20} MB sent"


def test_a_refusal_reason_with_a_forged_log_line_and_escapes_reaches_the_exception_escaped() -> None:
    reason = b"upgrade\n2025-01-01T00:00:00.000000Z ERROR forged\r\x1b[2J\x1b]0;owned\x07"

    def refuse(conn: socket.socket) -> None:
        conn.sendall(record(REFUSE, 0, reason))
        try:
            conn.recv(1)
        except OSError:
            pass

    peer = Peer(refuse)
    sub = mdrelay.Subscriber(tcp=peer.address)
    with pytest.raises(mdrelay.RefusedError) as caught:
        for _ in sub:
            pass
    peer.join()
    for text in (str(caught.value), caught.value.message):
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text), repr(text)
        assert r"upgrade\n2025-01-01T00:00:00.000000Z ERROR forged\r\u{1b}[2J\u{1b}]0;owned\u{7}" in text, text

"""Messages per second into Python: the event iterator and Arrow batches over loopback TCP from a
real mdrelay-pub at top speed, beside mdrelay-sub (the Rust client library's program) against the
same publisher settings, and a capture read straight into Arrow batches.

    python bench.py [--repetitions 5] [--loops 5] [--format sbe]

Each repetition runs every mode once, in turn; the table gives each mode's median, minimum and
maximum over the repetitions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import mdrelay

PROJECT = Path(__file__).resolve().parents[1]
IEX = PROJECT.parent / "shared" / "data" / "iex"


def binary(name: str, env: str) -> str:
    """A project binary: $env, else the release build, else the quick build."""
    if os.environ.get(env):
        return os.environ[env]
    for profile in ("release", "quick"):
        path = PROJECT / "target" / profile / name
        if path.exists():
            if profile == "quick":
                # The test profile is built for build time (opt-level 1): mdrelay-sub's row and
                # the publisher's top speed come out lower than a release build's.
                print(f"bench.py: using the test build {path}: build --release to compare", file=sys.stderr)
            return str(path)
    raise SystemExit(f"no {name}: cargo build --release -p mdrelay-publisher -p mdrelay-subscriber")


class Publisher:
    """An mdrelay-pub at top speed over TCP, for one subscriber."""

    def __init__(self, capture: str, loops: int, fmt: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-pub-", delete=False)
        self.proc = subprocess.Popen(
            [binary("mdrelay-pub", "MDRELAY_PUB"), "run", "--capture", capture, "--loops", str(loops),
             "--format", fmt, "--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--slow-subscriber", "block"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"serving subscribers over TCP listen=(\S+)", Path(self.log.name).read_text())
            if m:
                self.address = m.group(1)
                return
            time.sleep(0.02)
        raise SystemExit("the publisher did not start: " + Path(self.log.name).read_text())

    def finish(self) -> None:
        """Waits for its end (at most a minute), then removes its log."""
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.unlink(self.log.name)


def iterator(address: str) -> int:
    """Every event through the Python iterator: one object per message."""
    n = 0
    with mdrelay.Subscriber(tcp=address, idle_timeout=30) as sub:
        for _ in sub:
            n += 1
        return sub.counters()["messages"]


def batches(address: str) -> int:
    """Arrow record batches of up to 65,536 messages."""
    n = 0
    with mdrelay.Subscriber(tcp=address, idle_timeout=30) as sub:
        for _, batch in sub.batches(max_messages=65536, timeout=1.0):
            n += batch.num_rows
    return n


def rust_subscriber(address: str) -> int:
    """mdrelay-sub, the Rust client library's program: decode, aggregate, latency histogram."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run(
            [binary("mdrelay-sub", "MDRELAY_SUB"), "--tcp", address, "--report-interval", "0",
             "--json", report.name],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )
        return json.loads(Path(report.name).read_text())["messages"]


def receiver_cpu() -> float:
    """CPU seconds of this process (the Python modes run in it) and of its finished children
    (mdrelay-sub; the publisher is not waited for until after the reading)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def machine() -> str:
    """The CPU model, cores and Python version."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--loops", type=int, default=5, help="passes over DEEP10 per run")
    ap.add_argument("--format", default="sbe")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    capture = str(IEX / "DEEP10.pcap.gz")
    modes: Dict[str, Callable[[str], int]] = {
        "mdrelay-sub (Rust)": rust_subscriber,
        "Python iterator": iterator,
        "Python Arrow batches": batches,
    }
    no_network = "read_capture of DEEP10, gzipped (Arrow, no network)"
    uncompressed = "read_capture of DEEP10, uncompressed (Arrow, no network)"
    rates: Dict[str, List[float]] = {m: [] for m in [*modes, no_network, uncompressed]}
    # CPU time of the receiving side per message: what each mode costs, whatever the publisher's
    # pace (over loopback on two cores the publisher bounds every mode's rate).
    cpu_ns: Dict[str, List[float]] = {m: [] for m in rates}
    # The same capture inflated once, so the Arrow path is measured without gzip's share.
    plain = tempfile.NamedTemporaryFile(suffix=".pcap", delete=False)
    with gzip.open(capture, "rb") as f:
        shutil.copyfileobj(f, plain)
    plain.close()
    for rep in range(args.repetitions):
        for name, run in modes.items():
            pub = Publisher(capture, args.loops, args.format)
            cpu = receiver_cpu()
            started = time.perf_counter()
            n = run(pub.address)
            took = time.perf_counter() - started
            cpu_ns[name].append((receiver_cpu() - cpu) * 1e9 / n)
            pub.finish()
            rates[name].append(n / took)
        for name, path in ((no_network, capture), (uncompressed, plain.name)):
            cpu = receiver_cpu()
            started = time.perf_counter()
            n = sum(b.num_rows for _, b in mdrelay.read_capture(path))
            rates[name].append(n / (time.perf_counter() - started))
            cpu_ns[name].append((receiver_cpu() - cpu) * 1e9 / n)
        print(f"repetition {rep + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.2f}" for k, v in rates.items()), flush=True)
    print(f"\n{machine()}; DEEP10 x {args.loops} in {args.format}, {args.repetitions} repetitions, M msg/s\n")
    print("| mode | median | min | max | receiver CPU ns per message (median) |")
    print("|---|---|---|---|---|")
    for name, values in rates.items():
        med = statistics.median(values)
        cpu_med = statistics.median(cpu_ns[name])
        print(f"| {name} | {med / 1e6:.2f} | {min(values) / 1e6:.2f} | {max(values) / 1e6:.2f} | {cpu_med:.0f} |")
    os.unlink(plain.name)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rates": rates, "cpu_ns": cpu_ns}, indent=1))


if __name__ == "__main__":
    main()

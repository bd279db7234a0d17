"""Errors arrive as exceptions subclassing mdrelay.Error, with the Rust error's kind and message."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import mdrelay
from conftest import capture


def key_file(folder: Path, name: str, byte: int) -> str:
    """A 32-byte key in hex, readable by its owner only (as the key reader demands)."""
    path = folder / name
    path.write_text(("%02x" % byte) * 32 + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_a_wrong_key_raises_wrong_key_error(publishers) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        config = folder / "pub.toml"
        config.write_text('[protection]\nkey_file = "%s"\n' % key_file(folder, "pub.key", 0x5A))
        publisher = publishers([
            "--config", str(config), "--capture", capture("TOPS16"), "--tcp", "127.0.0.1:0",
            "--wait-subscribers", "1",
        ])
        address = publisher.tcp_address()
        sub = mdrelay.Subscriber(tcp=address, key_file=key_file(folder, "other.key", 0x21), idle_timeout=20)
        with pytest.raises(mdrelay.WrongKeyError) as caught:
            for _ in sub:
                pass
    error = caught.value
    assert isinstance(error, mdrelay.Error)
    assert error.kind == "wrong_key"
    assert "another key" in error.message and address in error.message, error.message


def test_a_bad_setting_raises_config_error_naming_it() -> None:
    with pytest.raises(mdrelay.ConfigError) as caught:
        mdrelay.Subscriber(tcp="127.0.0.1:9100", recovery="127.0.0.1:9101")
    assert caught.value.kind == "config" and caught.value.setting == "recovery"
    with pytest.raises(mdrelay.Error):
        mdrelay.Subscriber(tcp="no-port-here")
    with pytest.raises(mdrelay.ConfigError):
        mdrelay.Subscriber()


def test_keyword_errors_name_the_keyword() -> None:
    cases = (
        ({"recovery_dela": 0.01}, "recovery_dela", "unknown field"),
        ({"recovery_delay": "soon"}, "recovery_delay", "not a duration"),
        ({"recovery_attempts": 2.5}, "recovery_attempts", "invalid type"),
        ({"symbols": "AAPL"}, "symbols", "invalid type"),
        ({"crc": object()}, "crc", "is not a setting's"),
        ({"recovery": "127.0.0.1:9101", "recovery_attempts": 0}, "recovery_attempts", "out of range"),
    )
    for kwargs, keyword, words in cases:
        with pytest.raises(mdrelay.ConfigError) as caught:
            mdrelay.Subscriber(udp="127.0.0.1:0", **kwargs)
        assert caught.value.setting == keyword, (kwargs, caught.value.message)
        assert words in caught.value.message, (kwargs, caught.value.message)


def test_keywords_take_the_library_settings_units_and_paths(tmp_path) -> None:
    # A duration with its unit, a path-like object and a tuple are each taken as the library's
    # settings read from a file take them: the subscriber is built (and its key file read).
    key = tmp_path / "wire.key"
    key.write_text("11" * 32)
    key.chmod(0o600)
    with mdrelay.Subscriber(
        udp="127.0.0.1:0", recovery="127.0.0.1:9101", recovery_delay="10ms", key_file=key, symbols=("AAPL",)
    ):
        pass
    with pytest.raises(mdrelay.ConfigError) as caught:
        mdrelay.Subscriber(udp="127.0.0.1:0", key_file=tmp_path / "missing.key")
    assert caught.value.setting == "key_file" and "missing.key" in caught.value.message


def test_an_unreadable_capture_raises_capture_error() -> None:
    with pytest.raises(mdrelay.CaptureError) as caught:
        mdrelay.read_capture("/nonexistent/day.pcap")
    assert caught.value.kind == "capture"


def test_nothing_arriving_within_idle_timeout_raises(publishers) -> None:
    # Waits for two subscribers, so it sends nothing to this one.
    publisher = publishers(["--capture", capture("TOPS16"), "--tcp", "127.0.0.1:0", "--wait-subscribers", "2"])
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=0.5) as sub:
        with pytest.raises(mdrelay.IdleTimeoutError):
            for _ in sub:
                pass


def test_an_unknown_profile_or_idle_strategy_raises_config_error() -> None:
    for kwargs, setting in (({"profile": "fastest"}, "profile"), ({"idle": "nap"}, "idle")):
        with pytest.raises(mdrelay.ConfigError) as caught:
            mdrelay.Subscriber(tcp="127.0.0.1:9100", **kwargs)
        assert caught.value.setting == setting


def test_next_event_returns_none_when_its_timeout_passes(publishers) -> None:
    publisher = publishers(["--capture", capture("TOPS16"), "--tcp", "127.0.0.1:0", "--wait-subscribers", "2"])
    with mdrelay.Subscriber(tcp=publisher.tcp_address(), idle_timeout=20) as sub:
        events = []
        while True:
            event = sub.next_event(timeout=0.3)
            if event is None:
                break
            events.append(event)
            assert len(events) < 10, events
    assert all(isinstance(e, (mdrelay.Connected, mdrelay.Notice, mdrelay.FormatChanged)) for e in events), events

"""Free ports come from a span below the kernel's ephemeral ports (which outgoing connections
take), and the test workers each get a span of their own, so no two pick the same port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dept.config import ConfigError
from server_app.local_runtime import PORT_SPAN, PORT_SPAN_VARIABLE, free_port, port_span
from tests.scheduling import worker_port_span


def test_a_free_port_is_in_the_span_and_bindable() -> None:
    port = free_port({PORT_SPAN_VARIABLE: "24000-24099"})
    assert 24000 <= port <= 24099
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_passed_over() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"no free loopback port .* {port}-{port}"):
            free_port({PORT_SPAN_VARIABLE: f"{port}-{port}"})


def test_the_default_span_is_below_the_ephemeral_ports() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert port_span("") == PORT_SPAN and PORT_SPAN.stop <= low


@pytest.mark.parametrize("text", ["20000", "b-c", "3000-2000", "0-10", "1-70000"])
def test_a_bad_span_is_named(text: str) -> None:
    with pytest.raises(ConfigError, match=f"{PORT_SPAN_VARIABLE}={text!r}"):
        port_span(text)


def test_each_test_worker_has_its_own_span() -> None:
    spans = [port_span(worker_port_span(f"gw{i}", 3)) for i in range(3)]
    assert all(s.start >= PORT_SPAN.start and s.stop <= PORT_SPAN.stop for s in spans)
    assert not set(spans[0]) & set(spans[1]) and not set(spans[1]) & set(spans[2])

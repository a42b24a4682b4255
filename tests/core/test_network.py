"""Where a server listens: loopback is decided on the address a host resolves to, not on its spelling, and a
taken or impossible port is a ConfigError naming it before anything slow starts."""

from __future__ import annotations

import socket

import pytest

from gym.core.errors import ConfigError
from gym.core.network import bind_sockets, check_port, is_loopback, ready_to_listen


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "127.0.0.2", "127.255.255.254", "0177.0.0.1", "0x7f000001",
                                  "localhost", "LOCALHOST", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"])
def test_loopback_spellings(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::", "", "0:0:0:0:0:0:0:0", "0x0", "10.0.0.1", "192.168.1.20",
                                  "172.16.0.1", "8.8.8.8", "::ffff:10.0.0.1", "::ffff:0.0.0.0", "fe80::1",
                                  "2001:db8::1"])
def test_every_interface_and_other_addresses_are_not_loopback(host):
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["256.1.1.1", "[::1]", "no-such-host.invalid", "127.0.0.1 "])
def test_a_host_that_does_not_resolve_is_a_config_error(host):
    with pytest.raises(ConfigError, match="--host"):
        is_loopback(host)


@pytest.mark.parametrize("port", [-1, 0, 65536, 70000])
def test_ports_outside_1_to_65535_are_refused(port):
    with pytest.raises(ConfigError, match=r"--port .*1 to 65535"):
        check_port("127.0.0.1", port)


def test_a_port_held_by_another_socket_is_refused_and_a_free_one_is_handed_over():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} .*in use"):
            check_port("127.0.0.1", port)
        with pytest.raises(ConfigError, match="in use"):
            bind_sockets("localhost", port)
    sockets = bind_sockets("127.0.0.1", port)  # released: now it can be had, and stays ours until closed
    try:
        assert [s.getsockname()[1] for s in sockets] == [port]
        with pytest.raises(ConfigError, match="in use"):
            check_port("127.0.0.1", port)  # held though not listening: another server's bind (SO_REUSEADDR) fails
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    finally:
        for s in sockets:
            s.close()
    check_port("127.0.0.1", port)


def test_a_port_left_in_time_wait_by_a_previous_run_can_be_held_and_listened_on():
    """A server restarted right after it stopped finds its port in TIME_WAIT; uvicorn gets past that, so must we."""
    previous = socket.socket()
    previous.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    previous.bind(("127.0.0.1", 0))
    previous.listen()
    port = previous.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = previous.accept()
    accepted.close()  # the server closes first: its side of the connection stays in TIME_WAIT
    client.close()
    previous.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the port is in TIME_WAIT (else this test proves nothing)
    sockets = ready_to_listen(bind_sockets("127.0.0.1", port))
    try:
        sockets[0].listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        for s in sockets:
            s.close()


def test_every_interface_binds_both_families_where_the_machine_has_ipv6():
    sockets = bind_sockets("", _free_port())
    try:
        families = {s.family for s in sockets}
        assert socket.AF_INET in families
        assert all(s.getsockname()[0] in ("0.0.0.0", "::") for s in sockets)
    finally:
        for s in sockets:
            s.close()


def test_an_address_not_on_this_machine_is_refused():
    with pytest.raises(ConfigError, match="192.0.2.1.*not an address of this machine"):
        check_port("192.0.2.1", _free_port())  # TEST-NET-1: never assigned to a host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port

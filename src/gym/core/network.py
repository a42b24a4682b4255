"""Where a server listens: whether a host is this machine only (loopback), and the port taken before anything slow.

Loopback is decided on the addresses a host resolves to, never on its spelling: "0", "0.0.0.0", "::", "" and a
LAN name all reach beyond the machine, while "127.1", "0x7f000001", "::1" and "localhost" do not. `gym webui`
refuses to serve beyond the machine without a password, so a check on the literal "0.0.0.0" let `--host 0` through.

`gym api` and `gym webui` take their port before loading a model or building the page: a port that is in use,
out of range, or on an address this machine does not have is one ConfigError naming the flag, not a traceback
(or uvicorn's exit 3) after minutes of loading. The sockets are bound as asyncio's `create_server` binds a host
(every address it resolves to, SO_REUSEADDR, IPv6 sockets IPv6-only), so the check fails exactly where the
server would; `gym api` then serves on those very sockets, so nothing can take the port in between.

Holding a port without listening on it: SO_REUSEADDR lets our bind past the TIME_WAIT connections a previous
run left (as uvicorn does), but two bound sockets that both have it may share a port until one listens. So it is
cleared once bound (Linux checks the holder's flag as well: no other program can bind the port now) and set
again just before listening (listen() checks the port again, and would fail on those TIME_WAIT connections).
Until then connections are refused, as they were while the model loaded, rather than queued.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

from gym.core.errors import ConfigError

# (family, socket address); the address's shape depends on the family, as getaddrinfo gives it
_Address = tuple[socket.AddressFamily, Any]


def _addresses(host: str, port: int = 0) -> list[_Address]:
    """Every (family, socket address) `host` resolves to, as a server binds it; "" is every interface."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"--host {host}: not an address or a name this machine resolves ({exc}). Use 127.0.0.1 "
                          "for this machine only.") from None
    unique: dict[_Address, None] = {}
    for family, _, _, _, address in found:
        unique[(family, address)] = None
    return list(unique)


def _is_loopback_address(text: str) -> bool:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 scope ("fe80::1%eth0") is not part of it
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 (Python < 3.13 says otherwise)
    return address.is_loopback


def host_addresses(host: str) -> list[str]:
    """The addresses `host` resolves to, as a server would bind them ("0" -> 0.0.0.0)."""
    return list(dict.fromkeys(str(address[0]) for _, address in _addresses(host)))


def is_loopback(host: str) -> bool:
    """True when every address `host` resolves to is a loopback address (127.0.0.0/8, ::1): only this machine can
    connect. The unspecified addresses (0.0.0.0, ::) mean every interface and are not loopback."""
    return all(_is_loopback_address(address) for address in host_addresses(host))


def check_port_number(port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: a port is a number from 1 to 65535.")


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """The port, taken: one bound (not yet listening) socket per address of `host`. The caller serves on them or
    closes them. A ConfigError that names --host or --port when the port cannot be had."""
    check_port_number(port)
    sockets: list[socket.socket] = []
    try:
        for family, address in _addresses(host, port):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a TIME_WAIT port is free
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)  # held: see the module's docstring
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise _bind_error(host, port, exc) from None
    return sockets


def ready_to_listen(sockets: list[socket.socket]) -> list[socket.socket]:
    """The held sockets, ready for the server's listen()."""
    for sock in sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sockets


def check_port(host: str, port: int) -> None:
    """Raise the ConfigError `bind_sockets` would; for a server that binds by itself (Gradio)."""
    for sock in bind_sockets(host, port):
        sock.close()


def _bind_error(host: str, port: int, exc: OSError) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"--port {port}: port {port} on {host or 'every interface'} is in use by another program. "
                           "Stop it, or choose another --port.")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ConfigError(f"--port {port}: binding port {port} is not permitted here (ports below 1024 need root). "
                           "Choose a port from 1024 to 65535.")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"--host {host}: not an address of this machine, so nothing can listen on it. Use "
                           "127.0.0.1 for this machine only, or one of its own addresses.")
    return ConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}).")

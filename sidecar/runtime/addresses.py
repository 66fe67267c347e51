"""Network addresses as the settings and flags spell them: one parser for each form.

- ``host:port`` (an IPv6 host in brackets, ``[::1]:9001``): ``--metrics``,
  ``proxy --listen``, Envoy's admin address;
- ``unix:/path`` or ``host:port``: ``listen.grpc``, where the sidecar serves;
- ``http://host[:port]`` and ``https://host[:port]``: the proxy's upstream and
  a JWKS URL, the port defaulting to the scheme's.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

UNIX_PREFIX = "unix:"
_HIGHEST_PORT = 65535


class HostPort(NamedTuple):
    """A TCP address; the host is kept without IPv6 brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def family(self) -> socket.AddressFamily:
        """The socket family that reaches this host (a host name is taken for IPv4)."""
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET


@dataclass(frozen=True, slots=True)
class UnixSocket:
    """A unix domain socket address (``unix:/path``)."""

    path: str

    def __str__(self) -> str:
        return UNIX_PREFIX + self.path


@dataclass(frozen=True, slots=True)
class HttpEndpoint:
    """What an ``http(s)://`` URL points at."""

    host: str
    port: int
    tls: bool
    path: str


def parse_host_port(value: str, *, default_port: int | None = None) -> HostPort:
    """Parse ``host:port`` or ``[v6]:port``; raise ValueError naming the value.

    With ``default_port`` the port may be left out (``host``, ``[v6]``).
    """
    error = ValueError(f"expected host:port, got {value!r}")
    host, port = _split(value)
    if not host or "[" in host or "]" in host:
        raise error
    if port is None:
        if default_port is None:
            raise error
        return HostPort(host, default_port)
    if not (port.isascii() and port.isdigit()) or int(port) > _HIGHEST_PORT:
        raise error
    return HostPort(host, int(port))


def _split(value: str) -> tuple[str, str | None]:
    """Host and port text; the port is None when there is none ("" when it is empty)."""
    if value.startswith("["):
        host, close, rest = value[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return "", None
        return host, rest[1:] if rest else None
    host, sep, port = value.rpartition(":")
    return (host, port) if sep else (value, None)


def parse_socket_address(value: str) -> HostPort | UnixSocket:
    """Parse ``unix:/path`` or ``host:port``; raise ValueError naming the value."""
    if value.startswith(UNIX_PREFIX):
        return UnixSocket(value.removeprefix(UNIX_PREFIX))
    return parse_host_port(value)


def reachable_from_elsewhere(address: HostPort | UnixSocket) -> bool:
    """True for a TCP address other hosts can reach: not a loopback IP nor ``localhost``."""
    if isinstance(address, UnixSocket) or address.host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(address.host).is_loopback
    except ValueError:
        return True  # a host name, which may resolve to any interface


def parse_http_url(url: str) -> HttpEndpoint:
    """Parse ``http://host[:port]/path`` or ``https://...``; raise ValueError naming the URL.

    The host is lower-cased (host names are case-insensitive; it becomes the
    TLS server name). Credentials in the URL are refused, not dropped.
    """
    shown = _without_userinfo(url)
    error = ValueError(f"expected an http:// or https:// URL, got {shown!r}")
    try:
        parts = urlsplit(url)  # raises ValueError on a malformed [v6] host
    except ValueError:
        raise error from None
    if parts.scheme not in ("http", "https"):
        raise error
    if "@" in parts.netloc:
        raise ValueError(f"credentials in a URL are not accepted: {shown!r}")
    tls = parts.scheme == "https"
    try:
        address = parse_host_port(parts.netloc, default_port=443 if tls else 80)
    except ValueError:
        raise error from None
    return HttpEndpoint(address.host.lower(), address.port, tls, parts.path)


def _without_userinfo(url: str) -> str:
    """``url`` with anything before an ``@`` in its authority replaced by ``***``.

    The refused URL is quoted in errors, which reach the terminal and logs: a
    password in it must not.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"

"""Listen and service addresses (meshplane.netaddr): TCP ports and Unix sockets, as tables."""

from __future__ import annotations

import pytest

from meshplane.netaddr import (
    ServiceAddress,
    check_serve_listen,
    parse_service_uri,
    unix_listen_path,
)


@pytest.mark.parametrize(
    ("listen", "path"),
    [
        ("127.0.0.1:8081", None),
        ("unix:/run/mp/rl.sock", "/run/mp/rl.sock"),
        ("unix:///run/mp/rl.sock", "/run/mp/rl.sock"),
    ],
)
def test_unix_listen_paths(listen: str, path: str | None) -> None:
    assert unix_listen_path(listen) == path


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("unix:rl.sock", "unix:/ABSOLUTE/PATH"),
        ("unix://host/rl.sock", "unix:/ABSOLUTE/PATH"),
        ("unix:/" + "x" * 107, "at most 107 bytes"),
    ],
)
def test_bad_unix_listen_paths_are_refused_naming_them(listen: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unix_listen_path(listen)


def test_a_socket_is_served_by_one_worker_a_port_by_many() -> None:
    check_serve_listen("127.0.0.1:8081", 4)
    check_serve_listen("unix:/run/mp/rl.sock", 1)
    with pytest.raises(ValueError, match="one worker"):
        check_serve_listen("unix:/run/mp/rl.sock", 2)
    with pytest.raises(ValueError, match="HOST:PORT"):
        check_serve_listen("rl.sock", 1)


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("grpc://ratelimit:8081", ServiceAddress("ratelimit", 8081)),
        ("grpc://127.0.0.1:9191/", ServiceAddress("127.0.0.1", 9191)),
        ("unix:///run/mp/extauthz.sock", ServiceAddress(path="/run/mp/extauthz.sock")),
    ],
)
def test_service_uris(uri: str, address: ServiceAddress) -> None:
    assert parse_service_uri(uri) == address


@pytest.mark.parametrize(
    "uri",
    [
        "http://x:1",
        "grpc://host",
        "grpc://host:0",
        "grpc://host:1/path",
        "grpc://u@host:1",
        "grpc://host:1?q",
        "unix:rl.sock",
        "unix://host/rl.sock",
        "unix:///run/rl.sock?x",
        "unix:///" + "x" * 120,
        "",
    ],
)
def test_bad_service_uris_are_refused(uri: str) -> None:
    with pytest.raises(ValueError, match=r"grpc://HOST:PORT or unix:///ABSOLUTE/PATH|107 bytes"):
        parse_service_uri(uri)

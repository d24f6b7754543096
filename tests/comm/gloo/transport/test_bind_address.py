"""``NEURAL_ARCH_BIND_ADDR``: an address, a host name, or a network interface's name (one setting for
every node of a cluster); anything else is an error that lists this host's interfaces."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from neural_arch.distributed.comm.gloo.transport.tcp import bind_address, connect_tcp_links, resolve_bind_address
from neural_arch.distributed.rendezvous.store import TCPStore

FAKE = {"lo": ["127.0.0.1"], "eth0": ["10.1.2.3", "10.1.2.4"], "ib0": []}


def _no_dns(host, *args, **kwargs):
    """Every name unknown at once: a test must not wait on a network's resolver."""
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_an_interface_name_gives_its_ipv4_address():
    assert resolve_bind_address("eth0", FAKE) == "10.1.2.3"
    assert resolve_bind_address(" lo ", FAKE) == "127.0.0.1"


def test_addresses_and_host_names_are_kept():
    assert resolve_bind_address("10.9.9.9", FAKE) == "10.9.9.9"
    assert resolve_bind_address("::1", FAKE) == "::1"
    assert resolve_bind_address("localhost", FAKE) == "localhost"


def test_an_unknown_name_lists_the_interfaces(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _no_dns)
    with pytest.raises(ValueError, match=r"'eth7' is neither.*interfaces: eth0 \(10\.1\.2\.3, 10\.1\.2\.4\), "
                                         r"ib0 \(no IPv4\), lo \(127\.0\.0\.1\)"):
        resolve_bind_address("eth7", FAKE)
    with pytest.raises(ValueError, match="'ib0': the interface has no IPv4 address"):
        resolve_bind_address("ib0", FAKE)


def test_two_ranks_connect_on_the_loopback_interface_named(monkeypatch):
    """The real interfaces (psutil): ``lo`` -> 127.0.0.1, and a TCP mesh forms there."""
    monkeypatch.setenv("NEURAL_ARCH_BIND_ADDR", "lo")
    assert bind_address() == "127.0.0.1"
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=30)
    links: dict = {}
    try:
        def connect(rank):
            links[rank] = connect_tcp_links(store, rank, [1 - rank], time.monotonic() + 30, auth_token=b"k" * 32)

        threads = [threading.Thread(target=connect, args=(rank,)) for rank in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(links) == [0, 1]
        for rank in (0, 1):
            assert store.get(f"transport/tcp/{rank}").decode().startswith("127.0.0.1:")
    finally:
        for peer_links in links.values():
            for link in peer_links.values():
                link.close()
        store.close()
    monkeypatch.setenv("NEURAL_ARCH_BIND_ADDR", "no-such-interface-0")
    monkeypatch.setattr(socket, "getaddrinfo", _no_dns)
    with pytest.raises(ValueError, match="interfaces: .*lo \\(127\\.0\\.0\\.1"):
        bind_address()

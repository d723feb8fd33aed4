"""day0.core.sockets.free_port: the one way day0 picks a port for a server it starts, below the
kernel's ephemeral range so that no connection the host opens meanwhile takes it."""

from __future__ import annotations

import socket

from day0.core.sockets import PORT_FLOOR, ephemeral_low, free_port


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def test_a_port_is_picked_below_the_ephemeral_range_and_is_free():
    low = ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(PORT_FLOOR <= p < low for p in ports), (ports, low)
    assert len(ports) > 1  # picked at random, so two servers started together rarely try the same one
    assert all(bindable(p) for p in ports)


def test_a_taken_port_is_skipped():
    first = next(p for p in range(20000, 30000, 2) if bindable(p) and bindable(p + 1))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert free_port(floor=first, low=first + 2) == first + 1  # 64 tries at one in two


def test_with_no_room_below_the_range_the_kernel_picks(tmp_path):
    port = free_port(low=PORT_FLOOR)
    assert port >= ephemeral_low() and bindable(port)  # bind(0): from the ephemeral range
    table = tmp_path / "ip_local_port_range"
    table.write_text("40000\t60999\n")
    assert ephemeral_low(table) == 40000
    assert ephemeral_low(tmp_path / "absent") == 32768

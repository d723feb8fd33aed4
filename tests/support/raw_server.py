"""A labelled stand-in for whatever may listen on a port: a TCP server that reads each request and
answers it with a scripted function, for tests of what day0 does with bytes that are not the
server it expects (an endless answer, a drip, a protocol that is not HTTP)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


def raw_server(answer: Callable[[socket.socket], None]) -> tuple[socket.socket, str]:
    """(the listening socket, its http:// URL); each connection on a thread of its own. Close the
    socket to stop it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hung up: the answer ends there
            conn.recv(65536)
            answer(conn)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"

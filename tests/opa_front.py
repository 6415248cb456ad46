"""A loopback TCP port in front of an embedded OPA, for tests that need a "remote" OPA.

The embedded OPA listens only on a Unix domain socket in its private work directory; a test
that plays a remote server (``--opa-url http://127.0.0.1:PORT``) reaches it through this
forwarder, which copies bytes both ways and adds nothing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tcp_front(opa: Any) -> Iterator[int]:
    """The port of a listener on 127.0.0.1 that forwards each connection to ``opa``'s socket."""
    opa._ensure_started()  # its client names the socket
    path = opa._client.unix_path
    assert path is not None
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(path)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()

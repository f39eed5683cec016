"""A small TCP front for several backends: what a Kubernetes Service is in production.

Each accepted connection goes to the first backend, in order, that accepts a
connection, and bytes are copied both ways until either side closes. A
backend that died (refuses connections) is skipped, so a client that
reconnects lands on the next live one. Used to give meshplane-agent one
address for several mgmt-api replicas. Loopback only; closed by ``close()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.net import free_port


class TcpFront:
    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _connect(self) -> socket.socket | None:
        for port in self.backends:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = self._connect()
            if backend is None:
                client.close()
                continue
            backend.settimeout(None)
            with self._lock:
                self._sockets += [client, backend]
            for src, dst in ((client, backend), (backend, client)):
                threading.Thread(target=self._copy, args=(src, dst), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):  # one side closed or failed: end the pair
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self._thread.join(timeout=10)

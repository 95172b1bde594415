"""What stands between the first token and the client, pinned without timing:
the accepted connections run without Nagle's algorithm."""

from __future__ import annotations

import socket


def test_accepted_connections_send_without_nagle(serve, tiny_model):
    server = serve(tiny_model)
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(12) == b"HTTP/1.1 200"
        (connection,) = server.server.server_state.connections  # uvicorn's protocol for this client
        accepted = connection.transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0

"""The REST listening socket hands asyncio connections with TCP_NODELAY set.

Without it a response that follows a small write waits for the client's
delayed ACK (Nagle), which put about 40 ms on every REST request."""

from __future__ import annotations

import asyncio
import socket

from trainyard_gateway.main import bind_http, http_server


async def test_accepted_connections_have_nodelay() -> None:
    sock = bind_http("127.0.0.1", 0)
    flags: asyncio.Queue[int] = asyncio.Queue()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        flags.put_nowait(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=sock)
    try:
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(flags.get(), 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_port_in_use_names_the_address() -> None:
    first = bind_http("127.0.0.1", 0)
    first.listen()
    try:
        port = first.getsockname()[1]
        try:
            bind_http("127.0.0.1", port)
        except OSError as err:
            assert f"127.0.0.1:{port}" in str(err)
        else:
            raise AssertionError("a second bind on a listening port succeeded")
    finally:
        first.close()


def test_the_rest_server_parses_http_with_httptools() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    server = http_server(lambda scope, receive, send: None, "127.0.0.1", 0, 1.0)
    server.config.load()
    assert server.config.http_protocol_class is HttpToolsProtocol

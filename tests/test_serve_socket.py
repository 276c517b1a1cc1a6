"""``millm serve``'s listening socket: each connection it accepts sends without Nagle's delay.

asyncio sets TCP_NODELAY on an accepted connection only when the socket says it is TCP
(``proto == IPPROTO_TCP``). A socket made with proto 0 left Nagle on, so a keep-alive
request's response (headers, then body: two writes) waited for the client's delayed ACK:
about 40 ms on every request after a connection's first.
"""

from __future__ import annotations

import asyncio
import socket

from millm_host import cli


def test_accepted_connections_have_tcp_nodelay():
    listening = cli._bind("127.0.0.1", 0)
    assert listening.proto == socket.IPPROTO_TCP
    port = listening.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listening)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0

"""The socket ``millm serve`` listens on: replies leave at once on a kept-alive connection.

A reply is written in parts (headers, then the body). Without TCP_NODELAY the
second part waits for the client's ACK of the first, which a kept-alive
connection delays by about 40 ms: every request after the first paid that
(``/v1/models`` took 47 ms instead of 1). asyncio sets TCP_NODELAY only on
sockets made with ``IPPROTO_TCP``; ``_bind`` now names it and sets the option on
the listener too. Timing is the benches' business; this checks the option itself
on a connection accepted the way uvicorn accepts it (``loop.create_server(sock=...)``).
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from millm_host.cli import _bind


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_accepted_connections_send_without_delay(host):
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        listener = _bind(host, 0)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}: {exc}")

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(host, listener.getsockname()[1])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            return value

    assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    with ThreadPoolExecutor(1) as pool:  # a loop of its own: a browser test may have left one running here
        nodelay = pool.submit(asyncio.run, accepted_nodelay()).result()
    assert nodelay, "accepted connections wait for delayed ACKs (no TCP_NODELAY)"

"""The GGUF engine's child process: one llama.cpp model, driven over a socket by ``ProcessEngine``.

Started as ``python -m millm_engine_gguf.worker FD``. A native crash here
(SIGSEGV, SIGILL, an abort in llama.cpp) ends only this process: the server
fails the requests in flight and starts another. Its life is the server's: it
ignores the terminal's and the service manager's SIGINT/SIGTERM (the server
closes it), and leaves by itself when the socket closes or its parent process
changes (checked twice a second, even mid-computation), so it is never orphaned.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import threading
import time
from array import array
from multiprocessing.connection import Connection

from . import wire
from .cpu import amx_flags, llama_system_info
from .engine import GGUFEngine


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    conn = Connection(int(args[0]))
    faulthandler.enable()  # a native crash prints the Python stack to the server's log, then dies as before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _leave_with_parent(os.getppid())
    try:
        frame = conn.recv_bytes()
    except EOFError:
        return 0
    descriptor, options = wire.unpack(frame)

    def progress(message: str) -> None:
        conn.send_bytes(wire.PROGRESS + message.encode("utf-8"))

    try:
        progress(
            f"llama.cpp in process {os.getpid()}: {llama_system_info()}; "
            f"CPU reports AMX: {' '.join(amx_flags()) or 'no'}"
        )
        engine = GGUFEngine.load_with(descriptor, options, progress)
    except Exception as exc:
        conn.send_bytes(wire.error_frame(exc))
        return 1
    try:
        conn.send_bytes(wire.pack(wire.LOADED, (engine.info, engine.embedding_window)))
        Worker(conn, engine).serve()
    except (EOFError, OSError):
        pass  # the server went away
    finally:
        engine.close()
    return 0


def _leave_with_parent(parent: int) -> None:
    """Exit as soon as the parent is gone (a thread: ctypes releases the GIL during llama.cpp calls)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Worker:
    """Answers the server's frames, one request at a time."""

    def __init__(self, conn: Connection, engine: GGUFEngine) -> None:
        self.conn = conn
        self.engine = engine
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)

    def serve(self) -> None:
        conn = self.conn
        while True:
            frame = conn.recv_bytes()
            tag = frame[:1]
            if tag == wire.GENERATE:
                self.generate(*wire.unpack(frame))
            elif tag == wire.EMBED:
                try:
                    vector = self.engine.embed(*wire.unpack(frame))
                    conn.send_bytes(wire.VECTOR + array("f", vector).tobytes())
                except Exception as exc:
                    conn.send_bytes(wire.error_frame(exc))
            elif tag == wire.CLOSE:
                return
            # a STOP that crossed the END of its generation: nothing left to stop

    def generate(self, prompt: list[int], params, vectors) -> None:
        conn, send = self.conn, self.conn.send_bytes
        stops = self.engine.info.eos_token_ids
        count = 0
        try:
            tokens = self.engine.generate_checked(prompt, params, vectors)  # checked by the server
            try:
                for token in tokens:
                    count += 1
                    # Where the host most likely stops, wait for its word instead of computing on.
                    if token in stops or count >= params.max_tokens:
                        send(wire.token_frame(wire.PAUSED, token))
                        if conn.recv_bytes() != wire.CONTINUE:
                            break
                    else:
                        send(wire.token_frame(wire.TOKEN, token))
                        if self._poll.poll(0) and conn.recv_bytes() == wire.STOP:
                            break
            finally:
                tokens.close()
        except Exception as exc:
            send(wire.error_frame(exc))
            return
        send(wire.END)


if __name__ == "__main__":
    sys.exit(main())

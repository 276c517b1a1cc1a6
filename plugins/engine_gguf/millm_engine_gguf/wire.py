"""The socket between ``ProcessEngine`` (the server) and its worker (the child): frames and errors.

Each message is one ``multiprocessing.connection.Connection`` frame whose first
byte says what it is. Requests are pickled once each; a generated token travels
as 5 raw bytes (its tag and a little-endian int32), never pickled; with logprobs
(a ``GeneratedToken``) its float32 logprob follows, then an (int32 id, float32
logprob) pair per alternative.

Generation, seen from the server::

    -> GENERATE (prompt, SamplingParams, control vectors: {layer: float32 bytes})
    <- CACHED n    (the prompt's first n tokens were found in the KV cache, not decoded)
    <- TOKEN t ... (the child runs ahead, one frame per token)
    <- PAUSED t    (an end-of-generation token, or max_tokens reached:
                    the child waits for CONTINUE or STOP instead of computing on)
    -> STOP        (any time: the child stops at its next token)
    <- END | ERROR (last frame of every generation)

The server reads the frames after its STOP (up to END) when it
sends its next request, not before it answers. A STOP that arrives after END
is ignored.

With ``GGUF_PARALLEL`` > 1 the child serves several generations at once, so each
of their frames carries the generation's key (a little-endian uint32 the server
chose) after its tag: ``ROW_GENERATE`` (key, prompt, params, vectors),
``ROW_TOKEN``/``ROW_PAUSED`` (key, then a token as above), ``ROW_CACHED`` (key,
then a count as CACHED has it), ``ROW_CONTINUE``, ``ROW_STOP``, ``ROW_END``, ``ROW_ERROR``
(key, then an ERROR frame's body). The frames a step gives several generations come as
one ``BUNDLE`` (``bundle``). The flow
per key is the one above; EMBED is answered between two decode steps. Loading: LOAD, PROGRESS..., then
LOADED or ERROR. The child sets the control vectors before the first token
and clears them after END or ERROR. Embedding: EMBED, then VECTOR (float32 bytes) or ERROR.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

from millm_host.api import GeneratedToken, MillmError, TokenLogprob

LOAD, PROGRESS, LOADED = b"l", b"o", b"r"
GENERATE, TOKEN, PAUSED, CONTINUE, STOP, END = b"g", b"t", b"p", b"c", b"s", b"e"
EMBED, VECTOR = b"m", b"v"
ERROR, CLOSE = b"x", b"q"
ROW_GENERATE, ROW_TOKEN, ROW_PAUSED, ROW_CONTINUE, ROW_STOP, ROW_END = b"G", b"T", b"P", b"C", b"S", b"E"
ROW_ERROR = b"X"
CACHED, ROW_CACHED = b"k", b"K"
BUNDLE = b"B"


_LOGPROB = struct.Struct("<f")
_ALTERNATIVE = struct.Struct("<if")


def token_frame(tag: bytes, token: int) -> bytes:
    frame = tag + int(token).to_bytes(4, "little")
    if isinstance(token, GeneratedToken):
        frame += _LOGPROB.pack(token.logprob)
        frame += b"".join(_ALTERNATIVE.pack(alt.token_id, alt.logprob) for alt in token.top)
    return frame


def frame_token(frame: bytes) -> int:
    """The token a TOKEN or PAUSED frame carries: a ``GeneratedToken`` when it has logprobs."""
    token = int.from_bytes(frame[1:5], "little")
    if len(frame) == 5:
        return token
    (logprob,) = _LOGPROB.unpack_from(frame, 5)
    top = [TokenLogprob(i, lp) for i, lp in _ALTERNATIVE.iter_unpack(frame[5 + _LOGPROB.size :])]
    return GeneratedToken(token, logprob, top)


def cached_frame(tag: bytes, count: int) -> bytes:
    """A CACHED frame (``tag`` CACHED, or b"" for a keyed one's body): ``count`` prompt tokens reused."""
    return tag + count.to_bytes(4, "little")


def frame_cached(frame: bytes) -> int:
    return int.from_bytes(frame[1:5], "little")


def pack(tag: bytes, value: Any) -> bytes:
    return tag + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(frame: bytes) -> Any:
    return pickle.loads(frame[1:])


def error_frame(exc: BaseException) -> bytes:
    """An ERROR frame: a ``MillmError`` keeps its class and fields; anything else its name and message."""
    if isinstance(exc, MillmError):
        try:
            return pack(ERROR, ("millm", type(exc), exc.message, dict(vars(exc))))
        except Exception:  # an unpicklable field: send what the client would see
            pass
    return pack(ERROR, ("other", type(exc).__name__, str(exc), None))


def frame_error(frame: bytes) -> Exception:
    """The exception an ERROR frame carries (``RuntimeError`` for anything not a ``MillmError``)."""
    kind, cls, message, fields = unpack(frame)
    if kind == "millm":
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.__dict__.update(fields)
        return error
    return RuntimeError(message if cls == "RuntimeError" else f"{cls}: {message}")


def keyed(tag: bytes, key: int, body: bytes = b"") -> bytes:
    """A parallel-mode frame: ``tag``, the generation's key, then ``body`` (an unkeyed frame less its tag)."""
    return tag + key.to_bytes(4, "little") + body


def bundle(frames: list[bytes]) -> bytes:
    """One frame carrying ``frames`` (a step's keyed frames: one write, one read), each after its 2-byte length."""
    return BUNDLE + b"".join(len(frame).to_bytes(2, "little") + frame for frame in frames)


def unbundle(frame: bytes) -> list[bytes]:
    parts, at = [], 1
    while at < len(frame):
        size = int.from_bytes(frame[at : at + 2], "little")
        parts.append(frame[at + 2 : at + 2 + size])
        at += 2 + size
    return parts


def frame_key(frame: bytes) -> tuple[int, bytes]:
    """A keyed frame's key, and the frame as it would be unkeyed (its tag, then its body)."""
    return int.from_bytes(frame[1:5], "little"), frame[:1] + frame[5:]

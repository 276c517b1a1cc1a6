"""The rule runner: a separate process that runs operator code (``code_rule``) under wasmtime.

Started and supervised by the server (``code_runner.CodeRunner``) as
``python -m millm_rulesets.code_worker '<limits JSON>'``; never imported by the
server for running code. It reads one JSON request per line on stdin and writes
one JSON answer per line on stdout:

- request ``{"id": n, "source": {"wat": "..."} | {"wasm": "<base64>"}, "text": "..."}``
- answer ``{"id": n, "count": k}`` or ``{"id": n, "code": "rule_…", "detail": "..."}``

The ABI (``mi.ruleset/v1`` code_rule, FORMATS.md) and the choices this runner
makes where the format is silent:

- The module exports ``memory`` and ``count(ptr: i32, len: i32) -> i32``. It may
  import nothing: the runner offers no host functions, so any import is
  ``rule_load_refused`` (as is WAT or wasm that does not compile, a missing
  export, or ``count`` taking other parameters).
- Each call gets a fresh instance (no state survives between calls). The runner
  grows the exported memory by just enough pages for the text and writes its
  UTF-8 bytes at the start of the new pages: ``ptr`` is that offset, ``len`` the
  byte length. Nothing the module owns is overwritten.
- The answer must be one i32 with ``0 <= count <= len`` (a count of non-empty,
  non-overlapping matches cannot exceed the byte length; an empty text allows
  0 only). Anything else (negative, oversized, another result type) is
  ``rule_output_invalid``.
- Limits: fuel (``rule_resource_limit``), memory pages for the whole instance,
  the text's pages included (``rule_resource_limit``; wasm's ``memory.grow``
  fails softly with -1, so a call that ends with its memory at the ceiling is
  taken to have run out of memory), the wasm stack (``rule_resource_limit``),
  the wall time per call by epoch interruption (``rule_timeout``) and the text's
  byte length (``rule_input_too_large``). Any other trap is ``rule_error``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

import wasmtime

PAGE = 65536
CACHE_SIZE = 64  # compiled modules kept, by source digest
RESOURCE_TRAPS = {wasmtime.TrapCode.OUT_OF_FUEL: "fuel", wasmtime.TrapCode.STACK_OVERFLOW: "stack"}


@dataclass(frozen=True)
class Limits:
    fuel: int
    memory_pages: int
    stack_bytes: int
    wall_ms: float
    max_input_bytes: int


class Refused(Exception):
    """A call's failure, with the runner's own code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass(frozen=True)
class Loaded:
    module: wasmtime.Module
    result_ok: bool  # count returns exactly one i32


class Alarm:
    """Interrupts the running call at its wall time (epoch interruption); a stale alarm does nothing."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self.engine, self.lock, self.armed = engine, threading.Lock(), 0

    def arm(self, seconds: float) -> threading.Timer:
        with self.lock:
            self.armed += 1
            timer = threading.Timer(seconds, self._fire, (self.armed,))
        timer.daemon = True
        timer.start()
        return timer

    def disarm(self, timer: threading.Timer) -> None:
        with self.lock:
            self.armed += 1
        timer.cancel()

    def _fire(self, which: int) -> None:
        with self.lock:
            if which == self.armed:
                self.engine.increment_epoch()


class Runner:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        config = wasmtime.Config()
        config.consume_fuel = True
        config.epoch_interruption = True
        config.max_wasm_stack = limits.stack_bytes
        self.engine = wasmtime.Engine(config)
        self.alarm = Alarm(self.engine)
        self.cache: OrderedDict[str, Loaded] = OrderedDict()

    def load(self, source: Any) -> Loaded:
        key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        binary: bytes | bytearray
        try:
            if isinstance(source, dict) and isinstance(source.get("wat"), str):
                binary = wasmtime.wat2wasm(source["wat"])
            elif isinstance(source, dict) and isinstance(source.get("wasm"), str):
                binary = base64.b64decode(source["wasm"], validate=True)
            else:
                raise Refused("rule_load_refused", "the source is neither wat nor wasm")
            # wasmtime annotates str | bytes, but takes the bytearray its own wat2wasm returns
            module = wasmtime.Module(self.engine, binary)  # type: ignore[arg-type]
        except (wasmtime.WasmtimeError, ValueError) as exc:
            raise Refused("rule_load_refused", f"the module does not compile: {exc}") from None
        if module.imports:
            names = ", ".join(f"{i.module}.{i.name}" for i in module.imports)
            raise Refused("rule_load_refused", f"the module imports {names}; the runner offers no host functions")
        exports = {e.name: e.type for e in module.exports}
        if not isinstance(exports.get("memory"), wasmtime.MemoryType):
            raise Refused("rule_load_refused", "the module does not export its memory as 'memory'")
        count = exports.get("count")
        i32 = wasmtime.ValType.i32()
        if not isinstance(count, wasmtime.FuncType) or [str(p) for p in count.params] != [str(i32)] * 2:
            raise Refused("rule_load_refused", "the module does not export count(ptr: i32, len: i32)")
        loaded = Loaded(module, [str(r) for r in count.results] == [str(i32)])
        self.cache[key] = loaded
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return loaded

    def count(self, source: Any, text: str) -> int:
        data = text.encode("utf-8")
        if len(data) > self.limits.max_input_bytes:
            raise Refused("rule_input_too_large", f"{len(data)} bytes, over {self.limits.max_input_bytes}")
        loaded = self.load(source)
        store = wasmtime.Store(self.engine)
        store.set_fuel(self.limits.fuel)
        store.set_epoch_deadline(1)
        ceiling = self.limits.memory_pages
        store.set_limits(memory_size=ceiling * PAGE, instances=1, memories=1, tables=1, table_elements=10_000)
        timer = self.alarm.arm(self.limits.wall_ms / 1000.0)
        try:
            instance = wasmtime.Instance(store, loaded.module, [])
            exports = instance.exports(store)
            # load checked the exports' types: a memory and a function
            memory = cast(wasmtime.Memory, exports["memory"])
            ptr = memory.size(store) * PAGE
            need = -(-len(data) // PAGE)
            if need and not self._grow(memory, store, need):
                raise Refused("rule_resource_limit", "no memory left for the text under the page limit")
            if data:
                memory.write(store, data, ptr)
            result = cast(wasmtime.Func, exports["count"])(store, ptr, len(data))
            if memory.size(store) >= ceiling:
                raise Refused("rule_resource_limit", f"memory reached the ceiling of {ceiling} pages")
        except wasmtime.Trap as trap:
            if trap.trap_code == wasmtime.TrapCode.INTERRUPT:
                raise Refused("rule_timeout", f"stopped at its wall time ({self.limits.wall_ms:g} ms)") from None
            if trap.trap_code in RESOURCE_TRAPS:
                raise Refused("rule_resource_limit", f"out of {RESOURCE_TRAPS[trap.trap_code]}") from None
            raise Refused("rule_error", f"trapped: {trap.trap_code}") from None
        except wasmtime.WasmtimeError as exc:
            message = str(exc)
            if "limit" in message or "memory" in message:
                raise Refused("rule_resource_limit", message.splitlines()[0]) from None
            raise Refused("rule_error", message.splitlines()[0]) from None
        finally:
            self.alarm.disarm(timer)
        if not loaded.result_ok or not isinstance(result, int) or isinstance(result, bool):
            raise Refused("rule_output_invalid", "count must return one i32")
        if not 0 <= result <= len(data):
            raise Refused("rule_output_invalid", f"count returned {result}, outside 0..{len(data)} (the text's bytes)")
        return result

    @staticmethod
    def _grow(memory: wasmtime.Memory, store: wasmtime.Store, pages: int) -> bool:
        try:
            return memory.grow(store, pages) >= 0
        except wasmtime.WasmtimeError:
            return False


def answer(runner: Runner, line: str) -> dict[str, Any]:
    try:
        request = json.loads(line)
        rid = request.get("id")
    except (ValueError, AttributeError):
        return {"id": None, "code": "rule_error", "detail": "the request is not JSON"}
    if request.get("op") == "ping":
        return {"id": rid, "pong": True}
    try:
        return {"id": rid, "count": runner.count(request.get("source"), str(request.get("text", "")))}
    except Refused as refused:
        return {"id": rid, "code": refused.code, "detail": refused.detail}
    except Exception as exc:  # the runner stays up whatever the code does
        return {"id": rid, "code": "rule_error", "detail": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    limits = Limits(**json.loads(argv[1]))
    runner = Runner(limits)
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the answer channel
    out.write(json.dumps({"id": 0, "ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:  # EOF: the server went away
        out.write(json.dumps(answer(runner, line)) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

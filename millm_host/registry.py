"""The model registry: which models exist, which one is resident, loading and unloading.

The host owns this, never an engine. One model is resident at a time. A request
for another known model loads it first; during a load or an unload, requests that
would need a different model are refused with ``503 model_busy``. An unload is
graceful: from its start new requests are refused, and it waits (up to
``GRACEFUL_UNLOAD_TIMEOUT``) for running requests before moving anything; the
generations still running then end with ``503 model_unloaded``. Admin work on the
model (parity, measure) stops between its steps once the unload begins. A model an
operator unloaded is not loaded again by background work (batch lines wait for it).
"""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
import os
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import hookcalls
from .bodies import collector
from .cancellation import when_set
from .default_model import default_model_path, describe_default
from .engine import Engine, EngineSpec, ModelDescriptor
from .errors import (
    InsufficientMemory,
    MillmError,
    ModelBusy,
    ModelLoadFailed,
    ModelNotFound,
    ModelNotLoaded,
    ModelUnloaded,
    RequestCancelled,
)
from .scheduler import BACKGROUND, TICK

if TYPE_CHECKING:
    import pluggy

    from .observability.metrics import Metrics
    from .plugin_host import PluginHost
    from .scheduler import Scheduler
    from .settings import Settings


class _Flight(Protocol):
    """A generation under way, as an unload past its grace ends it."""

    def stop(self, reason: str, error: MillmError) -> None: ...


class _Converging(Protocol):
    """The replica's convergence, as a new model wakes it."""

    def poke(self) -> None: ...


class RegistryHost(Protocol):
    """What the model registry uses of the host."""

    settings: Settings
    scheduler: Scheduler
    pm: pluggy.PluginManager
    metrics: Metrics
    plugin_host: PluginHost

    @property
    def convergence(self) -> _Converging: ...

    @property
    def flights(self) -> Collection[_Flight]: ...

    def listed_models(self) -> list[Any]: ...

    def keep(self, task: asyncio.Task) -> None: ...


log = logging.getLogger("millm.registry")

#: Model ids a model_not_found message names before "and N more".
NAMED_IN_404 = 20


class AmbiguousModelName(MillmError):
    """A name that fits several models (a repository with several quantizations or checkpoints)."""

    status, code = 400, "AMBIGUOUS_MODEL_NAME"


#: Admin work on the resident model that ``/api/health`` names as its status (``ModelRegistry.activity``).
ACTIVITIES = ("measuring",)


@dataclass(eq=False)
class Activity:
    """Admin work in progress on the resident model (``ModelRegistry.activity``)."""

    kind: str
    reason: str
    #: Generation routes answer ``503 model_busy`` (with the reason) while it runs.
    refuses: bool = False


class ModelState(str, enum.Enum):
    READY = "READY"
    LOADING = "LOADING"
    LOADED = "LOADED"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


@dataclass
class ModelEntry:
    descriptor: ModelDescriptor
    spec: EngineSpec
    state: ModelState = ModelState.READY
    error: str | None = None
    created: int = 0
    #: The engine's last progress message while it loads (shown by /api/health).
    progress: str | None = None
    #: An operator unloaded it (``POST …/unload``) and nothing loaded it since: background work
    #: (batch lines) waits rather than loading it again.
    unloaded: bool = False

    @property
    def id(self) -> str:
        return self.descriptor.id


def model_format(path: Path) -> str | None:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    return None


class Lease:
    """A running request's hold on the resident model; the unload waits for it."""

    def __init__(self, registry: ModelRegistry, engine: Engine, entry: ModelEntry) -> None:
        self.registry, self.engine, self.entry = registry, engine, entry
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.registry._leases -= 1
            if self.registry._leases == 0:
                self.registry._idle.set()


class ModelRegistry:
    """Known models and the resident one."""

    def __init__(self, host: RegistryHost, engines: Sequence[EngineSpec]) -> None:
        self.host = host
        self.engines = list(engines)
        self.entries: dict[str, ModelEntry] = {}
        self.engine: Engine | None = None
        self.resident: ModelEntry | None = None
        self._transition: tuple[str, ModelEntry, asyncio.Future] | None = None
        self._leases = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.start_model: ModelEntry | None = None
        #: Admin work in progress (``activity``), oldest first.
        self.activities: list[Activity] = []

    # --- discovery ----------------------------------------------------------------
    def engine_for(self, fmt: str) -> list[EngineSpec]:
        preferred = self.host.settings["MILLM_ENGINE"]
        specs = [s for s in self.engines if fmt in s.formats]
        return sorted(specs, key=lambda s: (s.name != preferred, -s.preference))

    def describe(self, path: str | Path) -> tuple[ModelDescriptor, EngineSpec] | None:
        path = Path(path)
        fmt = model_format(path)
        if fmt is None:
            return None
        for spec in self.engine_for(fmt):
            descriptor = spec.describe_path(str(path))
            if descriptor is not None:
                return descriptor, spec
        return None

    def add(self, descriptor: ModelDescriptor, spec: EngineSpec) -> ModelEntry:
        """Register a model; an id already taken by another path gets its quantization tag."""
        existing = self.entries.get(descriptor.id)
        if existing is not None and existing.descriptor.path == descriptor.path:
            return existing
        if existing is not None and descriptor.quantization:
            descriptor = replace(descriptor, id=f"{descriptor.id}:{descriptor.quantization}")
        try:
            created = int(os.stat(descriptor.path).st_mtime)
        except OSError:
            created = int(time.time())
        entry = ModelEntry(descriptor, spec, created=created)
        self.entries[descriptor.id] = entry
        return entry

    def discover(self) -> None:
        """Find the bundled default model and everything in ``MILLM_MODELS_DIR``."""
        settings = self.host.settings
        default = default_model_path()
        default_entry = None
        if default is not None:
            described = self.describe(default)
            if described:
                default_entry = self.add(describe_default(described[0]), described[1])
        models_dir = settings["MILLM_MODELS_DIR"]
        if models_dir:
            for child in sorted(Path(models_dir).iterdir()):
                described = self.describe(child)
                if described:
                    self.add(*described)
        start = settings["MILLM_MODEL"]
        if start:
            self.start_model = self._start_entry(start)
        else:
            self.start_model = default_entry

    def _start_entry(self, name: str) -> ModelEntry:
        if name in self.entries:
            return self.entries[name]
        path = Path(name).expanduser()
        described = self.describe(path) if path.exists() else None
        if described is None:
            raise SystemExit(f"--model {name!r} is neither a known model id nor a checkpoint directory or .gguf file")
        for entry in self.entries.values():
            if entry.descriptor.path == str(path) and entry.spec is described[1]:
                return entry
        return self.add(*described)

    # --- lookup -------------------------------------------------------------------
    def resolve(self, name: str) -> ModelEntry:
        """The entry a request's ``model`` names, or the error a client should see.

        An id names its model; so does a Hugging Face repository id (``hf_id``) that
        exactly one model was made from (an alias: ``/v1/models`` keeps listing ids).
        """
        entry = self.entries.get(name)
        if entry is not None:
            return entry
        aliased = sorted((e for e in self.entries.values() if e.descriptor.hf_id == name), key=lambda e: e.id)
        if len(aliased) == 1:
            return aliased[0]
        if aliased:
            raise AmbiguousModelName(
                f"model {name!r} is the repository of several models; name one: " + ", ".join(e.id for e in aliased),
                param="model",
            )
        tagged = sorted(e.id for e in self.entries.values() if e.descriptor.repo == name)
        if len(tagged) == 1:
            raise ModelNotFound(f"model {name!r} names a repository, not a model; use {tagged[0]!r}", param="model")
        if len(tagged) > 1:
            raise AmbiguousModelName(
                f"model {name!r} is ambiguous: name one quantization: " + ", ".join(tagged), param="model"
            )
        raise ModelNotFound(f"the model {name!r} does not exist; {self.known_models()}", param="model")

    def by_id(self, model_id: str) -> ModelEntry:
        """The model with this id (management names models by id only); 404 for an unknown one."""
        entry = self.entries.get(model_id)
        if entry is None:
            raise ModelNotFound(f"the model {model_id!r} does not exist; {self.known_models()}", param="model")
        return entry

    def known_models(self) -> str:
        """A sentence naming the models ``/v1/models`` lists (for a 404), the first few when there are many."""
        ids = sorted(e.id for e in self.host.listed_models())
        if not ids:
            return "this server has no models"
        shown = ", ".join(repr(i) for i in ids[:NAMED_IN_404])
        more = f" and {len(ids) - NAMED_IN_404} more (GET /v1/models)" if len(ids) > NAMED_IN_404 else ""
        return f"models on this server: {shown}{more}"

    def detail(self, entry: ModelEntry) -> dict[str, Any]:
        """A model's state, and (when resident) the identity of the loaded weights probes are checked against."""
        d = entry.descriptor
        detail: dict[str, Any] = {
            "id": entry.id,
            "state": entry.state.value,
            "engine": entry.spec.name,
            "format": d.format,
            "path": d.path,
            "quantization": d.quantization,
            "hf_id": d.hf_id or entry.id,
            "revision": d.revision,
            "error": entry.error,
        }
        engine = self.engine
        if self.resident is entry and engine is not None:
            info = engine.info
            detail.update(
                hf_id=info.hf_id or entry.id,
                revision=info.revision,
                d_model=info.d_model,
                n_layers=info.n_layers,
                chat_template_sha256=info.chat_template_sha256,
                context_window=info.context_window,
                dtype=info.dtype,
                device=info.device,
                load_id=info.load_id,
                system_fingerprint=info.system_fingerprint,
            )
        return detail

    def listed(self) -> list[ModelEntry]:
        """What ``/v1/models`` shows: READY, LOADED and LOADING models, the resident first."""
        shown = [
            e for e in self.entries.values() if e.state in (ModelState.READY, ModelState.LOADED, ModelState.LOADING)
        ]
        return sorted(shown, key=lambda e: e is not self.resident)

    # --- residency ----------------------------------------------------------------
    def check_available(self, entry: ModelEntry) -> None:
        """Refuse at once (``model_busy``) while another model's load, any unload, or admin work that
        refuses (``activity(..., refuses=True)``) runs."""
        if self._transition is not None:
            kind, target, _ = self._transition
            if not (kind == "load" and target is entry):
                raise ModelBusy(
                    f"model {target.id!r} is {'loading' if kind == 'load' else 'unloading'}; retry once it finishes",
                    param="model",
                )
        refusing = next((a for a in self.activities if a.refuses), None)
        if refusing is not None and self.resident is entry:  # admin work that excludes serving
            raise ModelBusy(
                f"model {entry.id!r} is {refusing.kind} ({refusing.reason}); retry once it finishes", param="model"
            )

    @contextmanager
    def activity(self, kind: str, reason: str, *, refuses: bool = False) -> Iterator[Activity]:
        """Admin work on the resident model, reported by ``/api/health`` while the block runs.

        ``with host.registry.activity("measuring", "probe capacity of layers 4-12 (run 2 of 3)"):``
        makes ``/api/health`` answer ``status: measuring`` with that ``reason``. With
        ``refuses=True`` generation routes also answer ``503 model_busy`` (naming the
        reason) until it ends. Any thread may enter it; ``kind`` is one of ``ACTIVITIES``.
        """
        if kind not in ACTIVITIES:
            raise ValueError(f"unknown activity {kind!r}; one of {', '.join(ACTIVITIES)}")
        activity = Activity(kind, reason, refuses)
        self.activities.append(activity)
        try:
            yield activity
        finally:
            self.activities.remove(activity)

    def lease_if_serving(self, entry: ModelEntry) -> Lease | None:
        """A lease on ``entry`` if it is resident and serving now (no load, unload or refusing admin
        work under way), else None: O(1), never waits and never loads (``acquire`` does)."""
        if self.resident is not entry or self.engine is None or self._transition is not None:
            return None
        if any(activity.refuses for activity in self.activities):
            return None
        return self._lease(entry, self.engine)

    def _lease(self, entry: ModelEntry, engine: Engine) -> Lease:
        self._leases += 1
        self._idle.clear()
        return Lease(self, engine, entry)

    async def acquire(self, entry: ModelEntry, cancel: threading.Event | None = None) -> Lease:
        """A lease on ``entry`` as the resident model, loading it first if needed.

        With ``cancel`` (the request's ``cancel_event``), a wait for the model's load is
        left (``RequestCancelled``) the moment it is set: a request whose client has gone
        never waits out the load, and never runs. The load itself goes on for the others.
        """
        while True:
            self.check_available(entry)
            if self._transition is not None:  # this model is loading: wait for it
                await _until_done(self._transition[2], cancel)
                continue
            if self.resident is entry and self.engine is not None:
                return self._lease(entry, self.engine)
            if not self.host.settings["MILLM_AUTOLOAD"]:
                raise ModelNotLoaded(
                    f"model {entry.id!r} is not loaded and this server does not load models on demand",
                    param="model",
                )
            if entry.unloaded and BACKGROUND.get():  # an operator's unload is not undone by a batch
                raise ModelUnloaded(
                    f"model {entry.id!r} was unloaded (POST /api/models/{entry.id}/unload); background work "
                    "waits until something loads it again",
                    param="model",
                )
            if cancel is None:
                await self.load(entry)
                continue
            # a task of its own: the load outlives this request if its client leaves
            loading = asyncio.ensure_future(self.load(entry))
            loading.add_done_callback(_retrieved)
            self.host.keep(loading)
            await _until_done(loading, cancel)

    def still_resident(self, engine: Engine) -> bool:
        """Whether ``engine`` is still the resident model's and no unload of it has begun: admin work on
        it (parity, measure, an arm) checks this between its steps and stops once it is not."""
        resident = self.resident
        return self.engine is engine and resident is not None and resident.state is ModelState.LOADED

    def current(self) -> tuple[Engine, ModelEntry]:
        """The resident engine, for management routes; 503 model_not_loaded without one."""
        if self.engine is None or self.resident is None or self._transition is not None:
            if self._transition is not None:
                kind, target, _ = self._transition
                raise ModelBusy(f"model {target.id!r} is {kind}ing; retry once it finishes")
            raise ModelNotLoaded("no model is loaded")
        return self.engine, self.resident

    async def load(self, entry: ModelEntry) -> None:
        """Make ``entry`` resident (unloading the current model first)."""
        if self.resident is entry:
            return
        if self._transition is not None:
            _, target, pending = self._transition
            if target is entry:
                await asyncio.shield(pending)
                return
            raise ModelBusy(f"model {target.id!r} is in transition; retry once it finishes")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._transition = ("load", entry, future)
        try:
            self._check_memory(entry)  # a refusal here leaves the resident model in place
            if self.resident is not None:
                await self._unload_resident()
            entry.state, entry.error = ModelState.LOADING, None
            try:
                engine = await self.host.scheduler.run(self._load_on_engine_thread, entry)
            except MillmError as exc:
                entry.state, entry.error = ModelState.FAILED, exc.message
                raise
            except Exception as exc:
                log.exception("loading %s failed", entry.id)
                entry.state, entry.error = ModelState.FAILED, f"{type(exc).__name__}: {exc}"
                raise ModelLoadFailed(f"loading model {entry.id!r} failed: {type(exc).__name__}: {exc}") from exc
            self.engine, self.resident = engine, entry
            entry.state, entry.unloaded = ModelState.LOADED, False
            future.set_result(None)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            self._transition = None

    def _check_memory(self, entry: ModelEntry) -> None:
        need = entry.spec.estimate_memory(entry.descriptor, _disk_size(Path(entry.descriptor.path)))
        available = available_memory()
        if available is not None and self.resident is not None:
            available += _disk_size(Path(self.resident.descriptor.path))  # freed by the unload
        if available is not None and need > available:
            raise InsufficientMemory(
                f"model {entry.id!r} needs about {need / 2**30:.1f} GiB; "
                f"{available / 2**30:.1f} GiB of memory is free (cpu)",
                param="model",
            )

    def _load_on_engine_thread(self, entry: ModelEntry) -> Engine:
        started = time.monotonic()
        log.info("loading model %s (%s engine) from %s", entry.id, entry.spec.name, entry.descriptor.path)

        def progress(message: str) -> None:
            entry.progress = message
            log.info("%s: %s", entry.id, message)

        entry.progress = "starting"
        engine = entry.spec.load(entry.descriptor, self.host.settings, progress)
        engine.info.load_id = uuid.uuid4().hex[:16]
        seconds = time.monotonic() - started
        log.info("model %s loaded in %.1f s", entry.id, seconds)
        self.host.metrics.model_loaded(entry.id, entry.spec.name, seconds)
        hookcalls.lifecycle(self.host.pm, "model_loaded", host=self.host.plugin_host, engine=engine)
        # What is alive now (torch, transformers, the weights' modules) lives as long as the model: frozen,
        # the collector's full passes skip it (they held the GIL for tens of ms each, issue 11 §0).
        collector.freeze_survivors()
        self.host.convergence.poke()  # the new model runs the gates of what is armed and steered
        return engine

    async def unload(self, entry: ModelEntry) -> None:
        """Unload ``entry`` if resident (an operator's ``POST …/unload``): refuse new requests, let running
        ones finish within ``GRACEFUL_UNLOAD_TIMEOUT``. Until it is loaded again, background work does not
        load it (``ModelEntry.unloaded``)."""
        if self.resident is not entry:
            return
        if self._transition is not None:
            raise ModelBusy(f"model {self._transition[1].id!r} is in transition; retry once it finishes")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._transition = ("unload", entry, future)
        try:
            entry.unloaded = True
            await self._unload_resident()
            future.set_result(None)
        finally:
            self._transition = None

    async def _unload_resident(self) -> None:
        """Wait up to ``GRACEFUL_UNLOAD_TIMEOUT`` for running requests; end the generations still running
        then (``503 model_unloaded``, at their next token); close the engine once its thread is free.

        Admin work on the model (parity, measure) stops by itself between its steps once the unload
        begins (``still_resident``): the close waits for the step in progress, never for the rest.
        """
        entry, engine = self.resident, self.engine
        assert entry is not None and engine is not None
        entry.state = ModelState.UNLOADING
        timeout = self.host.settings["GRACEFUL_UNLOAD_TIMEOUT"]
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            still, running = self._leases, list(self.host.flights)
            ended = ModelUnloaded(
                f"model {entry.id!r} was unloaded (POST /api/models/{entry.id}/unload) while this request ran: "
                f"it did not finish within GRACEFUL_UNLOAD_TIMEOUT ({timeout:g} s)",
                param="model",
            )
            for flight in running:
                flight.stop("cancelled", ended)
            log.warning(
                "unloading %s: %d requests still running after %g s; %d generations ended (503 model_unloaded)",
                entry.id,
                still,
                timeout,
                len(running),
            )

        def close() -> None:
            gc.unfreeze()  # the old model's cycles must be collectable again
            hookcalls.lifecycle(self.host.pm, "model_unloading", host=self.host.plugin_host, engine=engine)
            engine.close()

        await self.host.scheduler.run(close)
        self.engine = self.resident = None
        entry.state = ModelState.READY
        log.info("model %s unloaded", entry.id)


async def _until_done(pending: asyncio.Future, cancel: threading.Event | None) -> None:
    """Wait for ``pending`` (never cancelling it) and re-raise its error; ``RequestCancelled`` once
    ``cancel`` is set first (at once for a ``Cancellation``, within a ``TICK`` for a plain event)."""
    if cancel is None:
        await asyncio.shield(pending)
        return
    gone, forget = when_set(cancel)
    waits = {pending} if gone is None else {pending, gone}
    try:
        while not pending.done():
            if cancel.is_set():
                raise RequestCancelled()
            await asyncio.wait(waits, timeout=TICK, return_when=asyncio.FIRST_COMPLETED)
    finally:
        forget()
    pending.result()


def _retrieved(task: asyncio.Future) -> None:
    """A load nobody waits for any more: its error was logged and is on the model's entry."""
    if not task.cancelled():
        task.exception()


def _disk_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(
        p.stat().st_size for p in path.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".bin", ".gguf")
    )


def available_memory() -> int | None:
    """The memory this process may still use: MemAvailable, within a cgroup v2 limit (None: unknown)."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available

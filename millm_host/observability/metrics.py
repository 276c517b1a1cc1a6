"""``Metrics`` (``host.metrics``): the Prometheus metrics the host and its plugins record, and ``/metrics``.

What the host records itself: requests by endpoint, model and status; prompt
and completion tokens; request duration, time to first token and inter-token
latency; queue depth and running batch size; model load time; engine restarts
(an engine that reports ``restarts`` in its ``status()``, as the GGUF child
process does).

What plugins record, through this object (``ctx.host.metrics``; they never import
``prometheus_client``): series they name themselves (``counter``, ``histogram``:
``millm_<plugin>_...``, declared on first use, the same series for the same name),
and results that become events of the request's span (``trace_events``).

Multi-process servers (gunicorn workers) set ``PROMETHEUS_MULTIPROC_DIR`` to an
empty directory shared by the workers: every worker writes its values there and
a scrape of any worker answers the sum (prometheus_client's multiprocess mode).
Gunicorn's ``child_exit`` should call ``mark_process_dead`` (see
``millm_host.observability.gunicorn``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .series import Series

if TYPE_CHECKING:
    from ..context import RequestContext
    from ..engine import Engine
    from .timing import Timing

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Latency buckets (seconds), from a fast token to a long generation.
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LOAD_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


class Metrics:
    """Every metric of one host, in its own registry (two hosts in one process never collide)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "millm_requests",
            "Requests served, by endpoint, model and HTTP status",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "millm_prompt_tokens", "Prompt tokens of served requests", ["endpoint", "model"], registry=r
        )
        self.completion_tokens = Counter(
            "millm_completion_tokens", "Generated tokens of served requests", ["endpoint", "model"], registry=r
        )
        self.request_seconds = Histogram(
            "millm_request_duration_seconds",
            "From the request's arrival to its last byte (a stream's end)",
            ["endpoint", "model"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "millm_time_to_first_token_seconds",
            "From the request's arrival to its first generated token",
            ["model"],
            buckets=TOKEN_BUCKETS + (30.0, 60.0),
            registry=r,
        )
        self.itl = Histogram(
            "millm_inter_token_latency_seconds",
            "Between consecutive generated tokens of one sequence",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "millm_queue_depth", "Admitted requests not running on the engine", registry=r, multiprocess_mode="livesum"
        )
        self.running = Gauge(
            "millm_running_batch_size",
            "Requests generating on the engine now (more than one when the engine batches)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.load_seconds = Histogram(
            "millm_model_load_seconds", "Time to load a model", ["model", "engine"], buckets=LOAD_BUCKETS, registry=r
        )
        self.engine_restarts = Counter(
            "millm_engine_restarts", "Restarts of an engine's child process", ["engine", "model"], registry=r
        )
        self._restarts_seen: dict[str, int] = {}
        self.prefix_cache = Counter(
            "millm_prefix_cache_lookups",
            "Prompts looked up in an engine's prefix cache, by whether a prefix was reused (hit) or not (miss)",
            ["model", "result"],
            registry=r,
        )
        self.prefix_cache_tokens = Counter(
            "millm_prefix_cache_hit_tokens", "Prompt tokens reused from an engine's prefix cache", ["model"], registry=r
        )
        self._prefix_seen: dict[str, tuple[int, int, int]] = {}
        self._named: dict[str, Series] = {}  # plugins' series, by name
        self._lock = threading.Lock()

    # --- what the host records -------------------------------------------------------
    def request_ended(self, endpoint: str, ctx: RequestContext | None, status: int, timing: Timing, ended: int) -> None:
        """One request is over: its status, its tokens and its latencies."""
        model = ctx.entry.id if ctx is not None and ctx.entry is not None else ""
        self.requests.labels(endpoint, model, str(status)).inc()
        self.request_seconds.labels(endpoint, model).observe((ended - timing.received) / 1e9)
        if ctx is None:
            return
        prompt = sum(len(p) for p in ctx.prompts)
        completion = sum(len(o.token_ids) for o in ctx.outputs)
        if prompt:
            self.prompt_tokens.labels(endpoint, model).inc(prompt)
        if completion:
            self.completion_tokens.labels(endpoint, model).inc(completion)
        if timing.first_token is not None:
            self.ttft.labels(model).observe((timing.first_token - timing.received) / 1e9)
        if timing.gaps:
            itl = self.itl.labels(model)
            for gap in timing.gaps:
                itl.observe(gap / 1e9)
        if ctx.engine is not None:
            self.engine_seen(ctx.engine)

    def queue_changed(self, admitted: int, running: int) -> None:
        """The scheduler's admitted and running requests changed (called by the scheduler)."""
        self.queue_depth.set(max(admitted - running, 0))
        self.running.set(running)

    def model_loaded(self, model: str, engine: str, seconds: float) -> None:
        self.load_seconds.labels(model, engine).observe(seconds)

    def engine_seen(self, engine: Engine) -> None:
        """Count the restarts (``status()["restarts"]``) and prefix cache lookups (``status()["prefix_cache"]``)
        the engine reports since this was last called."""
        try:
            status = engine.status()
        except Exception:
            return
        key = engine.info.load_id or engine.info.id
        prefix = status.get("prefix_cache")
        if isinstance(prefix, Mapping):
            self._prefix_cache_seen(engine.info.id, key, prefix)
        restarts = status.get("restarts")
        if not isinstance(restarts, int):
            return
        with self._lock:
            new = restarts - self._restarts_seen.get(key, 0)
            self._restarts_seen[key] = restarts
        if new > 0:
            self.engine_restarts.labels(engine.info.engine, engine.info.id).inc(new)

    def _prefix_cache_seen(self, model: str, key: str, stats: Mapping[str, Any]) -> None:
        now = (int(stats.get("hits", 0)), int(stats.get("misses", 0)), int(stats.get("hit_tokens", 0)))
        with self._lock:
            before = self._prefix_seen.get(key, (0, 0, 0))
            self._prefix_seen[key] = now
        hits, misses, tokens = (max(0, a - b) for a, b in zip(now, before, strict=True))
        if hits:
            self.prefix_cache.labels(model, "hit").inc(hits)
        if misses:
            self.prefix_cache.labels(model, "miss").inc(misses)
        if tokens:
            self.prefix_cache_tokens.labels(model).inc(tokens)

    # --- what plugins record: series they name --------------------------------------
    def counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Series:
        """A counter a plugin names (``millm_<plugin>_...``); the same name gives the same series."""
        return self._series(Counter, name, documentation, tuple(labels))

    def histogram(
        self, name: str, documentation: str, labels: Iterable[str] = (), buckets: Iterable[float] = REQUEST_BUCKETS
    ) -> Series:
        """A histogram a plugin names (seconds, by convention); the same name gives the same series."""
        return self._series(Histogram, name, documentation, tuple(labels), buckets=tuple(buckets))

    def trace_events(self, ctx: object, results: Iterable[Mapping[str, Any]], default_name: str) -> None:
        """Each result becomes an event of the request's span, named by its ``schema`` (never any text)."""
        observation = getattr(ctx, "observation", None)
        if observation is not None:
            for result in results:
                observation.event(str(result.get("schema") or default_name), result)

    def _series(self, kind: type, name: str, documentation: str, labels: tuple[str, ...], **options: Any) -> Series:
        if not name.startswith("millm_"):
            raise ValueError(f"a plugin's metric is named millm_<plugin>_..., not {name!r}")
        with self._lock:
            series = self._named.get(name)
            if series is None:
                metric = kind(name, documentation, list(labels), registry=self.registry, **options)
                series = self._named[name] = Series(metric, labels)
        if series.labels != labels:
            raise ValueError(f"metric {name!r} was declared with labels {list(series.labels)}, not {list(labels)}")
        return series

    # --- /metrics --------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The text format: this process's registry, or every worker's in multiprocess mode."""
        if multiprocess_dir():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)

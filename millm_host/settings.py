"""Settings: environment variables declared with a type, a default and a meaning.

The host and every plugin declare what they read (``register_settings``), so
``millm settings`` can list them all. Values are read from the environment once,
when ``Settings`` is built; tests build their own ``Settings`` from a mapping.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One environment setting. ``type`` is ``str``, ``int``, ``float``, ``bool`` or ``list``."""

    name: str
    type: type
    default: Any
    help: str
    #: Never printed (``millm settings`` shows it as set or not).
    secret: bool = False


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(setting: Setting, raw: str) -> Any:
    if setting.type is bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"{setting.name}={raw!r} is not a boolean")
    if setting.type is list:
        return [part.strip() for part in raw.split(",") if part.strip()]
    try:
        return setting.type(raw)
    except ValueError as exc:
        raise ValueError(f"{setting.name}={raw!r} is not a valid {setting.type.__name__}") from exc


def default_data_dir() -> str:
    return str(Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "millm")


HOST_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "MILLM_DATA_DIR", str, None, "Data directory: SQLite database and model cache (default ~/.local/share/millm)"
    ),
    Setting("MILLM_CACHE_DIR", str, None, "Where converted models are cached (default <data dir>/cache)"),
    Setting("MILLM_DATABASE_URL", str, None, "SQLAlchemy URL of the database (default SQLite in the data directory)"),
    Setting(
        "MILLM_DB_MIGRATE",
        bool,
        True,
        "Apply pending migrations at start (under a lock replicas share); false: refuse to start unless "
        "the database is at head, leaving migrations to `millm db upgrade`",
    ),
    Setting("MILLM_MODELS_DIR", str, None, "Directory of models to serve: HF checkpoint directories and .gguf files"),
    Setting(
        "MILLM_LORA_DIRS",
        str,
        None,
        "Directories (os.pathsep-separated) of PEFT LoRA adapters to serve: each subdirectory with an "
        "adapter_config.json is one adapter, named by its directory; POST /api/models/{id}/adapters loads "
        "only from inside them",
    ),
    Setting("MILLM_MODEL", str, None, "Model to load at start: a path or a model id (default: the bundled SmolLM2)"),
    Setting(
        "MILLM_ENGINE",
        str,
        None,
        "Engine that serves files several installed engines can serve (e.g. .gguf); "
        "default: the one that declares the highest preference",
    ),
    Setting("MILLM_LOAD_ON_START", bool, True, "Load the start model when the server starts"),
    Setting("MILLM_AUTOLOAD", bool, True, "Load a requested model that is not resident"),
    Setting(
        "MILLM_PLUGIN_MODULES",
        list,
        [],
        "Importable modules registered as plugins besides the installed entry points: "
        "module or name=module, comma-separated (how tests load their test-only plugins)",
    ),
    Setting("MILLM_PLUGINS", list, None, "Allow-list of plugin names to load (default: all installed)"),
    Setting("MILLM_DISABLE_PLUGINS", list, [], "Plugin names not to load"),
    Setting(
        "MILLM_API_KEYS", list, [], "Keys that open /v1 (Authorization: Bearer <key>); unset: /v1 is open", secret=True
    ),
    Setting(
        "MILLM_ADMIN_API_KEYS",
        list,
        [],
        "Keys that open every other route but /api/health and /openapi.json (and /v1 too); "
        "unset: those routes take MILLM_API_KEYS, or are open when that is unset too",
        secret=True,
    ),
    Setting(
        "MILLM_ALLOWED_HOSTS",
        list,
        None,
        "Host header values answered (name or name:port, * for any); default the loopback names "
        "localhost, 127.0.0.1, [::1] on any port, plus the address --host names",
    ),
    Setting(
        "MILLM_CORS_ORIGINS",
        list,
        [],
        "Origins (scheme://host:port, or *) whose pages may call this server from a browser; unset: CORS off",
    ),
    Setting("MILLM_QUEUE_MAX", int, 16, "Requests that may wait for the generation slot before 503 queue_full"),
    Setting(
        "MILLM_INTAKE_SHARE",
        float,
        0.1,
        "The most of the time that requests whose clients leave before their answer may take while a "
        "generation runs: each is charged the time it held the server (up to 20 ms), and new requests wait "
        "at the intake gate for that time x (1 - share) / share, so clients that drop requests as fast as "
        "the server answers cannot starve the running batch of the interpreter lock (0 or 1: off)",
    ),
    Setting("MILLM_MAX_BODY_BYTES", int, 4 * 1024 * 1024, "Largest request body accepted (413 above)"),
    Setting("MILLM_FILES_MAX_BYTES", int, 200 * 1024 * 1024, "Largest file POST /v1/files accepts (413 above)"),
    Setting(
        "MILLM_BODY_TIMEOUT_S",
        float,
        30.0,
        "Seconds a request body may go without a byte arriving (one shorter than its Content-Length); "
        "then 408 request_timeout and the connection is closed (0: wait for ever)",
    ),
    Setting("MILLM_BATCH_MAX_LINES", int, 50_000, "Most lines (requests) one batch input file may hold"),
    Setting(
        "MILLM_BATCH_CONCURRENCY",
        int,
        2,
        "Lines of each batch admitted at once (live requests wait behind at most these)",
    ),
    Setting(
        "MILLM_GIL_SWITCH_MS",
        float,
        1.0,
        "Milliseconds a thread may hold the GIL while another waits for it (sys.setswitchinterval; "
        "Python's default is 5): the event loop waits at most about this long for a worker thread "
        "parsing or validating a large body",
    ),
    Setting("MILLM_MAX_JSON_DEPTH", int, 64, "Deepest JSON nesting accepted in a request body"),
    Setting(
        "MILLM_MAX_JSON_CONTAINERS",
        int,
        65_536,
        "Most JSON objects and arrays in one request body (400 past it, while parsing): a 4 MiB body of "
        "1.4 million empty arrays held the GIL for tens of ms to build, walk and free",
    ),
    Setting(
        "MILLM_DEFAULT_MAX_TOKENS", int, 512, "max_tokens when a request sends none (capped by the context window)"
    ),
    Setting("MILLM_MAX_N", int, 16, "Largest n (choices per prompt) accepted"),
    Setting(
        "MILLM_REASONING",
        str,
        "auto",
        "Reasoning output: auto (a chat reply's thinking block, <think>...</think> and the variants of "
        "millm_host/reasoning.py's MARKERS, goes to reasoning_content when the model's chat template holds an "
        "opening marker), on (split every model's replies: the template's markers, else <think>), off (never)",
    ),
    Setting(
        "MILLM_MAX_MESSAGES",
        int,
        4096,
        "Most messages in one chat, and content parts in one message (400 past it): building a 4 MiB chat "
        "of 150,000 tiny messages cost seconds of collector passes with the GIL held",
    ),
    Setting(
        "MILLM_MAX_CONTENT_PARTS",
        int,
        8192,
        "Most content parts in one chat, over all its messages (400 past it): 4096 messages of 4096 "
        "parts each would pass MILLM_MAX_MESSAGES, and each part is a model to build",
    ),
    Setting("MILLM_MAX_PROMPTS", int, 64, "Most prompts one /v1/completions request may carry"),
    Setting("MILLM_STREAM_PING_S", float, 0.5, "Seconds between keep-alive comments while a stream waits"),
    Setting("IGNORED_FIELDS_HEADER_MAX_BYTES", int, 1024, "Byte cap of X-miLLM-Ignored-Fields"),
    Setting(
        "GRACEFUL_UNLOAD_TIMEOUT",
        float,
        30.0,
        "Seconds an unload waits for running requests; generations still running then end (503 model_unloaded)",
    ),
    Setting(
        "MILLM_GENERATION_STALL_S",
        float,
        300.0,
        "Seconds a generation may go without producing a token before it fails with 503 generation_stalled (0: never)",
    ),
    Setting(
        "MILLM_SHUTDOWN_GRACE_S",
        float,
        10.0,
        "Seconds running and queued requests get to finish after SIGTERM; the rest then fail with "
        "503 shutting_down (an error event on a stream)",
    ),
    Setting("MILLM_METRICS", bool, True, "Record Prometheus metrics of every request (served at /metrics)"),
    Setting(
        "MILLM_LOG_FORMAT", str, "text", "Log format: text, or json (one object a line, with request and trace ids)"
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        str,
        None,
        "OpenTelemetry collector base URL (OTLP over HTTP, spans to <url>/v1/traces); tracing is off without it",
    ),
    Setting("OTEL_SERVICE_NAME", str, "millm", "The service name of exported spans"),
    Setting(
        "MILLM_REPLICA_ID",
        str,
        None,
        "This replica's name in the shared database and in /api/health (default host:port:pid)",
    ),
    Setting(
        "MILLM_CONVERGE_INTERVAL_S",
        float,
        3.0,
        "Seconds between this replica's passes over the desired state (armed probes, steering) in the database",
    ),
    Setting(
        "MILLM_BATCH_LEASE_S",
        float,
        30.0,
        "Seconds a batch's lease lasts without renewal; another replica resumes the batch only after it expires",
    ),
)


class Settings(Mapping[str, Any]):
    """Typed values of every declared setting, read from ``environ``."""

    def __init__(self, declared: Iterable[Setting] = HOST_SETTINGS, environ: Mapping[str, str] | None = None):
        self._environ = dict(os.environ if environ is None else environ)
        self._declared: dict[str, Setting] = {}
        self._values: dict[str, Any] = {}
        for setting in declared:
            self.declare(setting)

    def declare(self, setting: Setting) -> None:
        """Add a setting; a name declared twice is an error."""
        if setting.name in self._declared:
            raise ValueError(f"setting {setting.name} is declared twice")
        self._declared[setting.name] = setting
        raw = self._environ.get(setting.name)
        self._values[setting.name] = setting.default if raw in (None, "") else _convert(setting, raw)

    @property
    def declared(self) -> list[Setting]:
        return sorted(self._declared.values(), key=lambda s: s.name)

    def environ_has(self, name: str) -> bool:
        """Whether the environment set ``name`` (else its default is in force)."""
        return self._environ.get(name) not in (None, "")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def data_dir(self) -> Path:
        return Path(self["MILLM_DATA_DIR"] or default_data_dir())

    @property
    def cache_dir(self) -> Path:
        return Path(self["MILLM_CACHE_DIR"] or self.data_dir / "cache")

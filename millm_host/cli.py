"""The ``millm`` command: serve, plugins, settings, db upgrade."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from .bodies import collector
from .plugins import build_plugin_manager
from .settings import Settings

log = logging.getLogger("millm")


def _settings(args: argparse.Namespace) -> Settings:
    environ = dict(os.environ)
    if getattr(args, "port", None) is not None and not environ.get("MILLM_REPLICA_ID"):
        environ["MILLM_REPLICA_ID"] = f"{socket.gethostname()}:{args.port}:{os.getpid()}"
    if getattr(args, "model", None):
        environ["MILLM_MODEL"] = args.model
    if getattr(args, "engine", None):
        environ["MILLM_ENGINE"] = args.engine
    return Settings(environ=environ)


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; OSError when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP by name: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it a reply written in two parts waits for the client's delayed ACK
    # (about 40 ms per request on a kept-alive connection). Set on the listener too,
    # which accepted sockets inherit, as gunicorn does.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    collector.hold_startup()  # until the start model is loaded (Host.load_start_model): see bodies.collector
    # The port first: a second server on a busy port fails at once, before loading anything.
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"millm: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1

    import uvicorn

    from .access import exposure_warnings
    from .app import build
    from .db import DatabaseBehind

    settings = _settings(args)
    for warning in exposure_warnings(settings, args.host):
        log.warning("!!! %s", warning)
    try:
        app, host = build(settings, build_plugin_manager(settings), bind_host=args.host)
    except DatabaseBehind as exc:
        print(f"millm: {exc}", file=sys.stderr)
        return 4
    if args.engine and args.engine not in {e.name for e in host.engines}:
        print(f"millm: no engine named {args.engine!r} is installed", file=sys.stderr)
        return 2
    start = host.registry.start_model
    shown = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    log.info("millm %s on http://%s:%d/v1 (model %s)", "serving", shown, args.port, start.id if start else "none")
    grace = settings["MILLM_SHUTDOWN_GRACE_S"]
    # uvicorn cancels what still runs a little after the host's own grace: a backstop.
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        lifespan="on",
        timeout_graceful_shutdown=grace + 5,
        # JSON logs: uvicorn's loggers go through the root logger's JSON handler, not their own
        log_config=None if settings["MILLM_LOG_FORMAT"] == "json" else uvicorn.config.LOGGING_CONFIG,
    )

    class Server(uvicorn.Server):
        """uvicorn's server, draining on SIGTERM or SIGINT before it stops listening.

        The signal starts the host's shutdown grace. The listener stays open meanwhile, so a
        new request is answered ``503 shutting_down`` (``draining``) rather than refused at TCP;
        it closes, and uvicorn's own shutdown begins, once nothing admitted is left or the grace
        has run out (``Host.drained``). A second signal stops at once, as uvicorn does.
        """

        def handle_exit(self, sig, frame) -> None:
            if host.scheduler.closing:
                super().handle_exit(sig, frame)
                return
            host.begin_shutdown()
            self._captured_signals.append(sig)  # raised again once stopped, so the exit status is the signal's

        async def on_tick(self, counter: int) -> bool:
            if not self.should_exit and host.drained():
                self.should_exit = True
            return await super().on_tick(counter)

    server = Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 3


def cmd_plugins(args: argparse.Namespace) -> int:
    settings = Settings()
    pm = build_plugin_manager(settings)
    for record in pm.millm_report.records:  # type: ignore[attr-defined]
        line = f"{record.name:24} {record.version or '-':10} {record.status}"
        if record.error:
            line += f"  {record.error}"
        print(line)
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    settings = Settings()
    build_plugin_manager(settings)
    for setting in settings.declared:
        value = settings[setting.name]
        shown = ("<set>" if value else "<unset>") if setting.secret else repr(value)
        print(f"{setting.name}={shown}  ({setting.type.__name__}, default {setting.default!r})")
        print(f"    {setting.help}")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from .app import Host

    settings = Settings()
    host = Host(settings, build_plugin_manager(settings))
    host.db.upgrade(host.migrations())
    print(f"database at head: {host.db.shown_url}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millm", description="OpenAI-compatible LLM server with plugins")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the server")
    serve.add_argument("--model", help="a local HF checkpoint directory, a .gguf file or a model id")
    serve.add_argument(
        "--engine",
        help="the installed engine to serve files several engines can serve (e.g. .gguf); "
        "default: the one that declares the highest preference",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=cmd_serve)
    sub.add_parser("plugins", help="list installed plugins").set_defaults(func=cmd_plugins)
    sub.add_parser("settings", help="list settings").set_defaults(func=cmd_settings)
    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply every plugin's migrations").set_defaults(func=cmd_db)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if os.environ.get("MILLM_LOG_FORMAT", "").strip().lower() == "json":
        from .observability.logs import use_json

        use_json(logging.getLogger().level)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

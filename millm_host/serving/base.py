"""``Serving``: one request's lifecycle, the same for every endpoint (vLLM's ``OpenAIServing``).

build context → validate, tokenize and check → admission → engine work →
render → headers and extras. Each endpoint is a subclass that overrides only
what differs (``ServingChat``, ``ServingCompletion``, ``ServingScoring``,
``ServingEmbeddings``); ``host.serving[endpoint]`` holds one per endpoint. No
HTTP here: ``handle`` takes a parsed body and the request headers and returns a
``Result``; a resource writes it, and anything else that serves a body (the
Batch API) can call ``handle`` the same way.

Threads: the context is built on the event loop for a body of at most
``INLINE_BODY_BYTES`` (a larger one on a worker thread: work in proportion to the
body never blocks the event loop). For the model that is serving, one hop to the
text thread (the engine thread for an engine without ``concurrent_text``) runs
``validate_request``, the render, tokenizing, the checks and ``after_tokenize``;
the engine work is the second hop (two hand-offs per request,
``tests/test_harness.py`` counts them). A model still to load takes one more:
``validate_request`` on a worker first (a refused request starts no load), then
the same hop without it. Everything else runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import hookcalls
from ..admission import BACKGROUND, Admission, admit, admit_leased
from ..bodies.validate import refuse_long_chat, validate
from ..context import Endpoint, RequestContext
from ..engine import SERVED_ADAPTER
from ..errors import ClientDisconnected, MillmError, RequestCancelled
from ..fields import check_fields, strict_mode
from ..headers import serialize_string_list
from ..intake import CONNECTION
from ..observability.request import CURRENT
from ..openapi import Operation
from ..output import ResponseExtra
from .generation import flatten

if TYPE_CHECKING:
    import pluggy
    from pydantic import BaseModel

    from ..adapters import AdapterRegistry
    from ..engine import Engine
    from ..fields import FieldRegistry
    from ..intake import IntakeGate
    from ..observability.request import Observation
    from ..plugin_host import PluginHost
    from ..registry import ModelRegistry
    from ..scheduler import Scheduler
    from ..settings import Settings


class ServingHost(Protocol):
    """What serving an endpoint uses of the host (``millm_host.app.Host`` is one)."""

    settings: Settings
    pm: pluggy.PluginManager
    fields: FieldRegistry
    plugin_host: PluginHost
    registry: ModelRegistry
    adapters: AdapterRegistry
    scheduler: Scheduler
    intake: IntakeGate
    serving: dict[str, Serving]

    def observe(self, endpoint: str, headers: Mapping[str, str]) -> Observation | None: ...


#: Waits until the client has gone away (``Serving.handle``'s ``gone``); a resource makes one.
ClientGone = Callable[[], Awaitable[None]]
#: A streamed answer: chunks (dicts), ``None`` for a keep-alive, ``"[DONE]"`` last.
Chunks = AsyncGenerator[dict[str, Any] | str | None, None]


@dataclass
class Result:
    """What ``Serving.handle`` answers: a JSON body, or a stream of chunks; the headers either way.

    A stream holds the request's admission until it ends: iterate it to the end,
    or ``aclose()`` it.
    """

    headers: dict[str, str]
    body: dict[str, Any] | None = None
    stream: Chunks | None = None
    #: The id the request was logged and traced under (set by ``observed``), e.g. for a Batch line.
    request_id: str | None = None


class Serving:
    """One endpoint's requests, from a parsed body to a ``Result`` (see the module docstring).

    Subclasses set ``endpoint`` and ``protocol`` and override the steps that differ:
    ``read`` (their own fields, at build time), ``validate``, ``tokenize``, ``check``,
    ``run`` (the engine work) and ``render``, or ``respond`` as a whole (generation).
    """

    endpoint: Endpoint
    protocol: type[BaseModel]
    #: The success body and (for a streaming endpoint) each streamed chunk, for ``/openapi.json``.
    response_model: type[BaseModel] | None = None
    chunk_model: type[BaseModel] | None = None
    #: Statuses a request can be refused with besides 400 and 500: an unknown model, a conflict
    #: (scoring precision), the queue full, the model busy or not loaded.
    refusals: tuple[int, ...] = (404, 409, 503)
    #: Stream events carry their ``type`` as the SSE ``event:`` name (the Responses API's stream).
    named_events: bool = False

    def __init__(self, host: ServingHost) -> None:
        self.host = host

    @property
    def route(self) -> str:
        """The key of ``host.serving`` and the name requests are recorded under (the endpoint's own)."""
        return self.endpoint

    def streams(self, params: Any) -> bool:
        """Whether the validated request asks for a stream (no endpoint streams unless it says so)."""
        return False

    def describe(self) -> Operation:
        """This endpoint in ``/openapi.json``: its protocol, its response and its stream's chunks."""
        return Operation(
            summary=(type(self).__doc__ or "").strip().splitlines()[0],
            request=(self.protocol,),
            response=(self.response_model,) if self.response_model else None,
            stream=self.chunk_model,
            errors=self.refusals,
            endpoint=self.endpoint,
        )

    # --- the lifecycle ------------------------------------------------------------------
    async def observed(
        self, body: dict[str, Any], headers: dict[str, str], *, gone: ClientGone | None = None
    ) -> Result:
        """``handle``, recorded: metrics, the request's span, its id in the logs (what a resource calls).

        The request is recorded once it is over: when ``handle`` refuses it, when it
        returns a body, or when its stream ends.
        """
        observation = self.host.observe(self.route, headers)
        if observation is None:
            return await self.handle(body, headers, gone=gone)
        token = CURRENT.set(observation)
        try:
            result = await self.handle(body, headers, gone=gone)
        except MillmError as exc:
            observation.finish(exc.status)
            raise
        except asyncio.CancelledError:
            observation.finish(ClientDisconnected.status)
            raise
        except BaseException:
            observation.finish(500)
            raise
        finally:
            CURRENT.reset(token)
        if result.stream is None:
            observation.finish(200)
            return replace(result, request_id=observation.request_id)
        return replace(result, stream=observation.follow(result.stream), request_id=observation.request_id)

    async def handle(self, body: dict[str, Any], headers: dict[str, str], *, gone: ClientGone | None = None) -> Result:
        """Serve one request: ``body`` is the parsed JSON, ``headers`` the request's, names lower-cased.

        ``gone`` (optional) returns once the client has gone away: the request is then
        cancelled (its queue place freed at once, its generation stopped at the next
        token). Raises a ``MillmError`` for a refusal.
        """
        if small_body(headers):  # a worker thread's round trip would cost more than validating it here
            ctx = self.build_context(body, headers)
        else:  # validation takes time in proportion to the body: off the event loop
            ctx = await asyncio.to_thread(self.build_context, body, headers)
        return await self.serve(ctx, gone)

    async def serve(self, ctx: RequestContext, gone: ClientGone | None = None) -> Result:
        """Everything after the context is built: watch the client, prepare, respond."""
        watcher = watch_client(ctx, gone)
        intake, connection, began = self.host.intake, CONNECTION.get(), None
        try:
            if not BACKGROUND.get():  # the Batch API's own lines are the batch's rows, not new clients
                await intake.enter(ctx.cancel_event, connection)
            if ctx.cancel_event.is_set():  # its client left while it waited at the gate
                raise RequestCancelled()
            began = time.monotonic()
            admission = await self.prepare(ctx)
        except BaseException as exc:
            if watcher is not None:
                watcher.cancel()
            if isinstance(exc, RequestCancelled):
                if began is not None:  # its client left during its intake
                    intake.charge(time.monotonic() - began, connection)
                raise ClientDisconnected("the client went away before the request was prepared") from None
            raise
        if watcher is not None:
            # a client that leaves before its answer is charged the time it held the server; one that stays
            # has proved its connection
            def settle(task: asyncio.Future) -> None:
                if task.cancelled():
                    intake.answered(connection)
                else:
                    intake.charge(time.monotonic() - began, connection)

            watcher.add_done_callback(settle)
        return await self.respond(ctx, admission, watcher)

    def build_context(self, body: dict[str, Any], headers: dict[str, str]) -> RequestContext:
        """Validate the protocol and the fields, resolve the model entry (once); no plugin or model work yet."""
        host = self.host
        # before validation builds a model a message (and a part)
        refuse_long_chat(body, host.settings["MILLM_MAX_MESSAGES"], host.settings["MILLM_MAX_CONTENT_PARTS"])
        params = validate(self.protocol, body)
        strict = strict_mode(headers)
        entry, adapter = host.adapters.resolve(params.model)
        ctx = RequestContext(
            entry=entry,
            adapter=adapter,
            endpoint=self.endpoint,
            body=body,
            params=params,
            headers=headers,
            model=entry.descriptor,
            engine_name=entry.spec.name,
            settings=host.settings,
            host=host.plugin_host,
            engine_capabilities=entry.spec.capabilities,
            streaming=self.streams(params),
        )
        observation = CURRENT.get()
        if observation is not None:
            observation.attach(ctx)
        ctx.unused_fields = check_fields(host.fields, self.endpoint, entry.spec.name, body, strict)
        self.read(ctx)
        return ctx

    def precheck(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Refuse ``body`` as ``handle`` would before admitting it (protocol, fields, model name, plugins'
        ``validate_request``), running nothing: the Batch API checks every line with it (worker thread)."""
        self.validate(self.build_context(body, headers))

    def read(self, ctx: RequestContext) -> None:
        """The endpoint's own reading of the validated request, still before any plugin (worker thread)."""

    def validate(self, ctx: RequestContext) -> None:
        """Refuse what cannot be honoured: plugins' ``validate_request`` (off the event loop: the text
        thread on the serving model's path, else a worker thread before any load)."""
        hookcalls.request(self.host.pm, "validate_request", ctx=ctx)

    async def prepare(self, ctx: RequestContext) -> Admission:
        """Plugins validate, the model is made resident, prompts tokenized and checked.

        Returns the request's admission (queue place and model lease); ``respond``
        releases it when the request ends.
        """
        host = self.host
        lease = None if BACKGROUND.get() else host.registry.lease_if_serving(ctx.entry)
        if lease is not None:
            # The model serves: the queue place at once (a full queue refuses before any work), then one
            # hop validates, renders, tokenizes and checks.
            admission = await admit_leased(host, lease)
            try:
                await self._text_hop(admission, self._validate_and_tokenize, ctx, admission.engine)
            except BaseException:
                admission.release()
                raise
            return admission
        # A model to load (a refused request must not start one), or background work (a batch line waits
        # for its place without holding the model): validate first, on a worker.
        await asyncio.to_thread(self.validate, ctx)
        if ctx.cancel_event.is_set():  # its client has gone: it never takes a queue place
            raise RequestCancelled()
        admission = await admit(host, ctx.entry, ctx.cancel_event)  # a client that leaves stops waiting for a load
        try:
            ctx.engine = admission.engine
            await self._text_hop(admission, self._tokenize_and_check, ctx)
        except BaseException:
            admission.release()
            raise
        return admission

    async def _text_hop(self, admission: Admission, fn: Callable[..., None], ctx: RequestContext, *args: Any) -> None:
        """``fn(ctx, *args)`` in one hop: on the text thread when the engine's text methods may run beside a
        generation (a refusal that needs only the tokenizer never waits behind one), else on its engine
        thread, the plugin hooks of the hop with it."""
        run = self.host.scheduler.run_text if admission.engine.concurrent_text else admission.run
        await run(fn, ctx, *args, cancel=ctx.cancel_event)
        if ctx.cancel_event.is_set():  # its client left while the hop ran: nothing more is done for it
            raise RequestCancelled()

    def _validate_and_tokenize(self, ctx: RequestContext, engine: Engine) -> None:
        """On the text thread, for the serving model: plugins' ``validate_request`` (which sees no engine,
        as on the other path), then everything ``_tokenize_and_check`` does."""
        self.validate(ctx)
        ctx.engine = engine
        self._tokenize_and_check(ctx)

    def _tokenize_and_check(self, ctx: RequestContext) -> None:
        """On the text (or engine) thread: render and tokenize, the host's checks, then plugins' ``after_tokenize``."""
        self._render_and_tokenize(ctx)
        self.check(ctx)
        hookcalls.request(self.host.pm, "after_tokenize", ctx=ctx)

    def _render_and_tokenize(self, ctx: RequestContext) -> None:
        """On the text (or engine) thread: plugins adjust the render for the resident model, then tokenize."""
        hookcalls.request(self.host.pm, "before_tokenize", ctx=ctx)
        self.refuse_unfitting_text(ctx)
        self.tokenize(ctx)

    def refuse_unfitting_text(self, ctx: RequestContext) -> None:
        """Refuse text that cannot fit the window whatever its tokens, before tokenizing it.

        From a lower bound on its token count, its length over ``Engine.max_chars_per_token``;
        the refusal is the one tokenizing would give (``context_length_exceeded``).
        """

    def tokenize(self, ctx: RequestContext) -> None:
        """Set ``ctx.prompts``, the token ids of every prompt, and refuse what the tokenizer shows is wrong.

        Runs on the text thread, or the engine thread when the engine's text methods must run there.
        """
        raise NotImplementedError

    def check(self, ctx: RequestContext) -> None:
        """Checks on the tokenized prompts (on the text thread after tokenizing, or the event loop)."""

    async def respond(self, ctx: RequestContext, admission: Admission, watcher: asyncio.Future | None) -> Result:
        """The engine work (``run`` on the engine thread), then the rendered body and the headers.

        Owns ``admission`` and ``watcher`` from here: both end when the engine work does.
        """
        try:
            output = await admission.run(self._run_served, ctx, cancel=ctx.cancel_event)
        except RequestCancelled:
            raise ClientDisconnected("the client went away before the answer was ready") from None
        finally:
            admission.release()
            if watcher is not None:
                watcher.cancel()
        ctx.finished = True
        body = add_extras(self.host, ctx, self.render(ctx, output))
        return Result(headers=self.headers(ctx), body=body)

    def _run_served(self, ctx: RequestContext) -> Any:
        """``run``, its engine calls serving the request's adapter (in the engine thread's copy of the
        request's context: nothing to reset)."""
        SERVED_ADAPTER.set(ctx.adapter)
        return self.run(ctx)

    def run(self, ctx: RequestContext) -> Any:
        """The engine work (engine thread); its result goes to ``render``."""
        raise NotImplementedError

    def render(self, ctx: RequestContext, output: Any) -> dict[str, Any]:
        """The response body, before plugins' extras (event loop)."""
        raise NotImplementedError

    def headers(self, ctx: RequestContext) -> dict[str, str]:
        """The response headers: every plugin's (``render_headers``)."""
        return collect_headers(self.host, ctx)


#: A body of at most this many bytes (``Content-Length``) is validated on the event loop: tens of
#: microseconds, where a worker thread's round trip wakes two threads (a drop storm's requests paid
#: for it on a loaded machine, issue 35). Larger bodies, and bodies of unknown length, go to a thread.
INLINE_BODY_BYTES = 4096


def small_body(headers: dict[str, str]) -> bool:
    """Whether the request's body is known to be at most ``INLINE_BODY_BYTES``."""
    length = headers.get("content-length", "")
    return length.isdigit() and int(length) <= INLINE_BODY_BYTES


def watch_client(ctx: RequestContext, gone: ClientGone | None) -> asyncio.Task | None:
    """A task that ends when ``gone`` does (the client left); then the request's ``cancel_event`` is set."""
    if gone is None:
        return None

    def cancel(task: asyncio.Task) -> None:
        if not task.cancelled():
            ctx.interrupted = ctx.interrupted or "client_disconnected"
            ctx.cancel_event.set()

    task = asyncio.ensure_future(gone())
    task.add_done_callback(cancel)
    return task


def collect_headers(host: ServingHost, ctx: RequestContext) -> dict[str, str]:
    """Every plugin's response headers, and ``X-miLLM-Plugin-Errors`` when a plugin's rendering failed."""
    headers: dict[str, str] = {}
    for result in hookcalls.rendering(host.pm, "render_headers", ctx):
        if result:
            headers.update(result)
    if ctx.plugin_errors:
        headers[hookcalls.PLUGIN_ERRORS_HEADER] = serialize_string_list(ctx.plugin_errors)
    return headers


def collect_extras(host: ServingHost, ctx: RequestContext) -> list[ResponseExtra]:
    extras = [e for e in flatten(hookcalls.rendering(host.pm, "response_extras", ctx)) if isinstance(e, ResponseExtra)]
    return sorted(extras, key=lambda e: e.order)


def add_extras(host: ServingHost, ctx: RequestContext, body: dict[str, Any]) -> dict[str, Any]:
    """Merge every plugin's body extras into a non-streamed ``body``, in order (a choice's into that choice)."""
    for extra in collect_extras(host, ctx):
        if extra.choice is None:
            body.update(extra.fields)
        else:
            choice = choice_of(body, extra.choice)
            if choice is not None:
                choice.update(extra.fields)
    return body


def choice_of(body: dict[str, Any], index: int) -> dict[str, Any] | None:
    """The choice of ``body`` (a completion or a chunk) whose ``index`` is ``index``; None when it has none."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return None
    return next((c for c in choices if isinstance(c, dict) and c.get("index") == index), None)

"""Hook specifications: the whole surface a millm plugin can use.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose names
and argument names match the specs below, registered under the ``millm``
entry-point group. An implementation may take any subset of a spec's arguments,
and must not rely on a default argument value (pluggy passes none). A plugin
imports the host only through ``millm_host.api`` (and this module).

Every hook reaches the host: startup and lifecycle hooks take ``host``, request
hooks ``ctx.host``. A plugin keeps its per-host object in ``host.state[<its
name>]`` (made at ``startup``), never in module-level state.

What happens when an implementation raises is one of the named policies in
``millm_host.hookcalls.POLICIES`` (startup, lifecycle, request, after_generate,
rendering, monitor); each spec ends with the policy it is called under.

Threads: startup hooks run on the main thread before the server accepts
connections. On the request path, ``validate_request``, ``before_tokenize`` and
``after_tokenize`` run off the event loop in one hop around tokenizing: on the text
thread, or the engine thread for an engine without ``concurrent_text``. When the
request's model is still to load, ``validate_request`` runs on a worker thread
before the load and the other two in that hop after it.
``before_forward`` and ``after_generate`` run on the engine thread, and
``render_headers`` and ``response_extras`` run on the event loop and must not block.
When the engine batches generations (``Engine.concurrent_generation``: continuous
batching), ``before_forward`` and ``after_generate`` of a generation run on that
request's own thread instead, several requests' at once.
State a plugin shares between ``before_tokenize`` and the engine-thread hooks needs a lock.

The hooks that run before generation (``validate_request``, ``before_tokenize``,
``after_tokenize``, ``before_forward``, ``before_scoring``) get the request as a
``RequestView``: every field reads as on ``RequestContext``, none can be set (but
``chat_tools``, before the render). A plugin keeps what it works out in
``ctx.state[<its name>]`` and gives the request what it contributes by returning it.

Each request-path hook is called a fixed number of times per request, never per
token or per layer: per-token and per-layer work goes into the plain callbacks
``before_forward`` returns, which the engine calls directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .batch_api.endpoints import BatchEndpoint
    from .context import RequestContext, RequestView
    from .engine import Engine, EngineSpec, LayerHook, LogitsProcessorFactory
    from .monitoring import MonitoredRequest
    from .output import OutputFilterFactory, ResponseExtra
    from .plugin_host import PluginHost
    from .settings import Setting

hookspec = pluggy.HookspecMarker("millm")
hookimpl = pluggy.HookimplMarker("millm")


# --- startup -------------------------------------------------------------------------


@hookspec
def register_settings(register: Callable[[Setting], None]) -> None:
    """Declare the environment settings this plugin reads.

    Called once while the plugin manager is built, before any other hook. Call
    ``register(Setting(name, type, default, help))`` for each; a name declared twice
    is refused. ``millm settings`` lists them; read values with
    ``host.settings[name]``.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_engines(register: Callable[[EngineSpec], None]) -> None:
    """Offer model engines.

    Called once at startup. Call ``register(EngineSpec(...))`` with ``"module:Class"``
    strings so that discovering the plugin imports nothing heavy. A duplicate
    engine name is refused.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_request_fields(register: Callable[..., None]) -> None:
    """Declare the request fields this plugin honours.

    Called once at startup. ``register(endpoint, fields, engines=None, requires=None,
    output_changing=False, scorable=True)``:
    endpoint is ``"chat.completions"``, ``"completions"`` or ``"embeddings"``; each
    field is a location pattern (``"steering"``, ``"messages[].name"``,
    ``"stream_options.include_usage"``); ``engines`` limits the claim to those engine
    names (None: every engine), ``requires`` to the engines that declare that
    capability (``EngineSpec.capabilities``, e.g. ``"layer_hooks"``). A sent field that no plugin claims for the request's
    endpoint and engine is reported in ``X-miLLM-Ignored-Fields``, or refused with
    ``400 field_not_honoured`` when it changes the output: the host's own such fields
    (``millm_host.fields.OUTPUT_CHANGING``) and those a plugin registers with
    ``output_changing=True`` (for every endpoint and engine, claimed there or not).
    ``scorable=False``: a scoring request carrying the field is refused.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_request_schemas(register: Callable[[str, type[BaseModel]], None]) -> None:
    """Describe, for ``/openapi.json``, the request fields this plugin adds to an OpenAI endpoint.

    Called once at startup, after ``register_request_fields``. ``register(endpoint,
    model)``: endpoint as in ``register_request_fields``; ``model`` is a pydantic model
    whose fields (all optional) join that endpoint's request schema. Describe a
    plugin's own routes with ``millm_host.api.operation`` on their responders instead.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_migrations(register: Callable[[str, str], None]) -> None:
    """Offer this plugin's Alembic migrations.

    Called by ``millm db upgrade`` and by ``millm serve`` at start.
    ``register(name, script_location)``: the plugin's name (its branch label, and
    its version table ``alembic_version_<name>``) and the directory holding its
    ``env.py``-less ``versions/``. Each plugin migrates only its own tables.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_routes(host: PluginHost, add_route: Callable[[str, Any], None]) -> None:
    """Add HTTP routes: ``add_route(uri_template, falcon_asgi_resource)``.

    Called once while the app is built, after ``startup``. Resources reach the
    plugin's per-host object (``host.state``), settings, the database and admitted
    engine work (``host.engine_slot``) through ``host``; subclass
    ``millm_host.api.JsonResource`` to read bodies the host's way. Errors raised as
    ``MillmError`` are rendered in OpenAI's shape.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def register_batch_endpoints(host: PluginHost, register: Callable[[str, BatchEndpoint], None]) -> None:
    """Offer URLs a batch may name (``POST /v1/batches``'s ``endpoint``) beside the host's own.

    Called once while the app is built, after ``startup`` and before ``register_routes``,
    on the main thread. ``register(url, endpoint)``: ``url`` is the path a line names
    (``"/api/probes/score"``), usually a route of the plugin's; a URL registered twice
    is refused. ``endpoint`` (``millm_host.api.BatchEndpoint``) offers
    ``precheck(body, headers)``, called in a worker thread for each line while the
    batch validates, which raises a ``MillmError`` for a body the route would refuse
    and runs nothing; and ``async observed(body, headers, *, gone=None)``, called on
    the event loop for each line at batch priority, which returns a
    ``millm_host.api.BatchResult`` (``body``, ``headers``, ``request_id``; the host's
    serving results have the same shape) or raises a ``MillmError``, written as that
    line's error with its status. ``gone`` returns once the batch is cancelled or the
    server stops; an endpoint may ignore it (its line then runs to its end).
    Return nothing. The host's ``/v1/chat/completions``, ``/v1/completions`` and
    ``/v1/embeddings`` are registered first, in the same registry.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def startup(host: PluginHost) -> None:
    """The app is built and the database migrated; load persisted state here.

    Called once, on the main thread, before the server accepts connections.

    Policy: startup (``millm_host.hookcalls``): a plugin that raises is reported as
    failed and unregistered; the server starts without it.
    """


@hookspec
def shutdown(host: PluginHost) -> None:
    """The server is stopping: release what ``startup`` took.

    Called once, on the event loop's shutdown (a worker thread), after the last
    request and before the resident model is closed.

    Policy: lifecycle (``millm_host.hookcalls``): an error is logged and every other
    plugin still runs.
    """


@hookspec
def filter_listed_models(host: PluginHost, model_ids: list[str]) -> list[str] | None:
    """Narrow what ``/v1/models`` lists: return the ids of ``model_ids`` to keep.

    Called on the event loop for each listing; None keeps everything. A model is
    listed only if every plugin that answers keeps it (e.g. a steering lock).

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


# --- model lifecycle -----------------------------------------------------------------


@hookspec
def model_loaded(host: PluginHost, engine: Engine) -> None:
    """A model became resident. Called on the engine thread after the load.

    Policy: lifecycle (``millm_host.hookcalls``): an error is logged and every other
    plugin still runs.
    """


@hookspec
def model_unloading(host: PluginHost, engine: Engine) -> None:
    """A model is about to be unloaded (no request is running on it).

    Called on the engine thread before its memory is released; plugins drop
    what they attached to it (SAEs detach, probes disarm).

    Policy: lifecycle (``millm_host.hookcalls``): an error is logged and every other
    plugin still runs.
    """


# --- the request path ----------------------------------------------------------------


@hookspec
def validate_request(ctx: RequestView) -> None:
    """Refuse what this plugin cannot honour, before any model load.

    Called once per request off the event loop after the host validated the
    protocol and the fields: on the text thread (the engine thread for an engine
    without ``concurrent_text``), just before ``before_tokenize``, when the model is
    serving (keep it short: other requests' tokenizing waits behind it; a database
    read is fine), else on a worker thread before the model loads. Raise a ``MillmError`` (400 with the field as ``param``) to refuse; return
    nothing otherwise. ``ctx.engine`` is not set.

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


@hookspec
def before_tokenize(ctx: RequestView) -> None:
    """The model is resident (``ctx.engine`` is set); the prompts are not tokenized yet.

    Called once per request on the text thread (the engine thread for an engine
    without ``concurrent_text``), just before the host renders and tokenizes
    ``ctx.conversations`` (or the completion prompts); another request may be
    generating on the engine thread meanwhile. Adjust what is
    rendered for the resident model here (``ctx.conversations``, ``ctx.chat_tools``),
    e.g. from its chat template; the engine's tokenizer may be used. Raise a
    ``MillmError`` to refuse: the request fails before it queues and before a
    stream's ``200``.

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


@hookspec
def after_tokenize(ctx: RequestView) -> None:
    """The model is resident, ``ctx.prompts`` holds the token ids and ``ctx.sampling`` is settled.

    Called once per request right after tokenizing, in the same hop: on the text
    thread (another request's tokenizing waits behind it: keep it short), or on the
    engine thread for an engine without ``concurrent_text``; before the request
    queues and before a stream's ``200``: the last point to refuse with an HTTP status.

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


@hookspec
def before_forward(ctx: RequestView) -> list[LayerHook | LogitsProcessorFactory | OutputFilterFactory] | None:
    """Prepare per-request state and return what the engine should install.

    Called once per request on the engine thread, once the request holds the
    generation slot and before the first forward pass. Return ``LayerHook``s
    (residual callbacks), ``LogitsProcessorFactory``s (next-token constraints) and
    ``OutputFilterFactory``s (text rewriting, e.g. tool-call parsing), or None.
    A request for which every plugin returns nothing installs no layer hook.

    Layer hooks under continuous batching (``MILLM_BATCHING=continuous``): many
    requests share each forward pass, a row each. A hook's ``callback`` gets its
    request's row alone (``[1, seq, d_model]``, its own ``start``), once per pass:
    plugins written for the serial engine work unchanged. A hook may instead take the
    batch: ``LayerHook.batched(hidden, rows)``, one function shared by all requests'
    hooks, called once per point, ``order`` and pass with the whole ``hidden`` and the
    row → request map, a ``HookRow`` (``index``, ``start``, ``skip``, ``hook``) for each
    request that carries it, and nothing for the others. It reads and writes only those
    rows (``hidden[row.index, row.skip:]``; ``row.hook.state`` is that request's own);
    a write returns the batch with only its rows changed. So a read can gather all its
    requests' rows in one operation (the probes plugin: one copy per pass for every
    armed probe of every row; steering's ``return_sae_activations``: one encode per SAE
    and one device-to-host copy per pass for every reading row) and a write can add each
    row its own vector in one operation (steering: unsteered rows add nothing). A row's
    prompt may come in several passes (chunked prefill), each with its ``start``, and one
    step of the batch may run several passes (one per prefill under way, then the decode
    of the running rows): a hook must not assume that a pass holds a request's whole
    prompt, nor that the rows of a pass share a ``start``. Alone, a request is a batch of
    one: ``batched`` is called with ``HookRow(0, start, 0, hook)``. See ``LayerHook``.

    A request with ``ctx.with_unsteered`` generates every choice twice, steered rows and
    unsteered rows: ``LayerHook.variant`` says which a hook serves (a steering write says
    ``STEERED``; a hook that says nothing serves both, each of its calls then one reply's row).

    Never called for scoring requests (``ctx.scoring``) nor embeddings: they are
    never steered and never monitored.
    Raising a ``MillmError`` fails the request (an error event on a stream).

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


@hookspec
def before_scoring(ctx: RequestView) -> list[LayerHook] | None:
    """Return read hooks for a scoring request's forward passes, or None.

    Called once per scoring request (``ctx.scoring``) on the engine thread, before
    its forward passes, in place of ``before_forward``. Scoring is never steered:
    what a callback returns is discarded, so a hook can only read (e.g. per-request
    SAE activations, reported as unsteered). Not called for float32 scoring.

    Policy: request (``millm_host.hookcalls``): the first error propagates as the
    request's error.
    """


@hookspec
def after_generate(ctx: RequestContext) -> None:
    """Generation ended: ``ctx.outputs`` holds every sequence.

    Called once per request on the engine thread, also when the request was
    interrupted (``ctx.interrupted`` names why: ``client_disconnected``,
    ``cancelled``, ``generation_thread_hung``, ``generation_error``) or failed
    (``ctx.error``). For a generation that hung and did not stop in time, or one
    given up before it started because the engine thread hung, the host calls it
    from a worker thread instead. Score,
    record and release per-request state here. Raising a ``MillmError`` fails a
    request that had not failed yet (e.g. an output that breaks its contract);
    every implementation still runs. Never called for scoring requests nor
    embeddings (nothing is generated, and neither is monitored).

    Policy: after_generate (``millm_host.hookcalls``): every plugin runs; the first
    ``MillmError`` fails the request.
    """


@hookspec
def render_headers(ctx: RequestContext) -> dict[str, str] | None:
    """Return this plugin's ``X-miLLM-*`` response headers.

    Non-streaming: called once after generation (``ctx.finished`` is True), also
    for scoring requests (``ctx.scoring``; nothing was steered) and embeddings
    (``ctx.endpoint == "embeddings"``; they carry no steering header).
    Streaming: called once before the stream opens (``ctx.finished`` is False);
    what is known only after generation goes in ``response_extras`` instead.
    Values must already be serialised (RFC 8941 through ``millm_host.headers``).

    Policy: rendering (``millm_host.hookcalls``): a plugin that raises never fails
    the response: its contribution is left out and it is named in ``X-miLLM-Plugin-
    Errors`` (on a stream, also in ``millm_plugin_errors`` on the last finish chunk).
    """


@hookspec
def response_extras(ctx: RequestContext) -> list[ResponseExtra] | None:
    """Return body fields to add to the response.

    Called once after generation completes, on the event loop; not for a stream
    whose client went away (nothing can reach it: record such a request in
    ``after_generate``). Non-streaming: each extra's fields are merged into the body.
    Streaming: the fields are merged, in ascending ``order``, into the stream's last
    ``finish_reason`` chunk (held back until generation ends), never a chunk of
    their own: every chunk but the usage chunk has a choice.

    Policy: rendering (``millm_host.hookcalls``): a plugin that raises never fails
    the response: its contribution is left out and it is named in ``X-miLLM-Plugin-
    Errors`` (on a stream, also in ``millm_plugin_errors`` on the last finish chunk).
    """


@hookspec
def monitor_results(ctx: RequestContext | None, monitored: MonitoredRequest) -> list[dict[str, Any]] | None:
    """Report results beside the probes' on a monitored request (e.g. rule signals).

    Called by the probes plugin once per request (with ``with_unsteered``, once per
    reply: steered, then unsteered) while at least one probe is armed,
    on the engine thread, from its ``after_generate`` (so before rendering), also for
    a request it skips (``monitored.skip``: judge traffic, an unscored engine) or one
    that was interrupted (``monitored.interrupted``). ``monitored.behaviours`` maps
    each armed behaviour key to the windows its probes report; ``monitored.window(name)``
    is that window's decoded text, or the outcome and reason the probes report for it.
    Return ``mi.probe.result/v1`` objects with a ``kind`` of your own (not ``"probe"``),
    ``probe_id: None``, a ``name``, a ``window`` and ``fires``: the probes plugin lists
    them after its own in the header, the body, the stream and the events list, and
    stores them. A returned result never changes a probe result.

    Stateless routes call it too: ``POST /api/probes/score`` once per input, with
    ``ctx=None`` and ``monitored.stateless`` true (read the host from
    ``monitored.host``; ``monitored.state`` is shared by the request's inputs). It
    runs off the event loop with no live budget, so a plugin may wait for what it
    decides; the results are listed after that input's probe results and are not
    stored: return them with ``persistence: "not_persisted"``.

    Policy: monitor (``millm_host.hookcalls``): every plugin runs; one that raises is
    logged and its results are left out.
    """


@hookspec
def revise_monitor_results(host: Any, results: list[dict[str, Any]]) -> int | None:
    """Replace stored results in place: each of ``results`` replaces the stored result with its ``result_id``.

    For a plugin that decides one of its ``monitor_results`` results only after the
    response (rule signals: operator code is scored by the rule runner after the
    chat, D41). The plugin that stores monitored results (probes) implements it and
    returns how many it replaced (0: none stored yet under those ids; call again).
    Called with ``revise_monitor_results(host, results)`` from ``millm_host.api``,
    on any thread but the event loop's (it writes the database).

    Policy: monitor (``millm_host.hookcalls``): every plugin runs; one that raises is
    logged and counts as having replaced none.
    """

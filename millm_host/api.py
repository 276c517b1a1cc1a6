"""The public plugin API: the one module a millm plugin imports (with ``millm_host.hookspecs``).

An import-linter contract (``tests/test_import_contracts.py``) holds every plugin
to this module and ``millm_host.hookspecs``: a plugin that needs something this
module lacks gets it added here, never imported from another host module.

What is here:

- ``hookimpl``, the marker of a hook implementation (the hooks: ``millm_host.hookspecs``).
- ``RequestContext`` and ``SequenceOutput``: what request-path hooks receive; ``RequestView``: the
  read-only request the hooks before generation receive.
  ``ctx.host`` is the ``PluginHost`` (every hook reaches it), ``ctx.state[<plugin>]``
  is per-request scratch space, ``ctx.messages`` every conversation's messages
  in full as sent (read them, not ``ctx.body``).
- ``PluginHost`` (also named ``Host``), the type of ``host`` and ``ctx.host``: a narrow view
  of the host, and the whole of what a plugin uses of it (``millm_host.plugin_host``, each
  part documented there): ``host.settings`` (every declared setting), ``host.state[<plugin>]``
  (the plugin's per-host object, made at ``startup``), ``host.db`` (a ``Database``:
  ``host.db.session()`` is a SQLAlchemy session for the plugin's own tables), ``host.metrics``
  (``counter(name, help, labels)`` and ``histogram(name, help, labels, buckets)`` give a
  series the plugin names ``millm_<plugin>_...``, ``.inc(**labels)``, ``.observe(value,
  **labels)``; ``trace_events(ctx, results, default_name)`` adds results to the request's
  span), ``host.engine_slot(model_id)`` (admitted work on the engine thread),
  ``host.run_on_engine_thread(fn, *args)``, ``host.model_detail(model_id)`` (state and
  identity), ``host.current_model()`` (the resident engine and its id, else 503),
  ``host.resident_engine()``, ``host.resident_model_id()``, ``host.still_resident(engine)``
  (no unload of it has begun), ``host.resolve_model_id(name)``, and ``host.app`` (the ASGI
  app, for pages built from the API's own answers in process).
- ``/openapi.json``: every route added is listed; ``@operation(summary, request=Model,
  response=Model, errors=(404,), query=[Param(...)])`` on a responder says what it takes
  and answers (``ResponseModel``: the base of a response body whose keys are all declared;
  ``ErrorResponse``: OpenAI's error shape). Request fields a plugin adds to an OpenAI
  endpoint are described by the ``register_request_schemas`` hook.
- Engine types: ``Engine``, ``EngineSpec`` (and the capabilities an engine declares:
  ``LAYER_HOOKS``, ``LOGITS_PROCESSORS``, ``SCORING``, ``EMBEDDINGS``, ``STEERING_VECTORS``,
  ``LORA_ADAPTERS``), ``ModelDescriptor``,
  ``ModelInfo``,
  ``HookPoint`` (its ``HookPointName``: ``resid_pre`` or ``resid_post``),
  ``LayerHook`` and ``HookRow`` (a hook that takes the whole batch; and the ``ORDER_*`` of reads and writes),
  ``STEERED``/``UNSTEERED`` and ``hooks_for`` (which reply's rows a hook serves: ``with_unsteered``),
  ``LogitsProcessorFactory``, ``SamplingParams``, ``TokenIterator`` (what ``generate``
  returns), the scoring types; ``generation_cancel()``
  (the running request's cancellation, for an engine that queues generations);
  ``LoraAdapter`` and ``served_adapter()`` (the LoRA adapter the engine work in this context serves).
- Response types: ``ResponseExtra``, ``OutputFilter``, ``OutputFilterFactory``,
  ``FilterResult`` (and the ``ORDER_*`` in which extras are merged).
- Results beside the probes': ``MonitoredRequest``, ``WindowText`` and
  ``monitor_results(ctx, monitored)`` (hook ``monitor_results``): the probes plugin
  calls it, other plugins implement the hook; ``revise_monitor_results(host, results)``
  (hook ``revise_monitor_results``) replaces such a result once it is decided
  after the response, the probes plugin implements it;
  ``stateless_monitor_results(host, monitored)`` calls the hook for a stateless
  route (``POST /api/probes/score``), with ``ctx=None``. ``current_trace_id()``: the
  trace of the request served in this context (its span's when tracing is on, the
  caller's ``traceparent``, or minted), the one its log lines name;
  ``caller_trace(headers)``: a valid W3C ``traceparent``'s (trace id, parent id).
- Replicas and admin work (``services``): ``add_converger``, ``converge_soon``,
  ``replica_alone`` and ``admin_activity`` (what ``/api/health`` reports while it runs).
- Reasoning output (``millm_host.reasoning``): ``Markers`` (a model's thinking markers),
  ``model_markers(mode, chat_template)`` (those ``MILLM_REASONING`` splits a model's replies on;
  a live chat's are ``ctx.reasoning.markers``), ``reasoning_span(engine, prompt, generated,
  markers)`` (where the thinking block lies among a reply's tokens, a ``ReasoningSpan``).
- Batch lines for a plugin's route (hook ``register_batch_endpoints``): ``BatchEndpoint``
  (what ``register(url, endpoint)`` takes: ``precheck`` and ``observed``) and
  ``BatchResult`` (what ``observed`` returns for a line: ``body``, ``headers``, ``request_id``).
- Errors (``MillmError`` and the typed ones) and settings (``Setting``, ``Settings``).
- Request parsing: ``validate``, ``loc_to_param``, ``ChatMessage``, ``message_text``.
- Header serialisation (RFC 8941, by http-sfv): ``Token``, ``item`` (an ``Item``),
  ``serialize_item``, ``serialize_list``, ``serialize_string_list``, ``parse_list``.
- ``JsonResource``: the base of a plugin's JSON route (bodies read and checked
  the host's way); ``read_json``, ``read_body`` and ``lower_headers`` for a
  resource that does not subclass it.
- ``ctx.engine_capabilities``: what the request's engine declares; a plugin claims
  request fields by capability (``register(..., requires=LAYER_HOOKS)``), never by
  engine name.
- Small helpers engines share: ``split_gguf_name``, ``save_atomically``,
  ``available_memory``, ``fallback_chat_render``; ``free_later(obj)``, which frees a
  long list (a long text's token ids) a slice at a time on a thread of its own once
  nothing else holds it (``millm_host.bodies.release``), not in one call that holds the GIL.
- ``testing``: ``millm_host.testing`` (a real server, tiny models, SSE reading, the
  engine conformance suite), imported on first use so that plugins never load it.
"""

from __future__ import annotations

from typing import Any

from .batch_api.endpoints import BatchEndpoint, BatchResult
from .bodies.release import keep_if_long as free_later
from .bodies.validate import loc_to_param, validate
from .context import RequestContext, RequestView, SequenceOutput
from .db import Database
from .engine import (
    EMBEDDINGS,
    LAYER_HOOKS,
    LOGITS_PROCESSORS,
    LOGPROBS,
    LORA_ADAPTERS,
    ORDER_READ_POST_STEERING,
    ORDER_READ_PRE_STEERING,
    ORDER_WRITE_STEERING,
    READS_PROMPT,
    SCORING,
    STEERED,
    STEERING_VECTORS,
    UNSTEERED,
    Engine,
    EngineSpec,
    GeneratedToken,
    HookPoint,
    HookPointName,
    HookRow,
    LayerHook,
    LogitsProcessorFactory,
    LoraAdapter,
    ModelDescriptor,
    ModelInfo,
    NoChatTemplate,
    SamplingParams,
    TokenIterator,
    fallback_chat_render,
    generation_cancel,
    hooks_for,
    served_adapter,
)
from .errors import (
    INVALID_REQUEST,
    SERVER_ERROR,
    ContextLengthExceeded,
    FieldNotHonoured,
    InsufficientMemory,
    InvalidParameter,
    MillmError,
    ModelBusy,
    ModelLoadFailed,
    ModelNotLoaded,
)
from .files import save_atomically
from .headers import (
    Item,
    Token,
    item,
    parse_list,
    percent_encode,
    serialize_item,
    serialize_list,
    serialize_string_list,
)
from .hookspecs import hookimpl
from .monitoring import (
    MonitoredRequest,
    WindowText,
    monitor_results,
    revise_monitor_results,
    stateless_monitor_results,
)
from .naming import check_display_name, split_gguf_name
from .observability.ids import caller_trace
from .observability.request import current_trace_id
from .openapi import Param, operation
from .output import (
    ORDER_PROBE_VERDICTS,
    ORDER_SAE_ACTIVATIONS,
    ORDER_STEERING,
    FilterResult,
    OutputFilter,
    OutputFilterFactory,
    ResponseExtra,
)
from .paging import page as list_page
from .paths import confined_path, plain_name
from .plugin_host import EngineSlot, PluginHost, PluginMetrics
from .protocol import ChatMessage, ResponseModel, message_text
from .reasoning import Markers, ReasoningSpan, model_markers, reasoning_span
from .registry import available_memory
from .resources.common import JsonResource, lower_headers, read_body, read_json
from .response_bodies import ErrorResponse
from .scoring.engine import (
    NextTokenScores,
    NonFiniteLogits,
    PromptTokenScores,
    ScoringParams,
    ScoringPrecisionUnavailable,
    TokenLogprob,
)
from .services import add_converger, admin_activity, converge_soon, replica_alone
from .settings import Setting, Settings

#: The type of ``host`` and ``ctx.host`` (the name plugins have used): the plugin's view.
Host = PluginHost

__all__ = [
    "BatchEndpoint",
    "BatchResult",
    "free_later",
    "list_page",
    "ModelLoadFailed",
    "percent_encode",
    "check_display_name",
    "add_converger",
    "admin_activity",
    "converge_soon",
    "replica_alone",
    "caller_trace",
    "current_trace_id",
    "confined_path",
    "plain_name",
    "EMBEDDINGS",
    "INVALID_REQUEST",
    "LAYER_HOOKS",
    "LOGITS_PROCESSORS",
    "LOGPROBS",
    "LORA_ADAPTERS",
    "ORDER_PROBE_VERDICTS",
    "ORDER_READ_POST_STEERING",
    "ORDER_READ_PRE_STEERING",
    "ORDER_SAE_ACTIVATIONS",
    "ORDER_STEERING",
    "ORDER_WRITE_STEERING",
    "READS_PROMPT",
    "STEERED",
    "STEERING_VECTORS",
    "UNSTEERED",
    "SCORING",
    "SERVER_ERROR",
    "ChatMessage",
    "ErrorResponse",
    "Param",
    "ResponseModel",
    "ContextLengthExceeded",
    "Database",
    "Engine",
    "EngineSpec",
    "FieldNotHonoured",
    "FilterResult",
    "GeneratedToken",
    "HookPoint",
    "HookPointName",
    "HookRow",
    "Host",
    "PluginHost",
    "PluginMetrics",
    "EngineSlot",
    "InsufficientMemory",
    "InvalidParameter",
    "Item",
    "JsonResource",
    "LayerHook",
    "LogitsProcessorFactory",
    "LoraAdapter",
    "Markers",
    "ReasoningSpan",
    "model_markers",
    "reasoning_span",
    "MillmError",
    "ModelBusy",
    "ModelDescriptor",
    "ModelInfo",
    "ModelNotLoaded",
    "MonitoredRequest",
    "NextTokenScores",
    "NoChatTemplate",
    "NonFiniteLogits",
    "OutputFilter",
    "OutputFilterFactory",
    "PromptTokenScores",
    "RequestContext",
    "RequestView",
    "ResponseExtra",
    "SamplingParams",
    "generation_cancel",
    "hooks_for",
    "served_adapter",
    "ScoringParams",
    "ScoringPrecisionUnavailable",
    "SequenceOutput",
    "Setting",
    "Settings",
    "Token",
    "TokenIterator",
    "TokenLogprob",
    "WindowText",
    "available_memory",
    "fallback_chat_render",
    "hookimpl",
    "item",
    "loc_to_param",
    "lower_headers",
    "message_text",
    "monitor_results",
    "revise_monitor_results",
    "stateless_monitor_results",
    "operation",
    "parse_list",
    "read_body",
    "read_json",
    "save_atomically",
    "serialize_item",
    "serialize_list",
    "serialize_string_list",
    "split_gguf_name",
    "testing",  # noqa: F822 (loaded on first use, by the module __getattr__)
    "validate",
]


def __getattr__(name: str) -> Any:
    """``api.testing`` is imported on first use: serving never loads the test helpers."""
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __package__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

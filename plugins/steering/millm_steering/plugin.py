"""Hook implementations of the steering plugin.

The service (live state and stored data) is built at ``startup``, one per host, and
kept in ``host.state["steering"]``; every hook reaches it through ``host`` or ``ctx.host``.
A request with nothing attached installs no hook and pays one snapshot read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from millm_host.api import (
    LAYER_HOOKS,
    ORDER_SAE_ACTIVATIONS,
    ORDER_STEERING,
    STEERING_VECTORS,
    ResponseExtra,
    Setting,
    add_converger,
    hookimpl,
    replica_alone,
)

from . import desired, request, routes
from .converge import Converger
from .header import INTENSITY, RUNG, STEERING
from .schemas import SteeringFields
from .service import SteeringService

MIGRATIONS = Path(__file__).parent / "migrations" / "versions"

STEERING_FIELDS = (
    "profile",
    "steering_intensity",
    "steering",
    "steering.sae_id",
    "steering.layer",
    "steering.features",
    "steering.features[].index",
    "steering.features[].strength",
)
ACTIVATION_FIELDS = (
    "return_sae_activations",
    "return_sae_activations.sae_id",
    "return_sae_activations.layer",
    "return_sae_activations.features",
    "return_sae_activations.top_k",
    "return_sae_activations.positions",
    "return_sae_activations.positions.start",
    "return_sae_activations.positions.end",
    "return_sae_activations.read_point",
)

#: The plugin's key in ``host.state``.
STATE_KEY = "steering"


def service(host) -> SteeringService:
    """This host's steering service (made at ``startup``)."""
    try:
        return host.state[STATE_KEY]
    except KeyError:
        raise RuntimeError("the steering plugin has not started on this host") from None


@hookimpl
def register_settings(register) -> None:
    """Where SAEs come from, the labels file limit, the activation limits and the intensity bounds."""
    register(
        Setting(
            "MILLM_SAE_DIRS",
            list,
            None,
            "Directories SAEs may be registered from (POST /api/saes); default <data dir>/saes",
        )
    )
    register(
        Setting(
            "SAE_LABELS_MAX_BYTES",
            int,
            64 * 1024 * 1024,
            "Largest feature-labels file imported (POST /api/saes/{sae_id}/labels), once decompressed",
        )
    )
    register(Setting("SAE_ACTIVATIONS_MAX_TOP_K", int, 64, "Largest top_k of return_sae_activations"))
    register(
        Setting(
            "SAE_ACTIVATIONS_MAX_ENTRIES",
            int,
            65536,
            "Largest worst case (positions × top_k) of return_sae_activations",
        )
    )
    register(
        Setting(
            "CLUSTER_INTENSITY_MIN",
            float,
            0.5,
            'What steering_intensity "min" means for a base with no declared intensity range',
        )
    )
    register(
        Setting(
            "CLUSTER_INTENSITY_MAX",
            float,
            2.0,
            'What "max" means, and the cap of a numeric steering_intensity, without a declared range',
        )
    )
    register(
        Setting(
            "CIRCUIT_INTENSITY_MIN",
            float,
            0.0,
            'The floor a circuit\'s λ is clamped to, and what "min" means, without a declared range',
        )
    )
    register(
        Setting(
            "CIRCUIT_INTENSITY_MAX",
            float,
            2.0,
            'The ceiling a circuit\'s λ is clamped to, and what "max" means, without a declared range',
        )
    )


@hookimpl
def register_request_fields(register) -> None:
    """Claim the steering fields on chat and text completions, on engines with layer hooks or steering
    vectors, and ``return_sae_activations`` on engines with layer hooks only. Both change the output, so
    the host refuses them wherever they are not claimed; a scoring request is never steered."""
    for endpoint in ("chat.completions", "completions"):
        for requires in (LAYER_HOOKS, STEERING_VECTORS):
            register(endpoint, STEERING_FIELDS, requires=requires, output_changing=True, scorable=False)
        register(endpoint, ACTIVATION_FIELDS, requires=LAYER_HOOKS, output_changing=True)


@hookimpl
def register_request_schemas(register) -> None:
    """The steering fields, in the chat and text completion request schemas of ``/openapi.json``."""
    for endpoint in ("chat.completions", "completions"):
        register(endpoint, SteeringFields)


@hookimpl
def register_migrations(register) -> None:
    """The ``steering_*`` tables, in their own version table."""
    register("steering", str(MIGRATIONS))


@hookimpl
def startup(host) -> None:
    """Build the service: the stored lock is read; SAEs and profiles stay in the database.

    The live state starts empty on the only replica (as a single server always did); a
    replica joining others converges to the desired state they share (converge.py).
    """
    steering = host.state[STATE_KEY] = SteeringService(host)
    if replica_alone(host):
        desired.write(host.db, desired.EMPTY)
    steering.converger = Converger(steering)
    add_converger(host, "steering", steering.converger)


@hookimpl
def shutdown(host) -> None:
    """Forget this host's service."""
    host.state.pop(STATE_KEY, None)


@hookimpl
def register_routes(host, add_route) -> None:
    """The management API (``/api/saes``, ``/api/steering``, ``/api/profiles``, ``/api/clusters``, ``/api/circuits``)."""
    routes.install(host, service(host), add_route)


@hookimpl
def filter_listed_models(host, model_ids: list[str]) -> list[str] | None:
    """While the steering lock is set, ``/v1/models`` lists only the locked model."""
    locked = service(host).locked_model
    return None if locked is None else [m for m in model_ids if m == locked]


@hookimpl
def model_loaded(host, engine) -> None:
    """SAEs may attach to the new resident model (and only to it)."""
    service(host).state.model_loaded(engine.info.load_id)


@hookimpl
def model_unloading(host, engine) -> None:
    """Attached SAEs (and their live values) go with the model: on the only replica from the
    desired state too; while others run, the next model loaded here attaches them again."""
    steering = service(host)
    snap = steering.state.model_unloading()
    if replica_alone(host):
        desired.write(host.db, desired.document_of(snap))
    steering.converger.applied = -1  # reach the desired state again with the next model


@hookimpl
def validate_request(ctx) -> None:
    """Refuse malformed or unservable ``profile``/``steering_intensity``/``steering``/``return_sae_activations``."""
    request.validate(ctx, service(ctx.host))


@hookimpl
def after_tokenize(ctx) -> None:
    """Check again against the resident model's SAEs; settle ``X-miLLM-Steering-Intensity``."""
    request.recheck(ctx, service(ctx.host))


@hookimpl
def before_forward(ctx) -> list[Any] | None:
    """The request's steering write hooks and activation read hook (none when nothing applies)."""
    return request.hooks(ctx, service(ctx.host))


@hookimpl
def before_scoring(ctx) -> list[Any] | None:
    """A scoring request's activation read hook (read only: scoring is never steered)."""
    return request.scoring_hooks(ctx, service(ctx.host))


@hookimpl
def after_generate(ctx) -> None:
    """Record what the hooks applied and the activations read."""
    request.finish(ctx)


@hookimpl
def render_headers(ctx) -> dict[str, str] | None:
    """``X-miLLM-Steering`` after a non-streamed generation (``none`` on scoring responses);
    ``X-miLLM-Steering-Intensity`` (a pre-generation echo) on streams too; ``X-miLLM-Circuit-Rung``
    when a circuit steers (after generation; on a stream, what was about to steer)."""
    if ctx.endpoint not in request.GENERATION_ENDPOINTS:
        return None
    if ctx.scoring:
        return {STEERING: request.header(ctx)}
    headers = {}
    req = ctx.state.get(request.STATE_KEY)
    if req is not None and req.echo is not None:
        headers[INTENSITY] = req.echo
    if ctx.finished and not ctx.streaming:
        headers[STEERING] = request.header(ctx)
    if req is not None and req.rung is not None and (ctx.streaming or ctx.finished):
        headers[RUNG] = req.rung
    return headers or None


@hookimpl
def response_extras(ctx) -> list[ResponseExtra] | None:
    """The ``millm`` activations object; on a stream, ``millm_steering`` on the finish chunk (always)."""
    if ctx.endpoint not in request.GENERATION_ENDPOINTS:
        return None
    if ctx.scoring:
        millm = request.scoring_activations(ctx)
        return None if millm is None else [ResponseExtra({"millm": millm}, ORDER_SAE_ACTIVATIONS)]
    extras = []
    req = ctx.state.get(request.STATE_KEY)
    if req is not None and req.millm is not None:
        extras.append(ResponseExtra({"millm": req.millm}, ORDER_SAE_ACTIVATIONS))
    if ctx.streaming:
        extras.append(ResponseExtra({"millm_steering": request.header(ctx)}, ORDER_STEERING))
    return extras or None

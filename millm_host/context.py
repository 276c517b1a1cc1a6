"""The per-request object passed down the hook chain."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .cancellation import Cancellation
from .observability.timing import Timing

if TYPE_CHECKING:
    from .engine import Engine, LayerHook, ModelDescriptor, SamplingParams
    from .errors import MillmError
    from .plugin_host import PluginHost
    from .settings import Settings

Endpoint = Literal["chat.completions", "completions", "embeddings", "tokenize", "detokenize"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass
class SequenceOutput:
    """One generated sequence (a choice)."""

    index: int
    prompt_index: int
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    #: Fields a plugin adds to this choice's message (e.g. ``tool_calls``); a value
    #: of ``None`` for ``content`` replaces the text.
    message_extras: dict[str, Any] = field(default_factory=dict)
    #: Each generated token's logprobs (``serving.logprobs.TokenEntry``); None when none were asked.
    logprobs: list[Any] | None = None
    #: Prompt tokens the engine found already computed (its prompt cache); None: it does not say.
    cached_tokens: int | None = None
    #: The stop sequence (``stop``) that ended the text; None when none did.
    stop_sequence: str | None = None
    #: The reply's thinking block, split from ``text`` (``millm_host.reasoning``); None: it had none, or the
    #: model does not think.
    reasoning: str | None = None
    #: Generated tokens up to the one that ended the block (all of them while it is open); 0 without one.
    reasoning_tokens: int = 0
    #: ``"steered"`` or ``"unsteered"`` when the request asked for both replies (``with_unsteered``); else None.
    variant: str | None = None


@dataclass
class RequestContext:
    """Everything about one request, from parsing to the response.

    Set by the host: ``host`` (the ``PluginHost`` view of the host serving the request: through it every
    hook reaches the plugin's own per-host object, ``ctx.host.state[<plugin>]``),
    ``endpoint``, ``body`` (the parsed JSON, as sent), ``params``
    (the validated protocol model), ``headers`` (lower-cased request headers),
    ``model`` (the descriptor of the requested model, known before any load),
    ``engine_name``, ``streaming``, ``scoring`` (a scoring request: feature plugins
    that steer or monitor stand aside), then after load ``engine``, ``prompts``
    (token ids per prompt or conversation) and after generation ``outputs``.

    ``state`` is per-plugin scratch space: each plugin keeps its own key
    (``ctx.state["steering"]``) and never reads another's. Facts one plugin needs
    about another's work belong on the context as named attributes, set by the host.
    """

    endpoint: Endpoint
    body: dict[str, Any]
    params: Any
    headers: dict[str, str]
    model: ModelDescriptor
    engine_name: str
    settings: Settings
    #: The host serving the request (None only in tests that build a context by hand).
    host: PluginHost | None = None
    #: What the request's engine declares it can do (``EngineSpec.capabilities``).
    engine_capabilities: frozenset[str] = frozenset()
    streaming: bool = False
    scoring: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    engine: Engine | None = None
    prompts: list[list[int]] = field(default_factory=list)
    #: For chat: the messages each prompt was rendered from (extra_messages add rows), as
    #: the chat template sees them (role and text content; plugins add what they render).
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)
    #: For chat: each conversation's messages in full, as sent (``tool_calls``,
    #: ``tool_call_id``, ``name`` included), parallel to ``conversations``; read these
    #: rather than ``body``.
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    #: The registry entry of ``model``, resolved once by the host (host use).
    entry: Any = None
    #: The LoRA adapter (``LoraAdapter``) the request's ``model`` names on top of ``model``; None: the base model.
    adapter: Any = None
    #: What the endpoint's serving made of the request beyond ``params`` (host use: scoring's
    #: parameters, the embeddings inputs).
    plan: Any = None
    #: Tools passed to the chat template (set by a plugin that honours ``tools``).
    chat_tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    #: For chat with a model that thinks: its markers (``reasoning.Markers``) and, per prompt, whether the
    #: prompt opened the block (set by the host when it tokenizes); None: replies are not split.
    reasoning: Any = None
    #: ``include_reasoning`` (default true): the reply carries the block; false drops it (still split off).
    include_reasoning: bool = True
    sampling: SamplingParams | None = None
    #: Every plugin's layer hooks for this generation, as ``before_forward`` returned them (set by
    #: the host before the first pass): a monitor reads from them whether anything writes upstream.
    layer_hooks: list[LayerHook] = field(default_factory=list)
    #: Number of choices per prompt (``n``).
    n: int = 1
    #: ``with_unsteered``: every choice is generated twice, as steered (``outputs`` 0..k-1, k = prompts × n)
    #: and unsteered (k..2k-1), as rows of one batch; the unsteered rows carry no steering write
    #: (``LayerHook.variant``).
    with_unsteered: bool = False
    outputs: list[SequenceOutput] = field(default_factory=list)
    #: True once generation ended (headers rendered after this are post-generation).
    finished: bool = False
    #: Why generation ended early: ``client_disconnected``, ``cancelled`` (by the host:
    #: shutdown, or waiting behind a stalled generation), ``generation_thread_hung``,
    #: ``generation_error``; None when it completed.
    interrupted: str | None = None
    error: MillmError | None = None
    #: Set when the client went away or the request was cancelled (a ``Cancellation``: it also
    #: wakes a coroutine waiting for the engine at once).
    cancel_event: threading.Event = field(default_factory=Cancellation)
    state: dict[str, Any] = field(default_factory=dict)
    #: Field locations the request sent that nothing used (``X-miLLM-Ignored-Fields``).
    unused_fields: list[str] = field(default_factory=list)
    #: Plugins whose ``render_headers`` or ``response_extras`` raised (``X-miLLM-Plugin-Errors``).
    plugin_errors: list[str] = field(default_factory=list)
    #: When the request arrived, waited, started and made each token (the engine thread marks it).
    timing: Timing = field(default_factory=Timing)
    #: The request's ``Observation`` (metrics, trace, log context) when one is kept (host use).
    observation: Any = None

    @property
    def served_model(self) -> str:
        """What the response's ``model`` says: the model's id, ``"<id>:<adapter>"`` with a LoRA adapter (as vLLM)."""
        return self.model.id if self.adapter is None else f"{self.model.id}:{self.adapter.name}"

    @property
    def choices_per_variant(self) -> int:
        """Choices of one reply variant: prompts × n (all the choices without ``with_unsteered``)."""
        return len(self.prompts) * self.n

    def variant_of(self, index: int) -> str | None:
        """``"steered"`` or ``"unsteered"`` for choice ``index`` with ``with_unsteered``; None without it."""
        if not self.with_unsteered:
            return None
        return "steered" if index < self.choices_per_variant else "unsteered"

    @property
    def is_chat(self) -> bool:
        return self.endpoint == "chat.completions"


class RequestView:
    """A request as the hooks that run before generation see it (``validate_request``,
    ``before_tokenize``, ``after_tokenize``, ``before_forward``, ``before_scoring``).

    Every field of the ``RequestContext`` reads through; none can be set, because what
    the client asked for and what the host derived from it is settled by then. A plugin
    keeps what it works out in ``state`` (under its own key), and says what it gives the
    request through its hook's return value. One field is the plugins' to set, before
    the render: ``chat_tools`` (the tools the chat template shows). Containers are
    shared, not copied: ``state`` is the plugin's; ``conversations`` may be adjusted
    in ``before_tokenize`` (what is rendered); everything else is read only.
    """

    __slots__ = ("_ctx",)

    #: The fields a hook before generation may set.
    WRITABLE = frozenset({"chat_tools"})

    def __init__(self, ctx: RequestContext) -> None:
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.WRITABLE:
            raise AttributeError(
                f"{name!r} of a request cannot be set before generation (it is read only); "
                "keep a plugin's own values in ctx.state[<plugin name>]"
            )
        setattr(self._ctx, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{name!r} of a request cannot be deleted")

    def __repr__(self) -> str:
        return f"RequestView({self._ctx.request_id})"

"""The engine interface: what the host asks of a loaded model.

An engine plugin registers an ``EngineSpec`` (by ``"module:Class"`` strings, so
discovering it never imports torch or llama.cpp). The host's model registry asks
the spec to *describe* model files (cheap, no weights read) and to *load* one,
which returns an ``Engine``: a resident model. All ``Engine`` methods but
``status`` run on the engine thread (see ``millm_host.scheduler``); none is
called from the event loop.
"""

from __future__ import annotations

import abc
import contextvars
import hashlib
import importlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .errors import FieldNotHonoured, InvalidParameter, MillmError
from .scoring.engine import NextTokenScores, PromptTokenScores, ScoringParams, TokenLogprob
from .settings import Setting

HookPointName = Literal["resid_pre", "resid_post"]

# Capabilities an engine declares on its EngineSpec: what its models can do. The host
# and plugins ask for a capability, never for an engine by name.
#: ``LayerHook``s at residual points (``hook_points``; generate, forward, score_next_token).
LAYER_HOOKS = "layer_hooks"
#: ``LogitsProcessorFactory`` processors applied while generating.
LOGITS_PROCESSORS = "logits_processors"
#: ``score_next_token``: next-token log-probabilities (scoring mode); ``score_prompt``: a prompt's own.
SCORING = "scoring"
#: ``embed``: pooled vectors for ``/v1/embeddings``.
EMBEDDINGS = "embeddings"
#: ``generate`` honours ``SamplingParams.logprobs`` (yields ``GeneratedToken``) and ``logit_bias``.
LOGPROBS = "logprobs"
#: ``generate`` applies additive ``LayerHook``s (their ``vector``) at ``steering_points`` without
#: calling back (llama.cpp's control vectors); an engine with ``LAYER_HOOKS`` runs them as callbacks.
STEERING_VECTORS = "steering_vectors"
#: ``load_adapter``/``unload_adapter``: PEFT LoRA adapters served on top of the model, one per request
#: (``served_adapter``), each row of a batch its own.
LORA_ADAPTERS = "lora_adapters"
CAPABILITIES = frozenset(
    {LAYER_HOOKS, LOGITS_PROCESSORS, SCORING, EMBEDDINGS, LOGPROBS, STEERING_VECTORS, LORA_ADAPTERS}
)

# Orders for LayerHook.order. A read that must see the pre-steering residual runs
# before a write on the same point; a post-steering read runs after it.
ORDER_READ_PRE_STEERING = 0
ORDER_WRITE_STEERING = 100
ORDER_READ_POST_STEERING = 200
#: ``LayerHook.prompt_key`` of a hook that only reads: a cached prompt serves it (its reads replayed).
READS_PROMPT = ""
#: ``LayerHook.variant``: the rows of the reply as steered (every request has them), and the rows of the
#: same request's unsteered reply (only with ``with_unsteered``).
STEERED = "steered"
UNSTEERED = "unsteered"


@dataclass(frozen=True)
class HookPoint:
    """A hookable residual point: ``resid_pre`` (input) or ``resid_post`` (output) of a decoder layer."""

    layer: int
    point: HookPointName


@dataclass
class LayerHook:
    """A per-request callback the engine calls at one residual point on every forward pass.

    ``callback(hidden, start)`` receives the residual stream as the engine's native
    tensor, shaped ``[batch, seq, d_model]``, and ``start``, the absolute position of
    ``hidden[:, 0]`` within the sequence (0 for the prompt pass, then one per
    generated token). It returns a replacement tensor (a write) or ``None`` (a read).
    Callbacks at one point run in ascending ``order``; ties keep registration order.
    An engine that batches generations (``concurrent_generation``) calls each request's
    callbacks on that request's own row of the batch (batch 1, its own ``start``), so a
    callback only ever sees, and only ever changes, its own sequence; a callback that
    raises fails its own request only.

    A hook can instead take the whole batch at once: ``batched(hidden, rows)``, one
    function shared by every request's hook (``state`` holds what is the request's
    own). At each point and ``order``, the engine calls each distinct ``batched``
    function once per pass, with ``hidden`` the whole batch ``[batch, seq, d_model]``
    and ``rows`` the ``HookRow``s of the requests whose hooks carry it (a request
    appears once per such hook, in batch order; rows of requests without one are not
    listed). It reads only its rows (``hidden[row.index, row.skip:]``) and returns
    ``None`` or a tensor of the batch's shape in which only its rows differ. The serial
    path calls it too, as a batch of one (``HookRow(0, start, 0, hook)``), so a request
    gets the same values alone or batched. If it raises, every request it was called for
    fails. At one point and ``order``, batched calls run before per-row callbacks.
    ``callback`` stays required: an engine that does not batch hooks may call it instead.

    A write that only adds one vector at every position says so with ``vector``: it
    returns that vector now (1-D float, ``d_model`` values; None: adds nothing). An
    engine with ``STEERING_VECTORS`` and no callbacks applies it itself, read once when
    generation starts, and refuses every hook without one.

    ``prompt_key`` says what the hook does to prompt positions, for an engine that reuses
    prompts computed earlier (prefix caching): ``READS_PROMPT`` (``""``) for a read, which
    changes nothing (its reads of reused positions are replayed from what an earlier
    request's read saw there); a non-empty string naming what a write adds (e.g. a digest
    of its vector), so only prompts computed under the same writes are reused; ``None``
    (the default) when the hook must itself see, or change, every prompt position: its
    request reuses nothing and stores nothing. A callable is asked when the prompt is
    looked up and again when it is stored (a live write whose value moved stores nothing).

    ``variant`` says which rows of a request that asks for both replies (``with_unsteered``)
    the hook serves: None (the default) both; ``STEERED`` only the steered reply's rows (every
    steering write says so, and a read that describes the steered reply); ``UNSTEERED`` only the
    unsteered reply's rows (a read of that reply). A request without ``with_unsteered`` has
    steered rows only (``hooks_for``).
    """

    layer: int
    point: HookPointName
    callback: Callable[[Any, int], Any | None]
    order: int = ORDER_READ_PRE_STEERING
    owner: str = ""
    vector: Callable[[], Any | None] | None = None
    batched: Callable[[Any, Sequence[HookRow]], Any | None] | None = None
    state: Any = None
    prompt_key: str | Callable[[], str | None] | None = None
    variant: str | None = None


def hooks_for(hooks: Sequence[LayerHook], variant: str) -> list[LayerHook]:
    """The hooks the rows of one reply (``STEERED`` or ``UNSTEERED``) carry (``LayerHook.variant``)."""
    return [hook for hook in hooks if hook.variant is None or hook.variant == variant]


@dataclass(frozen=True)
class HookRow:
    """One request's row in a pass, as a ``LayerHook.batched`` function sees it.

    ``hidden[index, skip:]`` is that request's part of the pass: ``skip`` columns of
    left padding come first (padding its batch needs in a prefill; 0 in a decode step
    and alone), and its first real column sits at absolute position ``start``. ``hook``
    is the request's own hook there (``hook.state``: what its plugin attached).
    ``continuous`` is True when the pass is a continuous batch's (other requests' rows may
    share it: ``hidden.shape[0]`` sequences), False on the serial path (a batch of one).
    ``replayed`` is True when no forward ran: ``hidden`` is what this hook's kind of read saw
    over a prompt prefix an earlier request computed, replayed from the prefix cache.
    """

    index: int
    start: int
    skip: int
    hook: LayerHook
    continuous: bool = False
    replayed: bool = False


#: The cancellation of the request whose ``Engine.generate`` runs in this context (set by the host).
GENERATION_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "millm_generation_cancel", default=None
)


def generation_cancel() -> threading.Event | None:
    """Set once the request of the ``generate`` call made in this context no longer wants tokens.

    The caller stops reading at its next token anyway; an engine that queues work (a batch
    that rows wait to join, a long prefill) may look at it to drop that work sooner.
    None outside a request's generation.
    """
    return GENERATION_CANCEL.get()


@dataclass(frozen=True)
class LoraAdapter:
    """A PEFT LoRA adapter (a directory with ``adapter_config.json`` and its weights) served on ``base``.

    A request names it as ``"<base>:<name>"`` (vLLM's way); the host finds it (``millm_host.adapters``)
    and the engine applies it to that request's passes only.
    """

    name: str
    path: str
    base: str


#: The LoRA adapter of the request whose engine work runs in this context (set by the host; None: the base model).
SERVED_ADAPTER: contextvars.ContextVar[LoraAdapter | None] = contextvars.ContextVar(
    "millm_served_adapter", default=None
)


def served_adapter() -> LoraAdapter | None:
    """The adapter the engine work called in this context serves (``generate``, scoring, ``embed``,
    ``forward``); None for the base model. An engine with ``LORA_ADAPTERS`` loads it on first use."""
    return SERVED_ADAPTER.get()


@dataclass
class LogitsProcessorFactory:
    """Supplies a next-token logits processor for each generated sequence.

    ``make(sequence_index)`` returns ``process(generated_ids, logits) -> logits``,
    called once per generated token with the ids generated so far in that sequence
    and the engine-native 1-D float logits for the next token. ``n > 1`` and
    multi-prompt requests get one processor per sequence.
    """

    make: Callable[[int], Callable[[Sequence[int], Any], Any]]
    owner: str = ""


@dataclass
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy.

    ``logit_bias`` (token id -> bias) is added to the logits before anything else
    sees them. ``logprobs`` (an engine with the ``LOGPROBS`` capability): when not
    None, ``generate`` yields ``GeneratedToken``s carrying each token's
    log-probability and the ``logprobs`` most probable alternatives.
    ``min_tokens`` (vLLM's name): the model's end-of-sequence ids
    (``ModelInfo.eos_token_ids``) are masked out (-inf) of the first ``min_tokens``
    draws, so none ends the text sooner; the host sets it to ``max_tokens`` for
    ``ignore_eos``.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    min_tokens: int = 0


class GeneratedToken(int):
    """A generated token id that also carries its log-probability (``SamplingParams.logprobs``).

    An ``int``, so code that wants only the id uses it as one. ``logprob`` and
    ``top`` (the most probable alternatives, best first, non-finite ones left out)
    are under the distribution the token was drawn from: the logits after
    ``logit_bias``, the penalties, the logits processors and the temperature
    (unscaled when greedy), before the nucleus (``top_p``) cut.
    """

    logprob: float
    top: tuple[TokenLogprob, ...]

    def __new__(cls, token_id: int, logprob: float, top: Sequence[TokenLogprob] = ()) -> GeneratedToken:
        token = super().__new__(cls, token_id)
        token.logprob = logprob
        token.top = tuple(top)
        return token

    def __reduce__(self) -> Any:
        return (GeneratedToken, (int(self), self.logprob, self.top))


class TokenIterator(Protocol):
    """What ``Engine.generate`` returns: token ids one at a time, and ``close`` to stop early.

    A generator is one; an engine whose tokens come from elsewhere (another process,
    a batch) may return its own iterator class, as long as it has ``close``. Such a
    class may also have ``cached_tokens`` (an int once the first token came, else None):
    how many prompt tokens it found already computed, which the host reports as
    ``usage.prompt_tokens_details.cached_tokens``.
    """

    def __iter__(self) -> Iterator[int]: ...

    def __next__(self) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ModelDescriptor:
    """A model on disk, as an engine spec describes it without loading it."""

    id: str
    path: str
    format: str  # "hf" (checkpoint directory) or "gguf" (one file)
    engine: str
    hf_id: str | None = None
    revision: str | None = None
    quantization: str | None = None
    repo: str | None = None  # the repository part of a "repo:QUANT" GGUF name
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ModelInfo:
    """What a loaded model is. Unknown values are ``None`` and rendered ``unrecorded``."""

    id: str
    engine: str
    hf_id: str | None
    revision: str | None
    dtype: str | None
    quantization: str | None
    context_window: int | None
    vocab_size: int
    d_model: int | None
    n_layers: int | None
    chat_template: str | None
    bos_token: str | None
    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    device: str = "cpu"
    load_id: str = ""

    @property
    def chat_template_sha256(self) -> str | None:
        """Hex SHA-256 of the chat template string (UTF-8), as probe identities use it."""
        if self.chat_template is None:
            return None
        return hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()

    @property
    def system_fingerprint(self) -> str:
        """``millm:<model>@<revision>:<dtype>/<quantization>:<engine>``."""

        def part(value: str | None) -> str:
            return value if value else "unrecorded"

        return f"millm:{self.id}@{part(self.revision)}:{part(self.dtype)}/{part(self.quantization)}:{self.engine}"


class NoChatTemplate(MillmError):
    """The model has no chat template (scoring refuses; generation falls back)."""

    status, code = 400, "no_chat_template"


def fallback_chat_render(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """The generic render used for generation on a model with no chat template."""
    text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
    return text + ("assistant:" if add_generation_prompt else "")


class Engine(abc.ABC):
    """A resident model. Every method but ``status`` runs on the engine thread (text methods: see ``concurrent_text``)."""

    #: The registered engine name (``"transformers"``, ``"gguf"``).
    name: str = ""
    info: ModelInfo
    #: Residual points a LayerHook may name. Empty for an engine with no module tree.
    hook_points: Sequence[HookPoint] = ()
    #: True when the text methods (``tokenize``, ``decode``, ``token_bytes``, ``render_chat``
    #: and the chat helpers built on them) may run on any thread, also while ``generate`` runs
    #: on the engine thread (e.g. each thread has its own tokenizer). The host then renders and
    #: tokenizes requests on its text thread, so a refusal that needs only the tokenizer never
    #: waits behind a generation. False: every method runs on the engine thread.
    concurrent_text: bool = False
    #: True when ``generate`` may be called from several threads at once (continuous batching:
    #: the engine shares decode steps between them, and keeps its other model work apart
    #: itself). The host then runs each generation request on a thread of its own instead
    #: of the engine thread; scoring, embeddings and loads stay on the engine thread.
    concurrent_generation: bool = False
    #: True when ``generate``'s decode steps are Python on a thread of this process, sharing its
    #: interpreter lock with the request path (not a child process's, as llama.cpp's are). While
    #: one runs, the host then paces new requests' intake (``MILLM_INTAKE_SHARE``, ``intake.py``).
    steps_in_process: bool = False

    @property
    def steering_points(self) -> Sequence[HookPoint]:
        """Residual points an additive write (``LayerHook.vector``) may name: every hook point,
        unless the engine steers without callbacks (``STEERING_VECTORS``) at points of its own."""
        return self.hook_points

    # --- text -----------------------------------------------------------------------
    @abc.abstractmethod
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token text (``<|im_start|>``) maps to its id."""

    def min_tokens(self, texts: Sequence[str]) -> int:
        """A lower bound on the tokens of any text that holds all of ``texts``, found cheaply (0: none known).

        The host refuses a prompt that cannot fit the window from it, without rendering or
        tokenizing it: 4 MiB took the tokenizer seconds, with the GIL held for much of it.
        """
        return 0

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens left out."""

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes a token stands for (partial characters included)."""
        return self.decode([token_id]).encode("utf-8")

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (``POST /detokenize``): tokenizing it gives them back."""
        return b"".join(self.token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template rendered to text. Raises ``NoChatTemplate`` when there is none."""
        raise NoChatTemplate(f"model {self.info.id!r} has no chat template")

    def chat_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        fallback: bool = True,
    ) -> list[int]:
        """Token ids of a chat, the one way every chat path tokenizes.

        A trailing assistant message is continued: everything before it is rendered
        with a generation prompt and its content appended raw. If the render begins
        with the tokenizer's BOS no special tokens are added (one BOS, never two);
        otherwise the tokenizer adds what it normally adds. ``fallback`` allows the
        generic render on a model with no template (generation does, scoring does not).
        """
        return self.tokenize_chat_text(
            self.chat_text(messages, tools=tools, template_kwargs=template_kwargs, fallback=fallback)
        )

    def tokenize_chat_text(self, text: str) -> list[int]:
        """Ids of a rendered chat: no special tokens added when it already begins with BOS."""
        bos = self.info.bos_token
        return self.tokenize(text, add_special_tokens=not (bos and text.startswith(bos)))

    def chat_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        fallback: bool = True,
    ) -> str:
        """The text ``chat_ids`` tokenizes (see there)."""
        continuing = bool(messages) and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")
        head = list(messages[:-1]) if continuing else list(messages)
        if not head:  # a template given no messages raises; this is the client's to fix
            raise InvalidParameter(
                "messages holds nothing before the assistant message it continues; "
                "send a user (or system) message first"
                if messages
                else "messages is empty",
                param="messages",
            )
        try:
            text = self.render_chat(head, add_generation_prompt=True, tools=tools, template_kwargs=template_kwargs)
        except NoChatTemplate:
            if not fallback:
                raise
            text = fallback_chat_render(head, add_generation_prompt=True)
        if continuing:
            text += messages[-1].get("content") or ""
        return text

    # --- compute --------------------------------------------------------------------
    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> TokenIterator:
        """Yield generated token ids one at a time, EOS included, until closed.

        The caller decides when to stop (EOS, ``max_tokens``, a stop string) and
        closes the generator; the engine stops by itself only at its context window.
        ``hooks`` are installed for this call and removed when it ends.
        """

    def forward(self, ids: Sequence[int], *, hooks: Sequence[LayerHook] = ()) -> None:
        """One forward pass over ``ids`` with ``hooks`` installed, nothing generated."""
        raise FieldNotHonoured(f"the {self.name} engine cannot run hooked forward passes", param=None)

    def replay_in_batch(self, rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[LayerHook]]]) -> None:
        """Run ``rows`` (prompt ids, given ids, hooks) together through the batch that serves generations.

        Each row's prompt is prefilled beside the others, as requests that arrive together are;
        then each given id is fed by one decode step in place of a sampled token (EOS among
        them does not end the row), and one step more, so the hooks read every given id as a
        reply's. Nothing is returned: the hooks are what reads. For checking that hooks read
        in a batch what they read alone (probe parity). Called off the event loop, never from
        the engine's model thread; an engine that serves each generation alone (not
        ``concurrent_generation``) raises ``FieldNotHonoured``.
        """
        raise FieldNotHonoured(f"the {self.name} engine serves each generation alone", param=None)

    def load_adapter(self, adapter: LoraAdapter) -> None:
        """Ready ``adapter`` to serve (``LORA_ADAPTERS``): its weights read and put beside the model's, on
        the engine's model thread. Raises ``InvalidParameter`` (``param="path"``) for files it cannot use."""
        raise FieldNotHonoured(f"the {self.name} engine serves no LoRA adapters", param="model")

    def unload_adapter(self, name: str) -> None:  # noqa: B027 (an engine without adapters holds none)
        """Free adapter ``name``'s weights once no generation still uses it (nothing when it is not loaded)."""

    def score_next_token(
        self, prompts: Sequence[Sequence[int]], params: ScoringParams, *, hooks: Sequence[LayerHook] = ()
    ) -> list[NextTokenScores]:
        """Next-token log-probabilities of each prompt: one forward pass each, nothing generated.

        ``hooks`` are read hooks only (``before_scoring``: scoring is never steered);
        they run on the native-precision forward, never on a float32 copy. Raises
        ``NonFiniteLogits`` (naming the prompt's index) and, for
        ``params.precision == "float32"``, ``ScoringPrecisionUnavailable``.
        """
        raise FieldNotHonoured(f"the {self.name} engine cannot score", param="logprobs")

    def score_prompt(self, prompts: Sequence[Sequence[int]], top: int) -> list[list[PromptTokenScores]]:
        """Each prompt's tokens scored, from its second token on (``echo`` with ``logprobs``,
        ``prompt_logprobs``): one forward pass per prompt, nothing generated, no hook.

        The pass is scoring's (``score_next_token``, native precision), so token ``i``'s
        log-probability is what scoring the first ``i`` tokens gives for it. ``top``: the
        alternatives per position (0-20). Raises ``NonFiniteLogits`` naming the prompt's index.
        """
        raise FieldNotHonoured(f"the {self.name} engine cannot score a prompt's tokens", param="echo")

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        """One input's vector: the last hidden layer pooled (``mean``, ``last`` or ``cls``).

        Runs with no layer hook installed (embeddings are never steered); the host
        normalises and checks the values.
        """
        raise FieldNotHonoured(f"the {self.name} engine cannot embed", param="model")

    @property
    def embedding_window(self) -> int | None:
        """The most tokens one ``embed`` input may have (None: no stated limit, unchecked).

        Inputs are never truncated: the host refuses any input past this. It is the
        context window, unless the engine embeds less at once (a GGUF model: the
        smaller of its context window and its batch size).
        """
        return self.info.context_window

    def close(self) -> None:  # noqa: B027 (optional: an engine may hold nothing to release)
        """Release the model's memory. Called once, on unload."""

    def inference(self) -> Mapping[str, Any]:
        """What ``/api/health/inference`` reports: the generation backend and its batch.

        Keys: ``backend`` (``serial`` or ``continuous``), ``running`` and ``waiting``
        (generations in and waiting for the batch), ``serial_reasons`` (why
        generations ran alone, counted). Called from any thread; only reads.
        """
        return {"backend": "serial"}

    def status(self) -> Mapping[str, Any]:
        """What the engine reports in ``/api/health`` under ``engine_status`` (empty: nothing).

        The one method called from any thread (the event loop included): it only
        reads, never blocks. An engine running its model in a child process
        reports that process here (state, restarts, last signal).
        """
        return {}


@dataclass(frozen=True)
class EngineSpec:
    """An engine as a plugin registers it. No heavy import happens until ``load``.

    ``factory`` is ``"module:Class"``: a class with ``load(descriptor, settings,
    progress) -> Engine`` (a classmethod or staticmethod). ``describe`` is
    ``"module:function"``: ``describe(path) -> ModelDescriptor | None`` for a
    checkpoint directory or .gguf file this engine can serve (None if it cannot).
    ``formats`` are the model formats it serves, ``"hf"`` and/or ``"gguf"``.

    What the engine can do is declared here, so that the host names no engine:
    ``capabilities`` (``LAYER_HOOKS``, ``LOGITS_PROCESSORS``, ``SCORING``,
    ``EMBEDDINGS``; plugins claim request fields by capability), ``memory_estimate``
    (``"module:function"``: ``estimate(descriptor, disk_bytes) -> bytes`` a load
    needs; None: its size on disk), ``settings`` (the engine's own settings, declared
    by the host when the engine registers and listed by ``millm settings``) and
    ``preference`` (among installed engines serving one format, the highest serves
    it unless ``MILLM_ENGINE`` names another).
    """

    name: str
    factory: str
    describe: str
    formats: frozenset[str]
    capabilities: frozenset[str] = frozenset()
    memory_estimate: str | None = None
    settings: tuple[Setting, ...] = ()
    preference: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            raise ValueError(f"engine {self.name!r} declares unknown capabilities {sorted(unknown)}")

    def describe_path(self, path: str) -> ModelDescriptor | None:
        return resolve(self.describe)(path)

    def estimate_memory(self, descriptor: ModelDescriptor, disk_bytes: int) -> int:
        """Bytes loading ``descriptor`` takes (its size on disk unless the engine says otherwise)."""
        if self.memory_estimate is None:
            return disk_bytes
        return int(resolve(self.memory_estimate)(descriptor, disk_bytes))

    def load(self, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> Engine:
        return resolve(self.factory).load(descriptor, settings, progress)


def resolve(ref: str | Any) -> Any:
    """Import ``"module:attr"``; anything else is returned as is."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj

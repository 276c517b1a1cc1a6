"""A request's walk up to the engine: validate, resolve, load, tokenize, check.

No HTTP here: resources hand in the parsed body and headers, and get back a
``RequestContext`` that holds a model lease and a queue ticket, or a typed
``MillmError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import hookcalls
from ..admission import Admission, admit
from ..context import RequestContext
from ..engine import SamplingParams
from ..engine_scoring import InvalidScoringRequest
from ..errors import ContextLengthExceeded, InternalError, InvalidParameter, MillmError
from ..fields import check_fields, strict_mode
from ..protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, message_text, validate

if TYPE_CHECKING:
    from ..app import Host

PROTOCOLS = {
    "chat.completions": ChatCompletionRequest,
    "completions": CompletionRequest,
}


def is_scoring_request(endpoint: str, body: dict[str, Any]) -> bool:
    """Scoring mode: next-token log-probabilities instead of generation.

    ``logprobs`` (other than false), ``allowed_token_ids`` or, on chat,
    ``top_logprobs``. A malformed value (``logprobs: 5`` on chat) is a scoring
    request too, so scoring validation refuses it rather than generation ignoring it.
    """
    if endpoint not in ("completions", "chat.completions"):
        return False
    if body.get("allowed_token_ids") is not None:
        return True
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs is not False:
        return True
    return endpoint == "chat.completions" and body.get("top_logprobs") is not None


class Pipeline:
    """Turns a request body into a context ready for the engine."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def build_context(
        self, endpoint: str, body: dict[str, Any], headers: dict[str, str], protocol: type | None = None
    ) -> RequestContext:
        """Validate the protocol and the fields; no plugin or model work yet."""
        host = self.host
        params = validate(protocol or PROTOCOLS[endpoint], body)
        strict = strict_mode(headers)
        entry = host.registry.resolve(params.model)
        ctx = RequestContext(
            entry=entry,
            endpoint=endpoint,  # type: ignore[arg-type]
            body=body,
            params=params,
            headers=headers,
            model=entry.descriptor,
            engine_name=entry.spec.name,
            settings=host.settings,
            host=host,
            engine_capabilities=entry.spec.capabilities,
            streaming=bool(getattr(params, "stream", False)),
            scoring=is_scoring_request(endpoint, body),
        )
        ctx.unused_fields = check_fields(host.fields, endpoint, entry.spec.name, body, strict)
        if isinstance(params, ChatCompletionRequest):
            ctx.conversations = [_conversation(params.messages, "messages")]
            ctx.messages = [_full_messages(params.messages)]
            extra = body.get("extra_messages")
            if extra is not None and not isinstance(extra, list):
                raise InvalidParameter("extra_messages must be a list of conversations", param="extra_messages")
            for i, rows in enumerate(extra or ()):
                messages = _extra_messages(rows, i)
                ctx.conversations.append(_conversation(messages, f"extra_messages[{i}]"))
                ctx.messages.append(_full_messages(messages))
            ctx.chat_template_kwargs = body.get("chat_template_kwargs")
            if ctx.chat_template_kwargs is not None and not isinstance(ctx.chat_template_kwargs, dict):
                raise InvalidParameter("chat_template_kwargs must be an object", param="chat_template_kwargs")
        if hasattr(params, "n"):
            ctx.n = params.n or 1
            if ctx.n > host.settings["MILLM_MAX_N"]:
                raise InvalidParameter(f"n is at most {host.settings['MILLM_MAX_N']}", param="n")
        if isinstance(params, CompletionRequest) and len(params.prompts) > host.settings["MILLM_MAX_PROMPTS"]:
            raise InvalidParameter(
                f"at most {host.settings['MILLM_MAX_PROMPTS']} prompts per request", param="prompt"
            )
        return ctx

    async def prepare(self, ctx: RequestContext, tokenize: Callable[[RequestContext], None] | None = None) -> Admission:
        """Plugins validate, the model is made resident, prompts tokenized and checked.

        Returns the request's admission (queue place and model lease); the caller
        releases it when the request ends.
        """
        host = self.host
        await asyncio.to_thread(hookcalls.request, host.pm, "validate_request", ctx=ctx)
        admission = await admit(host, ctx.entry)
        try:
            ctx.engine = admission.engine
            # On the text thread when the engine allows it: a refusal that needs only the tokenizer
            # (context_length_exceeded) never waits behind a running generation.
            run = host.scheduler.run_text if ctx.engine.concurrent_text else admission.run
            await run(self._render_and_tokenize, tokenize or self.tokenize, ctx, cancel=ctx.cancel_event)
            if ctx.endpoint in PROTOCOLS and not ctx.scoring:
                self.check_context(ctx)
            await asyncio.to_thread(hookcalls.request, host.pm, "after_tokenize", ctx=ctx)
        except BaseException:
            admission.release()
            raise
        return admission

    def _render_and_tokenize(self, tokenize: Callable[[RequestContext], None], ctx: RequestContext) -> None:
        """On the text (or engine) thread: plugins adjust the render for the resident model, then tokenize."""
        hookcalls.request(self.host.pm, "before_tokenize", ctx=ctx)
        tokenize(ctx)

    def tokenize(self, ctx: RequestContext) -> None:
        """Token ids for every prompt (text thread, or engine thread when the engine's text methods must run there)."""
        engine = ctx.engine
        assert engine is not None
        if ctx.is_chat:
            ctx.prompts = []
            for i, conv in enumerate(ctx.conversations):
                try:
                    ctx.prompts.append(engine.chat_ids(conv, tools=ctx.chat_tools, template_kwargs=ctx.chat_template_kwargs,
                                                       fallback=not ctx.scoring))
                except InvalidParameter as exc:  # the engine names "messages"; the others are extra_messages
                    if i == 0 or exc.param != "messages":
                        raise
                    raise InvalidParameter(exc.message, param=f"extra_messages[{i - 1}]") from None
        elif ctx.endpoint == "completions":
            add_special = ctx.params.add_special_tokens is not False
            ctx.prompts = [
                list(p) if isinstance(p, list) else engine.tokenize(p, add_special_tokens=add_special)
                for p in ctx.params.prompts
            ]
            vocab = engine.info.vocab_size
            refusal = InvalidScoringRequest if ctx.scoring else InvalidParameter
            for ids in ctx.prompts:
                bad = [t for t in ids if t >= vocab]
                if bad:
                    raise refusal(f"prompt: token id {bad[0]} is outside the vocabulary (size {vocab})", param="prompt")

    def check_context(self, ctx: RequestContext) -> None:
        """Refuse prompt + max_tokens over the window; settle the sampling parameters."""
        engine = ctx.engine
        assert engine is not None
        params = ctx.params
        window = engine.info.context_window
        requested = params.requested_max_tokens
        longest = max((len(p) for p in ctx.prompts), default=0)
        if longest == 0:
            raise InvalidParameter("the prompt is empty", param="prompt" if ctx.endpoint == "completions" else "messages")
        empty = next((i for i, p in enumerate(ctx.prompts) if not p), None)
        if empty is not None:  # an engine given no ids fails deep inside; refuse it here
            where = (f"prompt[{empty}]" if ctx.endpoint == "completions"
                     else f"extra_messages[{empty - 1}]" if empty else "messages")
            raise InvalidParameter(f"{where} is empty (it tokenizes to nothing); every prompt needs text", param=where)
        if window is not None:
            asked = f"{longest} in the prompt" + (f", {requested} for the completion" if requested else "")
            total = longest + (requested or 0)
            if longest >= window:
                raise ContextLengthExceeded(
                    f"this model's maximum context length is {window} tokens; you requested {total} tokens ({asked})",
                    param="messages" if ctx.is_chat else "prompt",
                )
            if requested is not None and total > window:
                raise ContextLengthExceeded(
                    f"this model's maximum context length is {window} tokens; you requested {total} tokens ({asked})",
                    param="max_tokens" if params.max_tokens is not None else "max_completion_tokens",
                )
        max_tokens = requested or self.host.settings["MILLM_DEFAULT_MAX_TOKENS"]
        if window is not None and requested is None:
            max_tokens = min(max_tokens, window - longest)
        ctx.sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if params.temperature is None else params.temperature,
            top_p=1.0 if params.top_p is None else params.top_p,
            frequency_penalty=params.frequency_penalty or 0.0,
            presence_penalty=params.presence_penalty or 0.0,
            seed=params.seed,
        )


def _conversation(messages: list[ChatMessage], where: str) -> list[dict[str, Any]]:
    """Messages as the chat template sees them: role and text content."""
    rendered = []
    for i, message in enumerate(messages):
        rendered.append({"role": message.role, "content": message_text(message, i)})
    return rendered


def _full_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as sent, every field kept (``tool_calls``, ``tool_call_id``, ``name``)."""
    return [message.model_dump(exclude_unset=True) for message in messages]


def _extra_messages(rows: Any, index: int) -> list[ChatMessage]:
    if not isinstance(rows, list) or not rows:
        raise InvalidParameter("each extra_messages entry must be a non-empty list of messages", param=f"extra_messages[{index}]")
    try:
        return [ChatMessage.model_validate(m) for m in rows]
    except Exception:
        raise InvalidParameter("extra_messages holds an invalid message", param=f"extra_messages[{index}]") from None


def raise_for(exc: BaseException) -> MillmError:
    """A MillmError for any exception (internal errors are not leaked verbatim)."""
    if isinstance(exc, MillmError):
        return exc
    return InternalError(f"internal error: {type(exc).__name__}")

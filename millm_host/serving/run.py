"""Chat and text completions: ``ServingGeneration``, and running a prepared generation.

``ServingGeneration`` is what ``ServingChat`` and ``ServingCompletion`` share: a
body in scoring mode goes to its ``ServingScoring``; otherwise the context is
checked against the model's window, and the answer is generated whole
(``complete``) or streamed (``stream``).

A ``Flight`` is one generation as the event loop sees it. It holds the request's
admission (queue place and model lease) until the answer is over, and ends the
request early, freeing that admission at once, when:

- the client goes away (``client_disconnected``): the generation is cancelled at
  its next token, or skipped if it has not started;
- the generation makes no progress for ``MILLM_GENERATION_STALL_S``
  (``generation_thread_hung``): ``503 generation_stalled``. If the engine thread
  has not stopped after as long again, the host calls ``after_generate`` itself.
  Requests waiting behind a stalled generation fail the same way (``cancelled``);
- the shutdown grace runs out (``cancelled``): ``503 shutting_down``.

The engine thread is serial, so releasing the admission before a cancelled
generation has stopped is safe: an unload's ``close`` queues behind it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Protocol

from .. import hookcalls
from ..admission import Admission
from ..context import RequestContext
from ..engine import SamplingParams
from ..errors import (
    ClientDisconnected,
    ContextLengthExceeded,
    GenerationStalled,
    InvalidParameter,
    MillmError,
    RequestCancelled,
    raise_for,
)
from ..openapi import Operation
from ..scheduler import TICK
from ..scoring.serving import ServingScoring, is_scoring_request, refuse_scoring_only_fields
from .base import (
    Chunks,
    ClientGone,
    Result,
    Serving,
    ServingHost,
    add_extras,
    choice_of,
    collect_extras,
    collect_headers,
)
from .generation import GenerationJob
from .logprobs import render as render_logprobs, requested as requested_logprobs, token_biases
from .render import chunk, completion_body, delta_choice, usage, wants_usage


class GenerationHost(ServingHost, Protocol):
    """What serving a generation uses of the host: serving's, and the generations under way."""

    flights: set[Flight]

    def keep(self, task: asyncio.Task) -> None: ...


log = logging.getLogger("millm.serving")

DONE = "[DONE]"
FINISHED = "finished"  # the engine thread is done with the request
STOPPED = "stopped"  # the host ended the request early


class ServingGeneration(Serving):
    """What chat and text completions share (see the module docstring)."""

    host: GenerationHost

    def __init__(self, host: GenerationHost) -> None:
        super().__init__(host)
        #: Serves this endpoint's bodies in scoring mode.
        self.scoring = ServingScoring(host, self)

    def scoring_for(self, body: dict[str, Any]) -> ServingScoring | None:
        """The scoring-mode serving when ``body`` asks for scoring, else None (generation)."""
        return self.scoring if is_scoring_request(self.endpoint, body) else None

    async def handle(self, body: dict[str, Any], headers: dict[str, str], *, gone: ClientGone | None = None) -> Result:
        scoring = self.scoring_for(body)
        if scoring is not None:
            return await scoring.handle(body, headers, gone=gone)
        return await super().handle(body, headers, gone=gone)

    def precheck(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        scoring = self.scoring_for(body)
        if scoring is not None:
            return scoring.precheck(body, headers)
        return super().precheck(body, headers)

    def describe(self) -> Operation:
        """Generation, or scoring mode (its own request and response models)."""
        own, scoring = super().describe(), self.scoring.describe()
        assert own.request and own.response and scoring.request and scoring.response
        return replace(own, request=(*own.request, *scoring.request), response=(*own.response, *scoring.response))

    def streams(self, params: Any) -> bool:
        return bool(params.stream)

    def read(self, ctx: RequestContext) -> None:
        ctx.n = ctx.params.n or 1
        ctx.with_unsteered = bool(ctx.params.with_unsteered)
        if ctx.n > self.host.settings["MILLM_MAX_N"]:
            raise InvalidParameter(f"n is at most {self.host.settings['MILLM_MAX_N']}", param="n")
        requested_logprobs(ctx)  # top_logprobs without logprobs is refused before any load

    def validate(self, ctx: RequestContext) -> None:
        refuse_scoring_only_fields(ctx)  # before any plugin's refusal
        super().validate(ctx)

    def check(self, ctx: RequestContext) -> None:
        """Refuse prompt + max_tokens over the window; settle the sampling parameters."""
        engine = ctx.engine
        assert engine is not None
        params = ctx.params
        window = engine.info.context_window
        requested = params.requested_max_tokens
        longest = max((len(p) for p in ctx.prompts), default=0)
        if longest == 0:
            raise InvalidParameter(
                "the prompt is empty", param="prompt" if ctx.endpoint == "completions" else "messages"
            )
        empty = next((i for i, p in enumerate(ctx.prompts) if not p), None)
        if empty is not None:  # an engine given no ids fails deep inside; refuse it here
            where = (
                f"prompt[{empty}]"
                if ctx.endpoint == "completions"
                else f"extra_messages[{empty - 1}]"
                if empty
                else "messages"
            )
            raise InvalidParameter(f"{where} is empty (it tokenizes to nothing); every prompt needs text", param=where)
        if window is not None:
            refuse_past_window(ctx, window, longest)
        max_tokens = requested if requested is not None else self.host.settings["MILLM_DEFAULT_MAX_TOKENS"]
        if window is not None and requested is None:
            max_tokens = min(max_tokens, window - longest)
        # ignore_eos masks EOS from every draw; min_tokens from the first ones (stop sequences: ``generation``)
        min_tokens = max_tokens if params.ignore_eos else min(params.min_tokens or 0, max_tokens)
        ctx.sampling = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            temperature=1.0 if params.temperature is None else params.temperature,
            top_p=1.0 if params.top_p is None else params.top_p,
            frequency_penalty=params.frequency_penalty or 0.0,
            presence_penalty=params.presence_penalty or 0.0,
            seed=params.seed,
            logit_bias=token_biases(ctx, engine.info.vocab_size),
            logprobs=requested_logprobs(ctx),
        )

    def refuse_unfitting_text(self, ctx: RequestContext) -> None:
        engine = ctx.engine
        assert engine is not None
        self.refuse_at_least(ctx, max((engine.min_tokens(texts) for texts in self.prompt_texts(ctx)), default=0))

    def refuse_at_least(self, ctx: RequestContext, least: int) -> None:
        """``context_length_exceeded`` for a prompt of at least ``least`` tokens that cannot fit the window."""
        assert ctx.engine is not None
        window = ctx.engine.info.context_window
        if window is not None and least:
            refuse_past_window(ctx, window, least, at_least=True)

    def prompt_texts(self, ctx: RequestContext) -> list[list[str]]:
        """The texts each prompt holds, before it is rendered and tokenized (text thread)."""
        return []

    async def respond(self, ctx: RequestContext, admission: Admission, watcher: asyncio.Future | None) -> Result:
        """A stream (its headers now, before any token), or the whole answer; a ``Flight`` either way."""
        if ctx.streaming:
            return Result(headers=collect_headers(self.host, ctx), stream=stream(self.host, ctx, admission, watcher))
        body, headers = await complete(self.host, ctx, admission, watcher)
        return Result(headers=headers, body=body)


def refuse_past_window(ctx: RequestContext, window: int, longest: int, *, at_least: bool = False) -> None:
    """``context_length_exceeded`` when the longest prompt (``at_least``: a lower bound on it), with the
    completion asked for, does not fit the window."""
    requested = ctx.params.requested_max_tokens
    least = "at least " if at_least else ""
    asked = f"{least}{longest} in the prompt" + (f", {requested} for the completion" if requested else "")
    total = longest + (requested or 0)
    message = f"this model's maximum context length is {window} tokens; you requested {least}{total} tokens ({asked})"
    if longest >= window:
        raise ContextLengthExceeded(message, param="messages" if ctx.is_chat else "prompt")
    if requested is not None and total > window:
        param = "max_tokens" if ctx.params.max_tokens is not None else "max_completion_tokens"
        raise ContextLengthExceeded(message, param=param)


class Flight:
    """One generation between the event loop and the engine thread (see the module docstring)."""

    def __init__(
        self,
        host: GenerationHost,
        ctx: RequestContext,
        admission: Admission,
        *,
        streaming: bool,
        gone: asyncio.Future | None = None,
    ) -> None:
        self.host, self.ctx, self.admission, self.gone = host, ctx, admission, gone
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        #: Why the host ended the request early (None: it did not, or the client left).
        self.error: MillmError | None = None
        self.ended = False
        self.job = GenerationJob(host, ctx, self._emit if streaming else None)
        ctx.timing.queue()
        # An engine that batches serves many generations at once: each waits on its own thread.
        concurrent = ctx.engine is not None and ctx.engine.concurrent_generation
        self.future = (host.scheduler.submit_beside if concurrent else host.scheduler.submit)(self.job)
        self.future.add_done_callback(lambda _: self._emit(FINISHED))
        host.flights.add(self)
        if gone is not None:
            gone.add_done_callback(self._on_gone)
        if ctx.cancel_event.is_set():  # the client left while the request was prepared
            self.stop(ctx.interrupted or "client_disconnected")

    def _on_gone(self, task: asyncio.Future) -> None:
        if not task.cancelled():  # cancelled: the answer ended first (``end``)
            self.stop("client_disconnected")

    def _emit(self, event: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def end(self) -> None:
        """The answer is over: free the queue place and the model lease."""
        if not self.ended:
            self.ended = True
            self.host.flights.discard(self)
            self.admission.release()
            if self.gone is not None:
                self.gone.cancel()

    def stop(self, reason: str, error: MillmError | None = None) -> None:
        """End the request now; a running generation is cancelled at its next token."""
        if self.ended:
            return
        if not self.future.done():
            self.ctx.interrupted = self.ctx.interrupted or reason
            self.ctx.cancel_event.set()
        self.error = error
        self.end()
        self.events.put_nowait(STOPPED)

    def check(self) -> None:
        """End the request if the shutdown grace ran out or the generation (or one ahead of it) stalled."""
        scheduler = self.host.scheduler
        if self.ended or self.future.done():
            return
        if scheduler.expired():
            # All at once: a batched generation let go by one cancellation must not finish
            # the others before their own next look.
            for flight in list(self.host.flights):
                if not flight.future.done():
                    flight.stop("cancelled", scheduler.why_not_started())
        elif scheduler.stalled():
            if self.future.running():  # this generation is the one that stalled
                self.stop(
                    "generation_thread_hung",
                    GenerationStalled(f"the generation made no progress for {scheduler.stall_s:g} s"),
                )
                self._tell_plugins(after=scheduler.stall_s)
            elif self.future.cancel():  # it waits behind the stalled one: it will never start
                self.stop("cancelled", scheduler.why_not_started())
                self._tell_plugins(after=0)

    def _tell_plugins(self, after: float) -> None:
        """Call ``after_generate`` from a worker thread if the engine thread has not in ``after`` seconds."""

        async def later() -> None:
            deadline = time.monotonic() + after
            while not self.future.done() and time.monotonic() < deadline:
                await asyncio.sleep(TICK)
            if not self.future.done() or self.future.cancelled():
                log.warning("generation %s did not stop; after_generate called by the host", self.ctx.request_id)
                await asyncio.to_thread(self.job.finish)

        self.host.keep(asyncio.ensure_future(later()))

    async def next(self, ping: float | None = None) -> Any:
        """The next event (``FINISHED``, ``STOPPED`` or an engine event); None once ``ping`` s pass without one."""
        waited = 0.0
        while True:
            self.check()
            if not self.events.empty():  # wait_for costs a task: only when nothing is in yet
                return self.events.get_nowait()
            step = TICK if ping is None else min(TICK, ping - waited)
            try:
                return await asyncio.wait_for(self.events.get(), step)
            except TimeoutError:
                waited += step
                if ping is not None and waited >= ping - 1e-9:
                    return None


async def complete(
    host: GenerationHost, ctx: RequestContext, admission: Admission, gone: asyncio.Future | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Generate the whole answer; return the body and the response headers."""
    flight = Flight(host, ctx, admission, streaming=False, gone=gone)
    event = None
    try:
        while event is not FINISHED and event is not STOPPED:
            event = await flight.next()
    finally:
        if event is None:  # this task itself was cancelled
            flight.stop("cancelled")
        flight.end()
    if event is STOPPED:
        raise flight.error or ClientDisconnected("the client went away before the answer was ready")
    error = flight.future.exception()
    if error is not None:
        raise error
    return add_extras(host, ctx, completion_body(ctx)), collect_headers(host, ctx)


async def stream(
    host: GenerationHost, ctx: RequestContext, admission: Admission, gone: asyncio.Future | None = None
) -> Chunks:
    """Chunks of a streamed answer (dicts), ``None`` for a keep-alive, ``"[DONE]"`` last.

    The generation runs on the engine thread and hands events over a queue. If
    the client goes away the stream ends at once, the generation is cancelled at
    its next token and its place is freed; plugins still hear ``after_generate``.
    A request the host ends (stall, shutdown) gets an error event, then ``[DONE]``.

    Every chunk has a choice, so ``chunk.choices[0]`` always works: the last
    ``finish_reason`` chunk is held back until the generation has finished and
    carries the plugins' extras (``response_extras``, ``millm_plugin_errors``).
    With ``with_unsteered`` every choice's ``finish_reason`` chunk is held back, to
    carry that choice's own extras (each reply's verdicts); the last one also carries
    the request's. Only the usage chunk (``stream_options.include_usage``) has no
    choice; it is the last before ``[DONE]``, as OpenAI sends it.
    """
    flight = Flight(host, ctx, admission, streaming=True, gone=gone)
    ping = host.settings["MILLM_STREAM_PING_S"]
    held: dict[str, Any] | None = None  # the latest finish chunk: the last one takes the extras
    ended: list[dict[str, Any]] = []  # with_unsteered: every finish chunk but the latest, held for its choice's extras
    try:
        choices = ctx.choices_per_variant * (2 if ctx.with_unsteered else 1)
        if ctx.is_chat:
            yield chunk(ctx, [delta_choice(ctx, i, role=True) for i in range(choices)])
        while True:
            event = await flight.next(ping)
            if event is None:
                yield None  # lets the server notice a client that went away
                continue
            if event is FINISHED or event is STOPPED:
                break
            if held is not None:  # another choice is still going: this finish was not the last
                if ctx.with_unsteered:
                    ended.append(held)
                else:
                    yield held
                held = None
            kind, index, payload = event
            if kind == "delta":
                yield chunk(ctx, [delta_choice(ctx, index, payload)])
            elif kind == "delta_logprobs":  # text and the logprobs of the tokens it came from
                text, entries = payload
                yield chunk(ctx, [delta_choice(ctx, index, text, logprobs=render_logprobs(ctx, entries))])
            elif kind == "prompt":  # echo and prompt_logprobs: the prompt's text and logprobs, first
                text, entries, listed = payload
                choice = delta_choice(ctx, index, text, logprobs=render_logprobs(ctx, entries))
                if listed is not None:
                    choice["prompt_logprobs"] = listed
                yield chunk(ctx, [choice])
            elif kind == "delta_extra":
                yield chunk(ctx, [delta_choice(ctx, index, extra=payload)])
            elif kind == "finish":
                held = chunk(ctx, [delta_choice(ctx, index, None if ctx.is_chat else "", finish_reason=payload)])
        if event is STOPPED:
            if flight.error is None:
                return  # the client is gone: nobody reads what would follow
            for done in [*ended, *([held] if held is not None else [])]:
                yield done
            yield {"error": flight.error.to_dict()}
        else:
            error = flight.future.exception()
            if error is not None and not isinstance(error, RequestCancelled):
                for done in [*ended, *([held] if held is not None else [])]:
                    yield done
                yield {"error": raise_for(error).to_dict()}
            else:
                for done in finish_chunks(host, ctx, ended, held):
                    yield done
                if wants_usage(ctx):
                    yield chunk(ctx, [], usage=usage(ctx))
        yield DONE
    finally:
        flight.stop("client_disconnected")  # a no-op unless the consumer left before the end
        flight.end()


def finish_chunks(
    host: GenerationHost, ctx: RequestContext, ended: list[dict[str, Any]], held: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The stream's held finish chunks with every plugin's extras merged in, in order: a choice's
    (``ResponseExtra.choice``) into that choice's chunk, the request's into the last one.

    ``held`` is None only if no sequence reported its end; the extras then ride
    on a chunk with an empty delta, so that it still has a choice. A choice's extras
    whose finish chunk went out already ride on a chunk of their own, before the last.
    """
    body = held if held is not None else chunk(ctx, [delta_choice(ctx, 0, None if ctx.is_chat else "")])
    chunks = [*ended, body]
    for extra in collect_extras(host, ctx):  # after generation: the extras are known now
        if extra.choice is None:
            body.update(extra.fields)
            continue
        target = next((c for c in (choice_of(part, extra.choice) for part in chunks) if c is not None), None)
        if target is None:
            target = delta_choice(ctx, extra.choice, None if ctx.is_chat else "")
            chunks.insert(len(chunks) - 1, chunk(ctx, [target]))
        target.update(extra.fields)
    if ctx.plugin_errors:  # the headers are gone: the finish chunk names them
        body[hookcalls.PLUGIN_ERRORS_FIELD] = list(ctx.plugin_errors)
    return chunks

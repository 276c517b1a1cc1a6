"""The engine-thread half of a generation request.

``GenerationJob`` runs once per request on the engine thread: it asks plugins for
their hooks (``before_forward``), generates every sequence, enforcing EOS,
``max_tokens`` and stop sequences, and tells plugins it ended (``after_generate``),
also when it was cut short. Streaming requests pass ``emit`` to receive events as
they happen; nothing here knows about HTTP.

It reports progress to the scheduler at its start and at every token, so the
host can tell a stalled generation from a slow one.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Generator, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import hookcalls
from ..context import RequestContext, SequenceOutput
from ..engine import (
    GENERATION_CANCEL,
    SERVED_ADAPTER,
    STEERED,
    UNSTEERED,
    LayerHook,
    LogitsProcessorFactory,
    hooks_for,
)
from ..errors import InternalError, MillmError, RequestCancelled, ShuttingDown
from ..output import OutputFilter, OutputFilterFactory
from . import prompt_logprobs
from .logprobs import SequenceLogprobs, prompt_chars
from .text import TextAssembler

if TYPE_CHECKING:
    import pluggy

    from ..scheduler import Scheduler


class JobHost(Protocol):
    """What a generation job uses of the host."""

    pm: pluggy.PluginManager
    scheduler: Scheduler


log = logging.getLogger("millm.generation")

Emit = Callable[[tuple[Any, ...]], None]


def flatten(results: Iterable[Any]) -> list[Any]:
    """pluggy returns one result per plugin; each may be a list."""
    items: list[Any] = []
    for result in results:
        if result is None:
            continue
        if isinstance(result, (list, tuple)):
            items.extend(result)
        else:
            items.append(result)
    return items


def matched_stop(text: str, stops: list[str], at: int) -> str | None:
    """The stop sequence that ended ``text`` (the whole generation decoded), which the assembler cut at ``at``."""
    found = [(text.find(stop, max(at - len(stop), 0)), i, stop) for i, stop in enumerate(stops) if stop]
    hits = sorted((position, i, stop) for position, i, stop in found if position >= 0)
    return hits[0][2] if hits else None


def _nothing() -> Generator[int, None, None]:
    """No tokens: what a generation of ``max_tokens: 0`` reads."""
    yield from ()


def derive_seed(seed: int | None, choice: int) -> int | None:
    """Choice ``k`` of a seeded request draws from its own, reproducible seed."""
    if seed is None or choice == 0:
        return seed
    return (seed + choice * 0x9E3779B97F4A7C15) % 2**64


class GenerationJob:
    """Generates every sequence of one request (call it on the engine thread)."""

    def __init__(self, host: JobHost, ctx: RequestContext, emit: Emit | None = None) -> None:
        self.host = host
        self.ctx = ctx
        self.emit = emit
        self._lock = threading.Lock()
        self._told = False  # after_generate has been called
        self._abort = threading.Event()  # a sibling sequence failed: the others stop (``_together``)
        #: Per sequence index, its logprobs (when the request asks for them).
        self._logprobs: dict[int, SequenceLogprobs] = {}

    def __call__(self) -> None:
        ctx, scheduler = self.ctx, self.host.scheduler
        ctx.timing.start()
        scheduler.begin()
        GENERATION_CANCEL.set(ctx.cancel_event)  # this thread's own context (a copy): no reset needed
        SERVED_ADAPTER.set(ctx.adapter)  # its engine calls serve the request's LoRA adapter (None: the base)
        try:
            if ctx.cancel_event.is_set():  # it ended while it waited: plugins still hear of it
                raise RequestCancelled()
            if scheduler.expired():  # the shutdown grace ended while it waited: it must not start now
                ctx.interrupted = "cancelled"
                raise ShuttingDown("the server is shutting down; this request did not finish within the grace period")
            contributions = flatten(hookcalls.request(self.host.pm, "before_forward", ctx=ctx))
            if ctx.cancel_event.is_set():  # it ended while plugins prepared: it never reaches the engine
                raise RequestCancelled()
            prompt_logprobs.score(ctx)  # echo or prompt_logprobs: scoring's pass over each prompt first
            hooks = ctx.layer_hooks = [c for c in contributions if isinstance(c, LayerHook)]
            processors = [c for c in contributions if isinstance(c, LogitsProcessorFactory)]
            filters = [c for c in contributions if isinstance(c, OutputFilterFactory)]
            # with_unsteered: every choice twice, steered first; choice k of each reply draws from one seed
            variants = (STEERED, UNSTEERED) if ctx.with_unsteered else (STEERED,)
            sequences = [
                (variant, index, prompt, choice)
                for variant in variants
                for index, prompt in enumerate(ctx.prompts)
                for choice in range(ctx.n)
            ]
            rows = {variant: hooks_for(hooks, variant) for variant in variants}
            if len(sequences) > 1 and ctx.engine is not None and ctx.engine.concurrent_generation:
                opened = [
                    (self._open(index, prompt, variant), prompt, choice, rows[variant])
                    for variant, index, prompt, choice in sequences
                ]
                self._together(opened, processors, filters)
            else:  # one after the other: a sequence's output exists once it starts
                for variant, index, prompt, choice in sequences:
                    out = self._open(index, prompt, variant)
                    self._sequence(out, prompt, choice, rows[variant], processors, filters)
        except RequestCancelled:
            ctx.interrupted = ctx.interrupted or "client_disconnected"
        except MillmError as exc:
            ctx.error, ctx.interrupted = exc, ctx.interrupted or "generation_error"
        except Exception as exc:
            log.exception("generation failed")
            ctx.error, ctx.interrupted = (
                InternalError(f"generation failed: {type(exc).__name__}: {exc}"),
                "generation_error",
            )
        finally:
            scheduler.beat()  # a plugin's after_generate that hangs is a stall too
            self.finish()
            scheduler.rest()
        if ctx.error is not None:
            raise ctx.error

    def finish(self) -> None:
        """Tell plugins the generation ended (``after_generate``), once.

        The engine thread calls this when the generation ends; the host calls it
        from another thread for a generation that hung and did not stop in time.
        """
        with self._lock:
            if self._told:
                return
            self._told = True
        self.ctx.finished = True
        hookcalls.after_generate(self.host.pm, self.ctx)

    def _open(self, prompt_index: int, prompt: list[int], variant: str) -> SequenceOutput:
        """The next sequence's output, in ``ctx.outputs`` order (made before any runs)."""
        out = SequenceOutput(
            index=len(self.ctx.outputs),
            prompt_index=prompt_index,
            prompt_ids=prompt,
            variant=variant if self.ctx.with_unsteered else None,
        )
        self.ctx.outputs.append(out)
        return out

    def _together(
        self,
        sequences: list[tuple[SequenceOutput, list[int], int, list[LayerHook]]],
        processors: list[LogitsProcessorFactory],
        filters: list[OutputFilterFactory],
    ) -> None:
        """Every sequence at once, each on a thread of its own with its own hooks (``n > 1`` and both
        replies of ``with_unsteered`` as rows of the engine's batch).

        The first failure stops the others at their next token and is raised here.
        """
        failures: list[BaseException] = []

        def one(out: SequenceOutput, prompt: list[int], choice: int, hooks: list[LayerHook]) -> None:
            try:
                self._sequence(out, prompt, choice, hooks, processors, filters)
            except BaseException as exc:
                failures.append(exc)
                self._abort.set()

        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(one, *seq), name="millm-choice")
            for seq in sequences
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:  # a real failure before the cancellations it caused
            raise next((f for f in failures if not isinstance(f, RequestCancelled)), failures[0])

    def _sequence(
        self,
        out: SequenceOutput,
        prompt: list[int],
        choice: int,
        hooks: list[LayerHook],
        processors: list[LogitsProcessorFactory],
        filters: list[OutputFilterFactory],
    ) -> None:
        ctx = self.ctx
        engine = ctx.engine
        assert engine is not None and ctx.sampling is not None
        prompt_index = out.prompt_index
        params = replace(ctx.sampling, seed=derive_seed(ctx.sampling.seed, choice))
        seq_filters = [f.make(out.index) for f in filters]
        # vLLM's min_tokens: no stop sequence ends the text before it (ignore_eos leaves stops be)
        assembler = TextAssembler(engine.decode, ctx.params.stop_list, stops_after=ctx.params.min_tokens or 0)
        # a model that thinks: its block goes to ``out.reasoning`` before the filters see the answer
        splitter = ctx.reasoning.splitter(prompt_index) if ctx.reasoning is not None else None
        eos = engine.info.eos_token_ids
        finish = "length"
        logprobs = None
        if params.logprobs is not None:
            logprobs = SequenceLogprobs(engine, prompt_chars(ctx, engine, prompt_index))
            self._logprobs[out.index] = logprobs
            out.logprobs = logprobs.entries
        if self.emit:  # the echoed prompt (and its logprobs) comes first
            echo = prompt_logprobs.echoed(ctx, prompt_index)
            listed = prompt_logprobs.listed(ctx, prompt_index)
            if echo is not None or listed is not None:
                self.emit(("prompt", out.index, (*(echo or ("", None)), listed)))
        if params.max_tokens:
            tokens = engine.generate(
                prompt, params, hooks=hooks, logits_processors=[p.make(out.index) for p in processors]
            )
        else:  # max_tokens 0 (echo or prompt_logprobs): the prompt was scored, nothing is generated
            tokens = _nothing()
        beat, mark = self.host.scheduler.beat, ctx.timing.token
        ctx.timing.sequence()
        try:
            for token in tokens:
                beat()
                mark()
                if ctx.cancel_event.is_set() or self._abort.is_set():
                    raise RequestCancelled()
                if token in eos:
                    finish = "stop"
                    break
                out.token_ids.append(token)
                if logprobs is not None:
                    logprobs.add(token)
                delta = assembler.add(token)
                if splitter is None:
                    if delta:
                        self._send(out, delta, seq_filters)
                else:
                    thinking = splitter.state != splitter.ANSWER
                    self._split(out, splitter.feed(delta), seq_filters)
                    if thinking and splitter.found:
                        out.reasoning_tokens = len(out.token_ids)
                if assembler.stopped:
                    finish = "stop"
                    out.stop_sequence = matched_stop(
                        engine.decode(out.token_ids), ctx.params.stop_list, len(assembler.text)
                    )
                    break
                if len(out.token_ids) >= params.max_tokens:
                    break
            else:  # the engine ended the tokens: at its window, or because the request was cancelled
                if ctx.cancel_event.is_set():
                    raise RequestCancelled()
        finally:
            tokens.close()
            out.cached_tokens = getattr(tokens, "cached_tokens", None)
        tail = assembler.finish()
        if splitter is not None:
            self._split(out, splitter.feed(tail), seq_filters)
            self._split(out, splitter.finish(), seq_filters)
            if splitter.found and out.reasoning is None:  # an empty block
                out.reasoning = ""
        elif tail:
            self._send(out, tail, seq_filters)
        out.finish_reason = finish
        for position, seq_filter in enumerate(seq_filters):
            result = seq_filter.finish(out.finish_reason)
            if result.text:
                self._send(out, result.text, seq_filters[position + 1 :])
            self._stream_deltas(out, [seq_filter])  # what finish settled (e.g. the calls' last deltas)
            if result.finish_reason:
                out.finish_reason = result.finish_reason
            out.message_extras.update(result.message_extras)
            if result.stream_delta and self.emit:
                self.emit(("delta_extra", out.index, result.stream_delta))
        if self.emit and logprobs is not None and logprobs.sent < len(logprobs.entries):
            self.emit(("delta_logprobs", out.index, ("", logprobs.pending())))  # tokens no text was sent for
        if self.emit:
            self.emit(("finish", out.index, out.finish_reason))

    def _split(self, out: SequenceOutput, parts: tuple[str, str], filters: list[OutputFilter]) -> None:
        """A splitter's ``(reasoning, answer)``: the reasoning kept (and streamed), the answer sent on."""
        reasoning, answer = parts
        if reasoning:
            out.reasoning = (out.reasoning or "") + reasoning
            if self.emit and self.ctx.include_reasoning:
                self.emit(("delta_extra", out.index, {"reasoning_content": reasoning}))
        if answer:
            self._send(out, answer, filters)

    def _send(self, out: SequenceOutput, text: str, filters: list[OutputFilter]) -> None:
        fed = 0
        for seq_filter in filters:
            text = seq_filter.feed(text)
            fed += 1
            if not text:
                break
        if text:
            out.text += text
            if self.emit:
                logprobs = self._logprobs.get(out.index)
                if logprobs is None:
                    self.emit(("delta", out.index, text))
                else:
                    self.emit(("delta_logprobs", out.index, (text, logprobs.pending())))
        self._stream_deltas(out, filters[:fed])  # after the text: it came before them

    def _stream_deltas(self, out: SequenceOutput, filters: list[OutputFilter]) -> None:
        """Deltas a filter has ready as the text grows (``take_deltas``: a tool call's name, then its arguments)."""
        for seq_filter in filters:
            take = getattr(seq_filter, "take_deltas", None)
            for delta in take() if take is not None else ():
                if self.emit:
                    self.emit(("delta_extra", out.index, delta))

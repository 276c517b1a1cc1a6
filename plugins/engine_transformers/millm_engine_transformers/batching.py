"""Continuous batching: many generations share each decode step of the model.

One scheduler thread owns the running batch. Between two steps it drops the rows
whose consumer left (closed its generator: a disconnect, a stop string, EOS; a row
still waiting leaves the moment its request is cancelled, whatever this thread is
doing, so a request whose client has gone never enters the batch), starts
a prefill for the requests waiting then (together, left-padded to the longest, on a
cache of their own: requests that arrive together get their first tokens together;
``MILLM_BATCH_GATHER_MS`` can hold the first arrival back that long to gather more),
runs one chunk of every prefill under way, and merges a finished prefill into the
batch. The prefills of a step share one budget of ``MILLM_PREFILL_CHUNK`` tokens
(columns times rows, shared out oldest first), so a new request starts its prefill
at the next step even beside a long prompt, and the running decodes are held up by
one budget's worth of prefill per step at most. Each step then runs one forward over
every decoding row and samples each row on its own terms: temperature, top_p,
penalties, logit bias, logits processors (``response_format``, tools) and logprobs,
with a ``torch.Generator`` per row, so a seeded row draws the same whatever shares
its batch. Plain greedy rows (no penalties, bias or processors) share one argmax
over the batch's logits; the other rows, each after its own bias, penalties and
processors, share one softmax and nucleus cut (``choose_rows``), each drawing from
its own generator: what it would draw alone, bit for bit.

The KV cache is one left-padded ``RoomyCache`` (a ``DynamicCache`` that writes each
step into spare room instead of concatenating) of shape ``[rows, heads, L, d]``:
a row that joins is padded on the left to the batch's length (or the batch to its);
a row that leaves is cut out of the batch dimension and the all-padding columns on
the left are dropped. Each row's padding is masked out (``attention_mask``) and
its positions are its own (``position_ids``), so a row computes what it would
alone, up to floating-point rounding of the batched matrix products.

Layer hooks (steering writes, probe reads) see the batch through a row -> request
map: at each hooked point, each batched function (``LayerHook.batched``) is called
once with the whole batch and the ``HookRow``s of the rows that carry it, and each
per-row callback gets its row alone, ``[1, seq, d]`` with its own start position, as
``LayerHook`` promises; a row without hooks costs nothing there, and a point no row
hooks gets no torch hook. A callback that raises fails its own row only.

The scheduler's thread is the only one that runs the model: the engine's other
model work (scoring, embeddings, hooked forwards, a generation that runs alone) is
handed to it (``call``, ``call_soon``) and runs between two steps, in arrival order,
for as long as it takes. One thread means one OpenMP team (``intraop``).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import transformers

from millm_host.api import READS_PROMPT, HookRow, LayerHook, SamplingParams, generation_cancel

from . import hooks as layer_hooks
from .adapters import Selection
from .intraop import IntraOp
from .kvcache import RoomyCache
from .prefix_cache import Hit, PrefixCache, Tap
from .sampling import GREEDY_BELOW, LogitBias, Penalties, choose, choose_rows, generator_for, with_logprobs

log = logging.getLogger("millm.batching")

_END = object()
T = TypeVar("T")


@dataclass(eq=False)
class Call:
    """Model work handed to the scheduler's thread, run in its caller's context."""

    fn: Callable[[], Any]
    future: Future
    context: contextvars.Context

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.context.run(self.fn)
        except BaseException as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


@dataclass(eq=False)
class Prefill:
    """Waiting rows prefilling together: their prompts left-padded to the longest, their own cache."""

    rows: list[Row]
    ids: torch.Tensor  # [rows, L], 0 where padding
    mask: torch.Tensor  # [rows, offset + L], 1 = a real token
    positions: torch.Tensor  # [rows, L], each row's own (0 on its padding)
    cache: Any
    done: int = 0  # columns prefilled
    #: Columns the cache held before the first chunk: a prompt prefix reused from the prefix cache.
    offset: int = 0

    @classmethod
    def of(cls, rows: list[Row], device: torch.device) -> Prefill:
        length = max(len(row.prompt) for row in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long, device=device)
        mask = torch.zeros(len(rows), length, dtype=torch.long, device=device)
        for index, row in enumerate(rows):
            if row.prompt:
                ids[index, length - len(row.prompt) :] = torch.tensor(row.prompt, device=device)
                mask[index, length - len(row.prompt) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return cls(rows, ids, mask, positions, RoomyCache())

    @classmethod
    def resumed(cls, row: Row, hit: Hit, device: torch.device) -> Prefill:
        """``row`` alone, its cache starting with the reused prefix: it prefills the rest of its prompt."""
        cache = RoomyCache()
        for index, (keys, values) in enumerate(hit.layers()):
            cache.update(keys, values, index)  # a copy: the stored prefix stays as it was
        rest = row.prompt[hit.length :]
        ids = torch.tensor([rest], dtype=torch.long, device=device)
        mask = torch.ones(1, len(row.prompt), dtype=torch.long, device=device)
        positions = torch.arange(hit.length, len(row.prompt), device=device)[None]
        return cls([row], ids, mask, positions, cache, offset=hit.length)

    def padding(self, index: int) -> int:
        return self.ids.shape[1] - (len(self.rows[index].prompt) - self.offset)

    def cut_left(self) -> list[Row]:
        """Cut the rows that left out of this prefill (their tokens and what they cached so far); returns them.

        A long prompt prefills over several steps: one whose client has gone costs no chunk after that.
        """
        keep = [index for index, row in enumerate(self.rows) if not row.left]
        if len(keep) == len(self.rows):
            return []
        leaving = [row for row in self.rows if row.left]
        index = torch.tensor(keep, device=self.ids.device)
        self.rows = [self.rows[i] for i in keep]
        self.ids, self.mask, self.positions = (t.index_select(0, index) for t in (self.ids, self.mask, self.positions))
        if self.done:  # the cache holds the chunks run so far
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        return leaving


@dataclass(eq=False)
class Row:
    """One generation in (or waiting for) the batch."""

    prompt: list[int]
    params: SamplingParams
    processors: Sequence[Callable[[Sequence[int], Any], Any]]
    generator: torch.Generator
    penalties: Penalties
    bias: LogitBias
    #: Its layer hooks by point (steering, probes): called on its own row of each pass.
    hooks: dict[layer_hooks.Point, list[LayerHook]] = field(default_factory=dict)
    error: Exception | None = None  # one of its hooks raised during the pass
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    generated: list[int] = field(default_factory=list)
    gone: bool = False  # its consumer closed the stream: drop it at the next step
    #: Its request's cancellation (``generation_cancel``): once set, it leaves at the next step,
    #: waiting, prefilling or decoding, without its consumer having to read another token first.
    cancel: threading.Event | None = None
    position: int = 0  # the position of its next input token
    arrived: float = 0.0  # time.monotonic() when it began to wait
    #: Prompt tokens it reused from the prefix cache (None until it joins a prefill).
    cached: int | None = None
    #: Its prefix cache key and the taps its reads need, when it may reuse and store a prompt.
    cache_key: tuple[Any, frozenset[Tap]] | None = None
    #: Its prefix cache key and prompt digest (``_twin_key``), set when it is admitted: a twin waits for its prefill.
    twin: Hashable | None = None
    #: ``hash`` of its prompt, taken once where it is made (its consumer's thread), so that admission
    #: compares prompts in O(1) however long they are and however often a twin is looked at again.
    prompt_digest: int = 0
    #: What its reads saw over its prompt so far, by tap (while it prefills, to store with its prompt).
    captured: dict[Tap, list[torch.Tensor]] = field(default_factory=dict)
    #: A replay's given tokens (``replay``): fed in order instead of sampled, EOS among them ignored.
    forced: list[int] = field(default_factory=list)
    #: The LoRA adapter its passes use (``adapters``); None: the base model.
    adapter: str | None = None

    @property
    def left(self) -> bool:
        """Its consumer closed the stream, or its request was cancelled."""
        return self.gone or (self.cancel is not None and self.cancel.is_set())

    @property
    def plain_greedy(self) -> bool:
        """Its next token is the argmax of the model's logits (shared over the batch)."""
        return (
            self.params.temperature < GREEDY_BELOW
            and not self.processors
            and not self.penalties.active
            and not self.bias.active
        )


class BatchScheduler:
    """The running batch and the queue of generations waiting to join it."""

    def __init__(
        self,
        model: Any,
        layers: torch.nn.ModuleList,
        device: torch.device,
        vocab_size: int,
        eos_ids: frozenset[int],
        window: int | None,
        cache_arg: str,
        max_rows: int,
        prefill_chunk: int,
        gather_s: float = 0.0,
        intraop: IntraOp | None = None,
        prefix_cache: PrefixCache | None = None,
        selection: Selection | None = None,
    ) -> None:
        self.model = model
        self.layers = layers
        self.device = device
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.window = window
        self.cache_arg = cache_arg
        self.intraop = intraop
        self.max_rows = max(1, max_rows)
        self.prefill_chunk = max(1, prefill_chunk)
        self.gather_s = max(0.0, gather_s)
        self.prefix_cache = prefix_cache
        self.selection = selection  # which LoRA adapter each row of a pass uses (None: no adapters here)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Row] = collections.deque()
        self._calls: collections.deque[Call] = collections.deque()  # model work from other threads
        self._closed = False
        # The batch (scheduler thread only).
        self.rows: list[Row] = []
        #: What a pass's sampling sends, held until the rows that finished have left the batch,
        #: so a consumer holding its last token never sees its row still counted as running.
        self._outbox: list[tuple[Row, Any]] = []
        self._prefilling: list[Prefill] = []  # oldest first
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [rows, L] 1 = a real token, 0 = left padding
        self._padded = False  # some row has left padding
        self.steps = 0
        self.prefills = 0  # prefills started (each for every request then waiting)
        #: Rows that joined a prefill (entered the batch), and rows whose request was cancelled first.
        self.joined = 0
        self.left_waiting = 0
        self._thread = threading.Thread(target=self._loop, name="millm-batch", daemon=True)
        self._thread.start()

    # --- the consumer side (any thread) ------------------------------------------------
    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
        hooks: Sequence[LayerHook] = (),
        adapter: str | None = None,
    ) -> RowTokens:
        """Tokens of one generation, as ``Engine.generate`` yields them; closing it leaves the batch.

        ``adapter``: the LoRA adapter (loaded in the model) its passes use; None: the base model."""
        row = Row(
            hooks=layer_hooks.grouped(hooks, len(self.layers)),
            prompt=list(prompt_ids),
            params=params,
            processors=list(processors),
            generator=generator_for(params, self.device),
            penalties=Penalties(params, self.vocab_size, self.device, self.eos_ids),
            bias=LogitBias(params, self.device),
            position=len(prompt_ids),
            cancel=generation_cancel(),
            adapter=adapter,
            prompt_digest=hash(tuple(prompt_ids)),
        )
        return RowTokens(row, self._stream(row))

    def _stream(self, row: Row) -> Generator[int, None, None]:
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            if row.left:  # cancelled before it was handed over: it never waits, let alone prefills
                self.left_waiting += 1
                return
            row.arrived = time.monotonic()
            self._waiting.append(row)
            self._cond.notify()
        # The host's cancellation calls back when it is set (``Cancellation.add_callback``): a row
        # still waiting leaves then, even while this thread is held up by a long step or model work.
        add_callback = getattr(row.cancel, "add_callback", None)
        if add_callback is not None:
            add_callback(lambda: self._leave_waiting(row))
        try:
            while True:
                item = row.out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            row.gone = True
            with self._cond:
                self._cond.notify()

    def _leave_waiting(self, row: Row) -> None:
        """``row`` was cancelled (any thread): if it still waits, it leaves now and its consumer hears so."""
        with self._cond:
            if row not in self._waiting:
                return  # it joined a prefill: it leaves at the next step
            self._waiting.remove(row)
            self.left_waiting += 1
        row.out.put(_END)

    def replay(self, rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[LayerHook]]]) -> None:
        """Run ``rows`` (prompt, given tokens, hooks) through the batch as generations that arrive together.

        Each prompt is prefilled (together, left-padded, in chunks, beside whatever runs), then its
        given tokens are fed one decode step each in place of sampled ones, and one step more, so
        its hooks read every given token as a generation's hooks read its reply. The shapes are
        the ones live serving makes: what checks that a hook reads the same in a batch (parity)
        runs. Returns when every row has ended; raises what failed one.
        """
        made = []
        for prompt, given, hooks in rows:
            params = SamplingParams(max_tokens=len(given) + 1, temperature=0.0)
            made.append(
                Row(
                    hooks=layer_hooks.grouped(hooks, len(self.layers)),
                    prompt=list(prompt),
                    params=params,
                    processors=[],
                    generator=generator_for(params, self.device),
                    penalties=Penalties(params, self.vocab_size, self.device),
                    bias=LogitBias(params, self.device),
                    position=len(prompt),
                    forced=list(given),
                )
            )
        with self._cond:  # enqueued at once, so they share a prefill when there is room
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            now = time.monotonic()
            for row in made:
                row.arrived = now
            self._waiting.extend(made)
            self._cond.notify()
        failure: BaseException | None = None
        for row in made:
            while (item := row.out.get()) is not _END:
                if isinstance(item, BaseException):
                    failure = failure or item
                    break
        if failure is not None:
            raise failure

    @property
    def running(self) -> int:
        """Rows decoding in the batch, and those prefilling."""
        return len(self.rows) + sum(len(group.rows) for group in list(self._prefilling))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # --- other model work, on the scheduler's thread ----------------------------------
    def call_soon(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the scheduler's thread between two steps (in the caller's context)."""
        call = Call(fn, Future(), contextvars.copy_context())
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._calls.append(call)
            self._cond.notify()
        return call.future

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the scheduler's thread (at once when called there); its result or its exception."""
        if threading.current_thread() is self._thread:
            return fn()
        return self.call_soon(fn).result()

    @contextmanager
    def held(self) -> Iterator[None]:
        """No step runs inside the block: the scheduler's thread waits in it, as model work would."""
        started, release = threading.Event(), threading.Event()

        def park() -> None:
            started.set()
            release.wait()

        future = self.call_soon(park)
        while not started.wait(0.05):
            if future.done():
                future.result()  # it failed to start: say why
        try:
            yield
        finally:
            release.set()
            future.result()

    # --- the scheduler thread ----------------------------------------------------------
    def _loop(self) -> None:
        if self.intraop is not None:
            self.intraop.enter()  # this thread's OpenMP team is the model's
        while True:
            with self._cond:
                while not self._closed and not self._calls and not (self.rows or self._prefilling):
                    wait = self._admission_wait()
                    if wait == 0:
                        break
                    self._cond.wait(wait)  # None: until an arrival, a departure or a call
                calls = list(self._calls)
                self._calls.clear()
                if self._closed:
                    for call in calls:
                        call.future.set_exception(RuntimeError("the model was unloaded"))
                    self._fail_all(RuntimeError("the model was unloaded"))
                    return
            for call in calls:  # between two steps, in arrival order: a step never waits behind more
                call.run()
            if not (self.rows or self._prefilling or self._waiting):
                continue
            try:
                with torch.inference_mode():
                    self._step()
            except Exception as exc:  # a failed forward fails every row in it; the scheduler goes on
                log.exception("batched step failed")
                self._fail_all(exc)

    def _admission_wait(self) -> float | None:
        """Seconds until the waiting requests may start their prefill: 0 now, None when none can.

        With ``gather_s``, the first arrival waits that long for others to share its prefill,
        unless the waiting requests already fill the room.
        """
        room = self.max_rows - self.running
        if not self._waiting or room <= 0:
            return None
        if self.gather_s <= 0 or len(self._waiting) >= room:
            return 0
        return max(0.0, self._waiting[0].arrived + self.gather_s - time.monotonic())

    def _step(self) -> None:
        """Drop the rows that left (decoding, prefilling or waiting), one chunk of every prefill, then one
        decode step of the batch."""
        self._drop([row for row in self.rows if row.left])
        for group in [group for group in self._prefilling if any(row.left for row in group.rows)]:
            if all(row.left for row in group.rows):
                self._prefilling.remove(group)
                self._end(group.rows)
            else:
                self._end(group.cut_left())
        if self._waiting:  # the lock only when someone waits: this runs at every step
            with self._cond:
                cancelled = [row for row in self._waiting if row.left]
                for row in cancelled:
                    self._waiting.remove(row)
                self.left_waiting += len(cancelled)
            self._end(cancelled)
        self._admit()
        self._prefill_chunks()
        if self.rows:
            self._decode()

    def _admit(self) -> None:
        """Everyone waiting (as far as there is room) starts one prefill, together, beside any under way.

        Taken after the model work handed to this thread: requests that arrive while it runs join one prefill.
        """
        with self._cond:
            if self._admission_wait() != 0:
                return
            room = self.max_rows - self.running
            prefilling = {row.twin for group in self._prefilling for row in group.rows if row.twin is not None}
            joining: list[Row] = []
            behind: list[Row] = []
            while self._waiting and len(joining) < room:
                row = self._waiting.popleft()
                row.twin = self._twin_key(row)
                if row.twin is not None and row.twin in prefilling:
                    behind.append(row)  # its twin's prefill is stored when it ends: it reuses all of it
                    continue
                prefilling.add(row.twin)
                joining.append(row)
            self._waiting.extendleft(reversed(behind))
        if not joining:
            return
        self.joined += len(joining)
        cold = []
        for row in joining:
            hit = self._reuse(row)
            if hit is None:
                cold.append(row)
            else:  # its own prefill: it starts where its reused prefix ends
                self._prefilling.append(Prefill.resumed(row, hit, self.device))
        if cold:
            self._prefilling.append(Prefill.of(cold, self.device))
        self.prefills += 1

    # --- the prefix cache ----------------------------------------------------------------
    def _twin_key(self, row: Row) -> Hashable | None:
        """What makes rows twins: one prompt under one prefix cache key (``n > 1`` choices, both replies of
        ``with_unsteered`` where nothing steers). A row whose twin is prefilling waits for it and then
        reuses its whole prompt from the cache, instead of computing it again beside it. None: it cannot
        reuse (no prefix cache, a replay, or a hook that must see every position)."""
        if self.prefix_cache is None or row.forced:
            return None
        key = prompt_key(row)
        if key is None:
            return None
        if not self.prefix_cache.fits(len(row.prompt)):  # its twin's prefill would not be kept: nothing to wait for
            return None
        # Equal digests of unequal prompts only make one wait: the reuse compares the tokens themselves.
        return (key, len(row.prompt), row.prompt_digest)

    def _reuse(self, row: Row) -> Hit | None:
        """The cached prefix ``row`` reuses (None: it computes its whole prompt); readies it to store its own."""
        row.cached = 0
        if self.prefix_cache is None or row.forced:  # a replay measures live shapes: it computes everything
            return None
        # its key as admission just computed it (``twin``), not worked out again
        row.cache_key = row.twin[0] if isinstance(row.twin, tuple) else prompt_key(row)
        if row.cache_key is None:
            return None
        key, taps = row.cache_key
        hit = self.prefix_cache.find(key, row.prompt, taps)
        if hit is not None:
            row.cached = hit.length
            for point, hooks in row.hooks.items():  # its reads see the reused positions as a cold run did
                for hook in hooks:
                    if _resolved(hook) == READS_PROMPT:
                        self._replay(row, hook, hit.residual((*point, hook.order)))
        if taps:
            self._tap(row)
            if hit is not None:  # what the reused positions' reads saw comes first in what it stores
                for tap in taps:
                    row.captured[tap].append(hit.residual(tap)[0])
        return hit

    def _replay(self, row: Row, hook: LayerHook, hidden: torch.Tensor) -> None:
        try:
            if hook.batched is not None:
                hook.batched(hidden, [HookRow(0, 0, 0, hook, continuous=True, replayed=True)])
            else:
                hook.callback(hidden, 0)
        except Exception as exc:
            row.error = row.error or exc

    def _tap(self, row: Row) -> None:
        """Hooks that keep what ``row``'s reads see while it prefills, first at each of their (point, order)."""
        assert row.cache_key is not None
        hooks = dict(row.hooks)
        for layer, point, order in sorted(row.cache_key[1]):
            chunks = row.captured[(layer, point, order)] = []
            there = hooks[(layer, point)]
            tap = LayerHook(layer, there[0].point, _keeper(chunks), order, owner=TAP_OWNER, prompt_key=READS_PROMPT)
            hooks[(layer, point)] = sorted([tap, *there], key=lambda h: h.order)  # stable: first at its order
        row.hooks = hooks

    def _store(self, group: Prefill) -> None:
        """Keep each row's prompt (keys, values and what its reads saw) for later rows; drop its taps."""
        cache = self.prefix_cache
        if cache is None:
            return
        for index, row in enumerate(group.rows):
            if row.cache_key is None:
                continue
            if row.captured:
                row.hooks = {p: [h for h in hs if h.owner != TAP_OWNER] for p, hs in row.hooks.items()}
            if row.error is not None or prompt_key(row) != row.cache_key:  # a live write moved meanwhile
                continue
            n = len(row.prompt)
            layers = [
                (la.keys[index : index + 1, :, -n:], la.values[index : index + 1, :, -n:]) for la in group.cache.layers
            ]
            residuals = {tap: torch.cat(chunks)[-n:] for tap, chunks in row.captured.items()}
            if all(r.shape[0] == n for r in residuals.values()):
                cache.store(row.cache_key[0], row.prompt, layers, residuals)
            row.captured = {}

    def _prefill_chunks(self) -> None:
        """One chunk of each prefill under way, within one budget of ``prefill_chunk`` tokens.

        Shared out oldest first: each gets an equal part of what is left (at least one column),
        and what one does not need goes to those after it.
        """
        budget = self.prefill_chunk
        groups = list(self._prefilling)
        for index, group in enumerate(groups):
            share = budget // (len(groups) - index)
            columns = min(group.ids.shape[1] - group.done, max(1, share // len(group.rows)))
            budget = max(0, budget - columns * len(group.rows))
            self._prefill_chunk(group, columns)

    def _prefill_chunk(self, group: Prefill, columns: int) -> None:
        rows, length = group.rows, group.ids.shape[1]
        start = group.done
        end = min(length, start + columns)
        # Each row's hooks see its own real tokens of this chunk, from their own position.
        starts = [group.offset + max(0, start - group.padding(i)) for i in range(len(rows))]
        skips = [max(0, group.padding(i) - start) for i in range(len(rows))]
        mask = group.mask[:, : group.offset + end]
        padded = bool((mask == 0).any())
        padding = {"attention_mask": mask, "position_ids": group.positions[:, start:end]} if padded else {}
        try:  # what fails here (memory for long prompts) fails these rows alone
            output = self._hooked_forward(
                rows, starts, group.ids[:, start:end], group.cache, keep_last=True, skips=skips, **padding
            )
        except Exception as exc:
            self._prefilling.remove(group)
            for row in rows:
                row.out.put(exc)
            return
        group.done = end
        if end < length:
            return
        self._prefilling.remove(group)
        self._store(group)
        going_on = self._sample(rows, output.logits[:, -1].float())
        self._end([row for row, on in zip(rows, going_on, strict=True) if not on and row.left])
        joining = [index for index, on in enumerate(going_on) if on]
        if joining:
            self._join([rows[i] for i in joining], group.cache, group.mask, joining)
        self._flush()

    def _decode(self) -> None:
        rows = self.rows
        assert self._mask is not None
        ids = torch.tensor([[row.generated[-1]] for row in rows], device=self.device)
        positions = torch.tensor([[row.position] for row in rows], device=self.device)
        mask = torch.cat([self._mask, torch.ones(len(rows), 1, dtype=self._mask.dtype, device=self.device)], dim=1)
        # No row padded (one row, or rows of one length): the plain causal pass, as a serial decode runs it.
        padding = {"attention_mask": mask, "position_ids": positions} if self._padded else {}
        output = self._hooked_forward(rows, [row.position for row in rows], ids, self._cache, keep_last=True, **padding)
        self._mask = mask
        self.steps += 1
        for row in rows:
            row.position += 1
        going_on = self._sample(rows, output.logits[:, -1].float())
        self._drop([row for row, on in zip(rows, going_on, strict=True) if not on])
        self._flush()

    def _flush(self) -> None:
        for row, item in self._outbox:
            row.out.put(item)
        self._outbox.clear()

    def _hooked_forward(
        self, rows: Sequence[Row], starts: Sequence[int], *args: Any, skips: Sequence[int] | None = None, **kwargs: Any
    ) -> Any:
        """One pass with each row's hooks on its own row (none installed when no row has any), and its adapter."""
        kwargs["adapters"] = [row.adapter for row in rows]
        skips = skips or [0] * len(rows)
        hooked = [
            (row.hooks, start, skip) if row.hooks else None
            for row, start, skip in zip(rows, starts, skips, strict=True)
        ]
        if not any(hooked):
            return self._forward(*args, **kwargs)

        def failed(index: int, exc: Exception) -> None:
            rows[index].error = rows[index].error or exc

        handles = layer_hooks.install_rows(self.layers, hooked, failed)
        try:
            return self._forward(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    def _forward(
        self, ids: torch.Tensor, cache: Any, keep_last: bool, adapters: Sequence[str | None] = (), **kwargs: Any
    ) -> Any:
        kwargs.update({"input_ids": ids, "use_cache": True, self.cache_arg: cache})
        if keep_last:
            kwargs["logits_to_keep"] = 1
        if self.selection is None or not any(adapters):
            return self.model(**kwargs)
        with self.selection.rows(adapters):  # each row its own adapter (peft's mixed batch), "__base__" for none
            return self.model(**kwargs)

    def _sample(self, rows: Sequence[Row], logits: torch.Tensor) -> list[bool]:
        """Choose and send each row's next token from ``logits`` ``[rows, vocab]``; per row, whether it goes on.

        Plain greedy rows take theirs from one argmax over the batch (``torch.argmax`` takes the
        first of equal maxima over a row or the batch alike). The others get their own logit
        bias, penalties and processors, then are sampled together (``choose_rows``: one softmax
        and nucleus cut, each row its own generator), each exactly as ``choose`` would alone.
        A row whose hook, processor or draw failed gets its error and leaves, the others go on.
        """
        chosen: dict[int, tuple[int, torch.Tensor]] = {}  # row -> (token, the logits it came from)
        plain, prepared = [], []
        for index, row in enumerate(rows):
            if row.left:  # its consumer hears of it where it is dropped (``_end``)
                continue
            if row.error is not None:  # one of its hooks raised during the pass
                self._outbox.append((row, row.error))
            elif len(row.generated) < len(row.forced):  # a replay: its next token is given
                chosen[index] = (row.forced[len(row.generated)], logits[index])
            elif row.plain_greedy:
                plain.append(index)
            else:
                try:
                    own = row.penalties.apply(row.bias.apply(logits[index]))
                    for process in row.processors:
                        own = process(row.generated, own)
                except Exception as exc:  # a processor's failure is its row's alone
                    self._outbox.append((row, exc))
                    continue
                prepared.append((index, own))
        if plain:
            picked = logits if len(plain) == len(rows) else logits[torch.tensor(plain, device=logits.device)]
            for index, token in zip(plain, picked.argmax(dim=-1).tolist(), strict=True):
                chosen[index] = (token, logits[index])
        if prepared:
            same = all(own.shape == logits.shape[1:] and own.dtype == logits.dtype for _, own in prepared)
            stacked = torch.stack([own for _, own in prepared]) if same else None
            drawn = choose_rows_or_alone(stacked, [own for _, own in prepared], [rows[i] for i, _ in prepared])
            for (index, own), token in zip(prepared, drawn, strict=True):
                if isinstance(token, Exception):
                    self._outbox.append((rows[index], token))
                else:
                    chosen[index] = (token, own)
        return [index in chosen and self._send(rows[index], *chosen[index]) for index in range(len(rows))]

    def _send(self, row: Row, token: int, logits: torch.Tensor) -> bool:
        """Send ``row``'s ``token`` (drawn from ``logits``); False when the row is done (or failed)."""
        params = row.params
        try:
            item = token if params.logprobs is None else with_logprobs(token, logits, params)
        except Exception as exc:
            self._outbox.append((row, exc))
            return False
        row.generated.append(token)
        row.penalties.record(token)
        self._outbox.append((row, item))
        done = (
            (token in self.eos_ids and len(row.generated) > len(row.forced))
            or len(row.generated) >= params.max_tokens
            or (self.window is not None and row.position >= self.window)
        )
        if done:
            self._outbox.append((row, _END))
        return not done

    # --- the batch's cache ---------------------------------------------------------------
    def _join(self, rows: list[Row], cache: Any, mask: torch.Tensor, keep: list[int]) -> None:
        """Merge ``rows`` (rows ``keep`` of a prefilled ``cache``) into the batch, left-padding the shorter side."""
        layers = cache.layers
        if len(keep) < mask.shape[0]:
            index = torch.tensor(keep, device=self.device)
            mask = mask.index_select(0, index)
            for layer in layers:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        first = int(mask.any(dim=0).long().argmax())  # padding no joining row needs (its longest left)
        if first:
            mask = mask[:, first:]
            for layer in layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        if self._cache is None:
            self._cache, self._mask = cache, mask
        else:
            assert self._mask is not None
            total = max(mask.shape[1], self._mask.shape[1])
            for mine, theirs in zip(self._cache.layers, layers, strict=True):
                mine.keys = torch.cat([_left_pad(mine.keys, total), _left_pad(theirs.keys, total)], dim=0)
                mine.values = torch.cat([_left_pad(mine.values, total), _left_pad(theirs.values, total)], dim=0)
            self._mask = torch.cat([_left_pad(self._mask, total), _left_pad(mask, total)], dim=0)
        self.rows.extend(rows)
        self._padded = bool((self._mask == 0).any())

    def _end(self, rows: list[Row]) -> None:
        """Tell the consumers of ``rows`` (which left without taking their last token) that nothing follows."""
        for row in rows:
            if not row.gone:
                row.out.put(_END)

    def _drop(self, leaving: list[Row]) -> None:
        """Cut ``leaving`` out of the batch and trim the padding no remaining row needs; then tell
        the consumers of the cancelled ones (as finished rows' last tokens, once they are out)."""
        if leaving:
            self._cut(leaving)
            self._end([row for row in leaving if row.left])

    def _cut(self, leaving: list[Row]) -> None:
        keep = [index for index, row in enumerate(self.rows) if row not in leaving]
        self.rows = [self.rows[index] for index in keep]
        if not keep:
            self._cache = self._mask = None
            self._padded = False
            return
        assert self._mask is not None
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        first = int(mask.any(dim=0).long().argmax())  # the first column some row still reads
        self._mask = mask[:, first:]
        self._padded = bool((self._mask == 0).any())
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()  # what was chosen before the failure still goes out, then the error
        rows = list(self.rows)
        for group in self._prefilling:
            rows.extend(group.rows)
        if self._closed:
            with self._cond:
                rows.extend(self._waiting)
                self._waiting.clear()
        for row in rows:
            row.out.put(exc)
        self.rows, self._prefilling, self._cache, self._mask = [], [], None, None


class RowTokens:
    """A row's tokens (``Engine.generate``'s iterator), with the prompt tokens it reused (``cached_tokens``)."""

    def __init__(self, row: Row, tokens: Generator[int, None, None]) -> None:
        self._row, self._tokens = row, tokens

    def __iter__(self) -> RowTokens:
        return self

    def __next__(self) -> int:
        return next(self._tokens)

    def close(self) -> None:
        self._tokens.close()

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens reused from the prefix cache (None before its prefill began)."""
        return self._row.cached


#: The owner of the hooks that keep what a row's reads see while it prefills (``BatchScheduler._tap``).
TAP_OWNER = "millm-prefix-cache"


def _keeper(chunks: list[torch.Tensor]) -> Callable[[torch.Tensor, int], None]:
    def keep(hidden: torch.Tensor, start: int) -> None:
        chunks.append(hidden[0].clone())

    return keep


def _resolved(hook: LayerHook) -> str | None:
    key = hook.prompt_key
    return key() if callable(key) else key


def prompt_key(row: Row) -> tuple[Any, frozenset[Tap]] | None:
    """``row``'s prefix cache key (its adapter and what its writes add) and the taps its reads need;
    None when one of its hooks must see or change every prompt position itself."""
    writes, taps = [], set()
    for (layer, point), hooks in row.hooks.items():
        for hook in hooks:
            if hook.owner == TAP_OWNER:
                continue
            key = _resolved(hook)
            if key is None:
                return None
            if key == READS_PROMPT:
                taps.add((layer, point, hook.order))
            else:
                writes.append((layer, point, hook.order, key))
    return (row.adapter, tuple(sorted(writes))), frozenset(taps)


def choose_rows_or_alone(
    stacked: torch.Tensor | None, logits: Sequence[torch.Tensor], rows: Sequence[Row]
) -> list[int | Exception]:
    """Each row's token drawn from its logits (``stacked``: the same, as one tensor, or None when
    a processor changed their shape or dtype), or the exception its draw raised."""
    params, generators = [row.params for row in rows], [row.generator for row in rows]
    if stacked is not None:
        return choose_rows(stacked, params, generators)
    drawn: list[int | Exception] = []
    for own, row in zip(logits, rows, strict=True):
        try:
            drawn.append(choose(own, row.params, row.generator))
        except Exception as exc:
            drawn.append(exc)
    return drawn


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """``tensor`` padded with zeros on the left of its sequence dimension (-2 for a cache, -1 for a mask)."""
    dim = -1 if tensor.dim() == 2 else -2
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def batchable_model(model: Any) -> str | None:
    """Why ``model`` cannot be batched here (None: it can).

    The batch's cache is plain per-layer keys and values, left-padded; sliding-window
    and hybrid (recurrent, convolutional) caches are not laid out that way.
    """
    try:
        cache = transformers.DynamicCache(config=model.config)
    except Exception as exc:
        return f"no dynamic cache for this model ({type(exc).__name__})"
    kinds = {type(layer).__name__ for layer in cache.layers}
    if cache.layers and kinds != {"DynamicLayer"}:
        return f"its cache layers ({', '.join(sorted(kinds))}) are not plain key/value layers"
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    return None

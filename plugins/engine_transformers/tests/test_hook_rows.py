"""The row -> request map of a batched pass (``LayerHook.batched``, ``HookRow``), on stand-in layers.

A batched function is called once per point, order and pass, with the whole batch and
only the rows whose hooks carry it; what it writes changes only its rows; a failure
fails only its rows; per-row callbacks beside it still see their own row alone; and
the serial path calls it as a batch of one.
"""

from __future__ import annotations

import pytest
import torch

from millm_engine_transformers import hooks as layer_hooks
from millm_host.api import ORDER_READ_POST_STEERING, ORDER_READ_PRE_STEERING, ORDER_WRITE_STEERING, HookRow, LayerHook

D = 4


class PlusOne(torch.nn.Module):
    def forward(self, hidden_states):
        return hidden_states + 1


def layers():
    return torch.nn.ModuleList([PlusOne(), PlusOne()])


def run(modules, hidden):
    for module in modules:
        hidden = module(hidden)
    return hidden


def batch(rows=4, seq=5):
    return torch.arange(rows * seq * D, dtype=torch.float32).reshape(rows, seq, D)


def noop(hidden, start):
    return None


def test_a_batched_hook_is_called_once_a_pass_with_only_its_rows():
    calls = []

    def read(hidden, rows):
        calls.append((hidden.shape, [(r.index, r.start, r.skip, r.hook.state) for r in rows]))

    def hook(name):
        return LayerHook(0, "resid_post", noop, batched=read, state=name)

    seen_alone = []
    alone = LayerHook(0, "resid_post", lambda hidden, start: seen_alone.append((hidden.shape, start)))
    modules = layers()
    rows = [
        ({(0, "resid_post"): [hook("a")]}, 10, 2),
        ({(0, "resid_post"): [alone]}, 3, 0),
        ({(0, "resid_post"): [hook("c")]}, 0, 1),
        None,  # no hooks: not listed
    ]
    handles = layer_hooks.install_rows(modules, rows, lambda index, exc: pytest.fail(str(exc)))
    try:
        run(modules, batch())
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [((4, 5, D), [(0, 10, 2, "a"), (2, 0, 1, "c")])]
    assert seen_alone == [((1, 5, D), 3)]


def test_a_batched_write_changes_only_its_rows_and_later_hooks_see_it():
    def steer(hidden, rows):
        delta = torch.zeros(hidden.shape[0], 1, D)
        for row in rows:
            delta[row.index] = row.hook.state
        return hidden + delta

    before, after = {}, {}

    def reader(store):
        def read(hidden, rows):
            for row in rows:
                store[row.index] = hidden[row.index, row.skip :].clone()

        return read

    pre, post = reader(before), reader(after)
    point = (1, "resid_pre")

    def hooks(vector):
        chosen = [LayerHook(1, "resid_pre", noop, ORDER_READ_POST_STEERING, batched=post)]
        chosen.append(LayerHook(1, "resid_pre", noop, ORDER_READ_PRE_STEERING, batched=pre))
        if vector is not None:
            chosen.append(LayerHook(1, "resid_pre", noop, ORDER_WRITE_STEERING, batched=steer, state=vector))
        return {point: sorted(chosen, key=lambda h: h.order)}

    modules = layers()
    hidden = batch(rows=3)
    plain = run(modules, hidden)
    rows = [(hooks(torch.full((D,), 100.0)), 0, 0), (hooks(None), 0, 0), (hooks(torch.full((D,), -7.0)), 0, 0)]
    handles = layer_hooks.install_rows(modules, rows, lambda index, exc: pytest.fail(str(exc)))
    try:
        steered = run(modules, hidden)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(steered[1], plain[1])  # unsteered: untouched, bit for bit
    assert torch.equal(steered[0], plain[0] + 100)
    assert torch.equal(steered[2], plain[2] - 7)
    for index in range(3):  # the pre-steering read saw the layer's input; the post-steering read what it got
        assert torch.equal(before[index], hidden[index] + 1)
    assert torch.equal(after[0], hidden[0] + 101)
    assert torch.equal(after[1], hidden[1] + 1)


def test_a_batched_function_that_raises_fails_its_rows_only():
    def broken(hidden, rows):
        raise RuntimeError("broken on purpose")

    seen = []
    modules = layers()
    rows = [
        ({(0, "resid_pre"): [LayerHook(0, "resid_pre", noop, batched=broken)]}, 0, 0),
        ({(0, "resid_pre"): [LayerHook(0, "resid_pre", lambda hidden, start: seen.append(start))]}, 4, 0),
        ({(0, "resid_pre"): [LayerHook(0, "resid_pre", noop, batched=broken)]}, 0, 0),
    ]
    failed = []
    handles = layer_hooks.install_rows(modules, rows, lambda index, exc: failed.append((index, str(exc))))
    try:
        run(modules, batch(rows=3))
    finally:
        for handle in handles:
            handle.remove()
    assert failed == [(0, "broken on purpose"), (2, "broken on purpose")]
    assert seen == [4]


def test_the_serial_path_calls_a_batched_hook_as_a_batch_of_one():
    calls = []

    def read(hidden, rows):
        calls.append((hidden.shape, rows))

    hook = LayerHook(1, "resid_post", noop, batched=read)
    modules = layers()
    position = layer_hooks.Position()
    with layer_hooks.installed(modules, [hook], position):
        run(modules, batch(rows=1, seq=6))
        position.start = 6
        run(modules, batch(rows=1, seq=1))
    assert calls == [((1, 6, D), [HookRow(0, 0, 0, hook)]), ((1, 1, D), [HookRow(0, 6, 0, hook)])]

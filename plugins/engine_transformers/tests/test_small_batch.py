"""The tuned linear layers (``small_batch``): the same products as ``F.linear`` to float32 rounding,
for every row count, and only where the load's timing chose them."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from millm_engine_transformers import small_batch


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_the_column_form_is_the_same_product(rows, bias):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(64, 300, bias=bias)
    x = torch.randn(rows, 1, 64)
    want = F.linear(x, layer.weight, layer.bias)
    got = small_batch.columns_product(layer.weight, layer.bias, x, rows)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_tuned_model_keeps_its_layers_and_answers(monkeypatch):
    """Every layer stays an ``nn.Linear`` (peft and deepcopy see one); a layer whose shape won a row
    count computes it as columns, the others as before; the logits agree to rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 16))
    reference = copy.deepcopy(model)
    wins = {(2048, 32): frozenset({2, 3}), (16, 2048): frozenset()}
    monkeypatch.setattr(small_batch, "faster_as_columns", lambda weight, max_rows: wins[tuple(weight.shape)])
    chosen = small_batch.tune(model, max_rows=4)
    assert chosen == wins
    first, last = model[0], model[2]
    assert type(first) is small_batch.SmallBatchLinear and first.columns == {2, 3}
    assert type(last) is torch.nn.Linear  # won nothing: untouched
    assert isinstance(first, torch.nn.Linear) and isinstance(copy.deepcopy(model)[0], small_batch.SmallBatchLinear)
    calls = []
    real = small_batch.columns_product
    monkeypatch.setattr(small_batch, "columns_product", lambda *a: calls.append(a[-1]) or real(*a))
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
    assert calls == [2, 3]
    assert "2048x32: rows [2, 3] as columns" in list(small_batch.describe(chosen))


def test_the_timing_chooses_a_clear_win_only(monkeypatch):
    """A form is taken only when it ran in under ``MARGIN`` of the other's time."""
    weight = torch.randn(8, 8)
    times = iter([1.0, 0.5, 1.0, 0.9])  # rows 1: columns twice as fast; rows 2: 10 % faster (noise)
    monkeypatch.setattr(small_batch, "_median_s", lambda fn: next(times))
    assert small_batch.faster_as_columns(weight, max_rows=2) == {1}


def test_only_float32_cpu_layers_are_tuned():
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16)]
    assert [small_batch._tunable(layer) for layer in layers] == [True, False]


def test_the_choice_is_kept_per_machine(monkeypatch, tmp_path):
    """A later load on the machine reads what the first timed (no timing, the same choice); another
    machine (CPU, torch or threads) times its own and both are kept."""
    kept = tmp_path / "cache" / "small-batch.json"
    timed = []

    def timing(weight, max_rows):
        timed.append(tuple(weight.shape))
        return frozenset({2}) if weight.shape[0] > 16 else frozenset()

    def model():
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 16))

    monkeypatch.setattr(small_batch, "faster_as_columns", timing)
    first = small_batch.tune(model(), max_rows=4, kept=kept)
    assert sorted(timed) == [(16, 64), (64, 32)]
    again = model()
    assert small_batch.tune(again, max_rows=4, kept=kept) == first and len(timed) == 2
    assert type(again[0]) is small_batch.SmallBatchLinear and again[0].columns == {2}
    monkeypatch.setattr(small_batch, "machine_key", lambda: "another CPU")
    small_batch.tune(model(), max_rows=4, kept=kept)
    assert len(timed) == 4 and len(json.loads(kept.read_text())) == 2


@pytest.mark.parametrize("text", ['{"half', "[1, 2]", '{"MACHINE": {"8x8": "not rows"}}', '{"MACHINE": [3]}'])
def test_a_torn_or_foreign_file_of_choices_is_timed_again(monkeypatch, tmp_path, text):
    kept = tmp_path / "small-batch.json"
    kept.write_text(text.replace("MACHINE", f"{small_batch.machine_key()} rows 4"))
    monkeypatch.setattr(small_batch, "faster_as_columns", lambda weight, max_rows: frozenset({3}))
    assert small_batch.tune(torch.nn.Linear(8, 8), max_rows=4, kept=kept) == {(8, 8): frozenset({3})}
    assert json.loads(kept.read_text())[f"{small_batch.machine_key()} rows 4"] == {"8x8": [3]}

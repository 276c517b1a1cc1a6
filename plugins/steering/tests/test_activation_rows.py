"""``read_rows``: the ``return_sae_activations`` reader as a batched hook, without a server.

Each reader in a batched pass records what it records alone (the per-row callback on
its own row, its padding cut off), and the whole pass makes one device-to-host copy.
"""

from __future__ import annotations

import pytest
import torch

from millm_host.api import HookRow
from millm_saelens import describe
from millm_saelens.testing import write_sae
from millm_steering import sae as sae_weights
from millm_steering.activations import ActivationReader, ActivationsRequest, read_rows
from millm_steering.state import Attachment

D_IN = 16


@pytest.fixture(scope="module")
def saes(tmp_path_factory):
    root = tmp_path_factory.mktemp("saes")
    loaded = []
    for name, seed in (("a", 1), ("b", 2)):
        directory = write_sae(root / name, d_in=D_IN, d_sae=40, layer=0, seed=seed)
        loaded.append(sae_weights.load(name, directory, describe(directory), torch.device("cpu")))
    return loaded


def reader(sae, positions, features=None, top_k=5, prompt_len=4) -> ActivationReader:
    request = ActivationsRequest(sae.sae_id, 0, features, top_k, positions, "post_steering")
    return ActivationReader(Attachment(sae, 0, "resid_post"), request, prompt_len)


def kinds(saes):
    """Readers of every kind: both SAEs, each positions kind, a feature restriction, another top_k."""
    a, b = saes
    return [
        lambda: reader(a, "all"),
        lambda: reader(a, "last"),
        lambda: reader(b, "prompt"),
        lambda: reader(a, "completion", features=(1, 5, 9, 33), prompt_len=1),
        lambda: reader(b, (2, 6), top_k=3),
        lambda: reader(a, "all", top_k=2),
    ]


def read_alone(one: ActivationReader, hidden, start: int) -> None:
    """The reader's own row read alone, the per-row way: its window, ``top_features``, records."""
    lo, hi = one._window(start, start + hidden.shape[1])
    if lo < hi:
        tops = one.attachment.sae.top_features(hidden[0, lo - start : hi - start], one._candidates, one.request.top_k)
        one._record(lo, tops)


def test_a_batched_pass_records_what_each_row_records_alone(saes, monkeypatch):
    torch.manual_seed(0)
    makers = kinds(saes)
    # A prefill chunk (rows left-padded: skip columns before their first real one), then a decode step.
    passes = [
        (torch.randn(len(makers), 5, D_IN), [0] * len(makers), [0, 0, 2, 4, 1, 0]),
        (torch.randn(len(makers), 1, D_IN), [5, 5, 3, 1, 4, 5], [0] * len(makers)),
    ]
    alone = [make() for make in makers]
    together = [make() for make in makers]
    copies = []
    tolist = torch.Tensor.tolist

    def counted(self):
        copies.append(tuple(self.shape))
        return tolist(self)

    for hidden, starts, skips in passes:
        for index, one in enumerate(alone):
            read_alone(one, hidden[index : index + 1, skips[index] :], starts[index])
        rows = [HookRow(i, starts[i], skips[i], r.hook()) for i, r in enumerate(together)]
        monkeypatch.setattr(torch.Tensor, "tolist", counted)
        read_rows(hidden, rows)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    assert len(copies) == len(passes)  # one copy per pass for every row
    for one, batched in zip(alone, together, strict=True):
        assert sorted(one.records) == sorted(batched.records) and one.records
        for position, top in one.records.items():
            got = batched.records[position]
            assert [i for i, _ in got] == [i for i, _ in top]
            assert [v for _, v in got] == pytest.approx([v for _, v in top], abs=1e-5)


def test_rows_with_nothing_to_read_cost_no_copy(saes, monkeypatch):
    prompt_only = reader(saes[0], "prompt", prompt_len=3)
    copies = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: copies.append(1) or tolist(self))
    read_rows(torch.randn(2, 1, D_IN), [HookRow(1, 7, 0, prompt_only.hook())])  # a decode step past the prompt
    assert copies == [] and prompt_only.records == {}


def test_the_reader_hook_is_batched_and_its_callback_reads_alone(saes):
    one = reader(saes[0], "all")
    hook = one.hook()
    assert hook.batched is read_rows and hook.state is one and one.hook() is hook
    hidden = torch.randn(1, 3, D_IN)
    hook.callback(hidden, 0)
    assert sorted(one.records) == [0, 1, 2]
    # The same features, their values up to the rounding of a [3, d] product against a [1, d] one.
    alone = saes[0].top_features(hidden[0, 1:2], None, 5)[0]
    assert [i for i, _ in one.records[1]] == [i for i, _ in alone]
    assert [v for _, v in one.records[1]] == pytest.approx([v for _, v in alone], abs=1e-5)

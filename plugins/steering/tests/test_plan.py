"""A request's write hooks: frozen sets keep their values, live ones follow the operator."""

from __future__ import annotations

import numpy as np
import torch

from millm_saelens import describe
from millm_saelens.testing import write_sae
from millm_steering import sae as sae_weights
from millm_steering.hashing import applied_set
from millm_steering.intensity import Dialing, Limits
from millm_steering.plan import Plan
from millm_steering.resolve import Entry, Served, serve
from millm_steering.state import Attachment, SteeringState


def setup(tmp_path):
    directory = write_sae(tmp_path / "sae", d_in=8, d_sae=16, layer=0)
    loaded = sae_weights.load("s", directory, describe(directory), torch.device("cpu"))
    state = SteeringState()
    state.model_loaded("load-1")
    state.attach(Attachment(loaded, 0, "resid_post"), "load-1")
    return state, loaded


def test_a_live_plan_follows_the_state_and_a_frozen_one_does_not(tmp_path):
    state, loaded = setup(tmp_path)
    key = ("s", 0)
    state.set_manual(key, ((1, 2.0),))
    snap = state.snapshot()
    plain = Dialing(None, Limits())
    live = Plan(state, snap, serve(snap, plain), torch.float32, lambda s: serve(s, plain))
    frozen = Plan(state, snap, Served([Entry("inline", snap.attachments[key], applied_set([(3, 1.0)]))]), torch.float32)
    (live_hook,), (frozen_hook,) = live.hooks(), frozen.hooks()
    hidden = torch.zeros(1, 2, 8)
    w_dec = loaded.W_dec
    assert torch.equal(live_hook.callback(hidden, 0), (2.0 * w_dec[1]).expand(1, 2, 8))
    assert not live.changed()

    state.set_manual(key, ((1, -4.0), (2, 1.0)))
    expected = (-4.0 * w_dec[1] + w_dec[2]).expand(1, 2, 8)
    assert torch.allclose(live_hook.callback(hidden, 2), expected)
    assert torch.equal(frozen_hook.callback(hidden, 2), w_dec[3].expand(1, 2, 8))
    assert live.changed() and frozen.changed()
    assert live.applied()[0].applied.values == {1: -4.0, 2: 1.0}
    assert frozen.applied()[0].applied.values == {3: 1.0}

    state.detach([key])  # the operator detaches mid-request: the live hook stops adding
    assert live_hook.callback(hidden, 3) is None and live.applied() == []
    np.testing.assert_array_equal(frozen_hook.callback(hidden, 3).numpy(), w_dec[3].expand(1, 2, 8).numpy())


def test_unloading_drops_attachments_and_refuses_a_late_attach(tmp_path):
    state, loaded = setup(tmp_path)
    epoch = state.epoch
    state.model_unloading()
    assert state.snapshot().attachments == {} and state.epoch == epoch + 1
    assert state.attach(Attachment(loaded, 0, "resid_post"), "load-1") is None

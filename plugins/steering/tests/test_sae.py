"""SAELens directories: checking them, and encoding against a numpy reference of FORMATS.md's rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from millm_saelens import SAEUnreadable, describe
from millm_saelens.testing import reference_encode, write_sae
from millm_steering import sae as sae_weights


@pytest.mark.parametrize(
    "cfg",
    [
        {"architecture": "standard"},
        {"architecture": "standard", "apply_b_dec_to_input": True},
        {"architecture": "jumprelu"},
        {"architecture": "topk", "k": 5},
    ],
)
def test_encode_matches_the_reference(tmp_path, cfg):
    directory = write_sae(tmp_path / "sae", d_in=16, d_sae=40, layer=3, seed=7, **cfg)
    config = describe(directory)
    assert (config.layer, config.point) == (3, "resid_post")
    loaded = sae_weights.load("s", directory, config, torch.device("cpu"))
    weights = load_file(str(directory / "sae_weights.safetensors"))
    x = np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32)
    got = loaded.encode(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference_encode(x.astype(np.float64), weights, {**cfg}), atol=1e-5)
    top = loaded.top_features(torch.from_numpy(x), loaded.candidates([1, 2, 3, 30]), 2)
    for row, found in zip(reference_encode(x.astype(np.float64), weights, cfg), top, strict=True):
        values = sorted((row[i] for i in (1, 2, 3, 30) if row[i] != 0), reverse=True)[:2]
        np.testing.assert_allclose([v for _, v in found], values, atol=1e-5)


def test_steering_vector_is_the_weighted_sum_of_decoder_rows(tmp_path):
    directory = write_sae(tmp_path / "sae", d_in=16, d_sae=40, layer=0)
    loaded = sae_weights.load("s", directory, describe(directory), torch.device("cpu"))
    w_dec = load_file(str(directory / "sae_weights.safetensors"))["W_dec"].astype(np.float64)
    got = loaded.steering_vector({3: 2.5, 39: -200.0}, torch.float32).numpy()
    np.testing.assert_allclose(got, 2.5 * w_dec[3] - 200.0 * w_dec[39], atol=1e-4)
    assert loaded.steering_vector({3: 1.0}, torch.bfloat16).dtype == torch.bfloat16


def _broken(tmp_path, change):
    directory = write_sae(tmp_path / "sae", d_in=8, d_sae=12, layer=1)
    cfg = json.loads((directory / "cfg.json").read_text())
    change(directory, cfg)
    (directory / "cfg.json").write_text(json.dumps(cfg))
    return directory


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d, c: c.update(hook_name="blocks.1.hook_mlp_out"), "hook_name"),
        (lambda d, c: c.update(architecture="gated"), "architecture"),
        (lambda d, c: c.update(architecture="topk"), "k must be"),
        (lambda d, c: c.update(d_sae=13), "W_enc has shape"),
        (lambda d, c: c.update(d_in=True), "d_in must be"),
        (lambda d, c: c.update(apply_b_dec_to_input="yes"), "apply_b_dec_to_input"),
        (lambda d, c: (d / "sae_weights.safetensors").unlink(), "no sae_weights.safetensors"),
        (lambda d, c: (d / "sae_weights.safetensors").write_bytes(b"not safetensors"), "cannot be read"),
        (lambda d, c: c.update(architecture="jumprelu"), "no tensor threshold"),
    ],
)
def test_unusable_directories_are_refused(tmp_path, change, says):
    with pytest.raises(SAEUnreadable) as err:
        describe(_broken(tmp_path, change))
    assert says in err.value.message
    assert err.value.status == 400


def test_a_missing_config_is_refused(tmp_path):
    with pytest.raises(SAEUnreadable, match="no cfg.json"):
        describe(tmp_path)
    with pytest.raises(SAEUnreadable, match="not a directory"):
        describe(tmp_path / "absent")

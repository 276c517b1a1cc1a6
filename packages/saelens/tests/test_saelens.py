"""The shared SAELens reader and encoder: every architecture against a numpy reference of FORMATS.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from millm_saelens import SAEUnreadable, describe, read_config
from millm_saelens.testing import reference_encode, write_sae
from millm_saelens.weights import load, load_tensors

ARCHITECTURES = [
    {"architecture": "standard"},
    {"architecture": "standard", "apply_b_dec_to_input": True},
    {"architecture": "jumprelu", "apply_b_dec_to_input": True},
    {"architecture": "topk", "k": 5},
]


@pytest.mark.parametrize("cfg", ARCHITECTURES)
def test_every_feature_and_a_chosen_few_encode_as_the_reference(tmp_path, cfg):
    directory = write_sae(tmp_path / "sae", d_in=16, d_sae=40, layer=3, seed=7, **cfg)
    sae = load(directory, describe(directory), "cpu")
    weights = {k: v.astype(np.float64) for k, v in load_file(str(directory / "sae_weights.safetensors")).items()}
    x = np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32)
    expected = reference_encode(x.astype(np.float64), weights, cfg)
    np.testing.assert_allclose(sae.encode(torch.from_numpy(x)).numpy(), expected, atol=1e-5)
    features = [39, 0, 7, 7, 21]  # any order, repeats kept: the probe's own feature list
    chosen = sae.encoder(features).encode(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(chosen, expected[:, features], atol=1e-5)


def test_the_config_is_read_and_checked(tmp_path):
    directory = write_sae(tmp_path / "sae", d_in=16, d_sae=40, layer=2, point="pre", architecture="topk", k=3)
    cfg = read_config(directory)
    assert (cfg.d_in, cfg.d_sae, cfg.layer, cfg.point, cfg.k) == (16, 40, 2, "resid_pre", 3)
    with pytest.raises(SAEUnreadable, match="no cfg.json"):
        read_config(tmp_path)


def test_weights_that_do_not_match_the_config_are_refused(tmp_path):
    directory = write_sae(tmp_path / "sae", d_in=16, d_sae=40, layer=0)
    wider = write_sae(tmp_path / "wider", d_in=16, d_sae=41, layer=0)
    cfg = read_config(directory)
    (directory / "sae_weights.safetensors").write_bytes((wider / "sae_weights.safetensors").read_bytes())
    with pytest.raises(SAEUnreadable, match="W_enc is missing or changed shape since cfg.json was read"):
        load_tensors(directory, cfg, "cpu")
    with pytest.raises(SAEUnreadable, match="changed shape since registration"):
        load_tensors(directory, cfg, "cpu", since="registration")

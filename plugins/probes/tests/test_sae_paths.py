"""A stored probe's SAE id can never lead its encoder out of PROBE_SAE_DIR."""

from __future__ import annotations

import pytest

from millm_probes.scoring.sae import SaeUnavailable, load_encoder, sae_folder


def test_an_sae_id_inside_the_directory_resolves(tmp_path):
    (tmp_path / "saes" / "mine").mkdir(parents=True)
    assert sae_folder(str(tmp_path / "saes"), "mine") == (tmp_path / "saes" / "mine").resolve()


@pytest.mark.parametrize("sae_id", ["../outside", "/abs/outside", "..", ".", "a/../../outside", "x" * 300])
def test_an_sae_id_that_leaves_the_directory_is_unavailable(tmp_path, sae_id):
    (tmp_path / "saes").mkdir()
    (tmp_path / "outside").mkdir()
    with pytest.raises(SaeUnavailable):
        load_encoder(str(tmp_path / "saes"), sae_id, [1], 64, "cpu")


def test_a_link_out_of_the_directory_is_unavailable(tmp_path):
    (tmp_path / "saes").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "saes" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(SaeUnavailable, match="PROBE_SAE_DIR"):
        sae_folder(str(tmp_path / "saes"), "link")

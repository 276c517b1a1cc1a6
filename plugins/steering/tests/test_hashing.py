"""The steering-set hash: the spec's test vectors TV-1 to TV-4 and its reference function."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, strategies as st

from millm_steering.hashing import applied_set, canonical_form, steering_hash

LFM = "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11"
GEMMA = "jbloom--gemma-2-2b-res-jb--layer_20--width_16k--average_l0_71"

VECTORS = [
    (
        "TV-1",
        LFM,
        [(1234, 8.0)],
        f"millm.steering-set/v1\nsae={LFM}\n1234:4020000000000000\n",
        "sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105",
        0,
    ),
    (
        "TV-2",
        LFM,
        [(1234, -8.0)],
        f"millm.steering-set/v1\nsae={LFM}\n1234:c020000000000000\n",
        "sha256:cc6c48faa720096e5c65fc1b2afab1b9b87659fb4465f20db421a2ed7fed78a7",
        0,
    ),
    (
        "TV-3",
        GEMMA,
        [(77, -2.5), (5, 0.1), (900, 0.0), (12, -0.0)],
        f"millm.steering-set/v1\nsae={GEMMA}\n5:3fb999999999999a\n77:c004000000000000\n",
        "sha256:b843912201c5c18f872976e35af288e5f484d81e31a03a1dc16c3b9dbd82e710",
        0,
    ),
    (
        "TV-4",
        GEMMA,
        [(3, 500.0)],
        f"millm.steering-set/v1\nsae={GEMMA}\n3:4069000000000000\n",
        "sha256:3f51779e6e33ee248acf6f520cb9475b4ef62f68275060bb69d2e228033b78df",
        1,
    ),
]


@pytest.mark.parametrize(
    ("name", "sae_id", "features", "canonical", "digest", "clamped"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_vectors(name, sae_id, features, canonical, digest, clamped):
    applied = applied_set(features)
    assert canonical_form(sae_id, applied.values) == canonical.encode()
    assert steering_hash(sae_id, applied.values) == digest
    assert applied.clamped == clamped


def reference_hash(sae_id, features):
    """The spec's own reference function, verbatim."""
    applied = {i: max(-200.0, min(200.0, float(s))) for i, s in features}
    applied = {i: s for i, s in applied.items() if s != 0.0}
    lines = ["millm.steering-set/v1", f"sae={sae_id}"]
    lines += [f"{i}:{struct.pack('>d', applied[i]).hex()}" for i in sorted(applied)]
    return "sha256:" + hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


@given(st.dictionaries(st.integers(0, 10**6), st.floats(allow_nan=False, allow_infinity=False), max_size=20))
def test_matches_the_reference_function(features):
    items = list(features.items())
    assert steering_hash(GEMMA, applied_set(items).values) == reference_hash(GEMMA, items)


def test_scale_applies_before_the_clamp():
    applied = applied_set([(1, 150.0), (2, -0.0), (3, 1.0)], scale=2.0)
    assert applied.values == {1: 200.0, 3: 2.0}
    assert applied.clamped == 1
    assert applied_set([(1, 150.0)], scale=0.0).values == {}

"""Live probes over a prompt the prefix cache reused: their scores are a cold run's (1e-4).

The second request reuses all but the last token of the first's prompt
(``cached_tokens``); the probes' prompt and whole-request windows still read every
position, from the residuals the first request's reads saw (replayed), so each
result scores what the cold request scored, over as many tokens.
"""

from __future__ import annotations

import pytest

from millm_host.testing import chat as post_chat

WINDOWS = ["all", "prompt", "response"]
# The system prompt is this test's own, so the first request finds nothing cached: other tests on this
# server share SmolLM2's default system prompt, a whole cache block.
CHAT = [
    {"role": "system", "content": "Notes for the prefix cache's probe test."},
    {"role": "user", "content": "Describe, at length, the habits of the keeper of a distant lighthouse. " * 3},
]


@pytest.fixture(scope="module")
def armed(probes_server, lab, identity, helpers):
    docs = [
        lab.definition(identity, name="cache-max", behaviour="cached", rule="max", windows=WINDOWS),
        lab.definition(identity, name="cache-mean", layer=2, rule="mean", windows=WINDOWS, seed=5),
    ]
    with probes_server.http() as http, helpers.armed(http, docs) as ids:
        yield ids


def test_scores_over_reused_positions_equal_the_cold_run(probes_server, armed, model_id):
    with probes_server.http() as http:
        bodies = []
        for _ in range(2):
            response = post_chat(http, model_id, messages=CHAT, max_tokens=6, temperature=0)
            assert response.status_code == 200, response.text
            bodies.append(response.json())
    cold, warm = bodies
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == cold["usage"]["prompt_tokens"] - 1
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    first, second = cold["millm_probe_verdicts"], warm["millm_probe_verdicts"]
    assert [(r["probe_id"], r["window"]) for r in first] == [(r["probe_id"], r["window"]) for r in second]
    assert {r["probe_id"] for r in first} == set(armed) and all(r["outcome"] == "completed" for r in second)
    for one, two in zip(first, second, strict=True):
        assert one["n_scored_tokens"] == two["n_scored_tokens"], one["window"]
        assert two["score"] == pytest.approx(one["score"], abs=1e-4), one["window"]

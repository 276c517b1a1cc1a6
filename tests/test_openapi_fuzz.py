"""schemathesis against the server's own ``/openapi.json``: every check, and never a 5xx (issue 11 §3b).

The document lists every route of the host and of each installed plugin
(``tests/test_openapi_document.py`` holds it to the app's router), so every route
is fuzzed: the OpenAI endpoints and the management ones (models, steering,
profiles, SAEs, probes); Browse Hub's, which depend on the Hub answering, in
``plugins/probes/tests/test_hub.py`` against a local one. Each route documents only the statuses it can return,
so ``status_code_conformance`` catches a refusal the document does not list.

Every built-in check runs but ``positive_data_acceptance``: the document cannot
state rules across fields (``stream_options`` needs ``stream: true``; a score
input carries exactly one of ``token_ids``, ``messages`` or ``text``), so a
request valid by the schema alone may rightly be a 400. Examples are bounded and
derandomized (``MILLM_FUZZ_EXAMPLES`` per operation; ``MILLM_FUZZ_SEED`` set to
anything explores others), so a run is the same run every time.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

checks.load_all_checks()
CHECKS = [check for check in checks.CHECKS.get_all() if check is not checks.positive_data_acceptance]


@pytest.fixture(scope="module")
def openapi(tiny_server):
    return schemathesis.openapi.from_url(f"{tiny_server.base_url}/openapi.json")


# Browse Hub's routes answer 502/504 when the Hub is down, and huggingface.co is out of reach here:
# plugins/probes/tests/test_hub.py fuzzes them the same way against a working local Hub.
schema = schemathesis.pytest.from_fixture("openapi").exclude(path_regex="^/api/probes/hub/")


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("MILLM_FUZZ_EXAMPLES", "25")),
    deadline=None,
    database=None,
    derandomize="MILLM_FUZZ_SEED" not in os.environ,
    suppress_health_check=list(HealthCheck),
)
def test_the_documented_api_never_answers_5xx(case):
    case.call_and_validate(checks=CHECKS, timeout=60)

"""A PII rule set the tests share: cards (Luhn), IBANs (mod97), emails, and a word list near a cue."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from millm_host.testing import databases

CARD = "4111 1111 1111 1111"  # passes Luhn; the well-known test card the set's veto removes from datasets
REAL_CARD = "5500 0000 0000 0004"  # passes Luhn; no test card
BAD_CARD = "4111 1111 1111 1112"
IBAN = "DE89 3704 0044 0532 0130 00"  # passes mod97
BAD_IBAN = "DE89 3704 0044 0532 0130 01"

PII: dict[str, Any] = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "pii-basic",
    "version": "2",
    "signals": {
        "card": {"kind": "pattern", "pattern": r"\b(?:\d[ -]?){13,19}\b"},
        "card_ok": {"kind": "validator", "validator": "luhn", "span_of": "card"},
        "test_card": {"kind": "pattern", "pattern": r"\b4111(?:[ -]?1111){3}\b"},
        "iban": {"kind": "pattern", "pattern": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b"},
        "iban_ok": {"kind": "validator", "validator": "mod97", "span_of": "iban"},
        "iban_len": {
            "kind": "validator",
            "validator": "length_prefix_table",
            "span_of": "iban",
            "table": {"DE": 22, "FR": 27},
        },
        "email": {"kind": "pattern", "pattern": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"},
        "ssn": {"kind": "pattern", "pattern": r"\b\d{3}-\d{2}-\d{4}\b"},
        "ssn_near": {"kind": "proximity", "anchor": "ssn", "cues": ["ssn", "social security"], "within_chars": 40},
        "threat": {"kind": "wordlist", "words": {"kill": 2.0, "bomb": 3.0}, "min_weight": 3.0},
    },
    "expressions": {
        "pii": {"any": ["card_ok", "iban_ok", "email", "ssn_near"]},
        "iban_valid": {"all": ["iban_ok", "iban_len"]},
        "card_and_email": {"within_n": {"a": "card_ok", "b": "email", "n": 30}},
        "threat_words": {"signal": "threat"},
        "no_threat": {"not": "threat"},
    },
    # Datasets only (never applied to served rule results nor to a case's expect): a test card is no PII.
    "vetoes": [{"when": "test_card", "removes": ["card"]}],
    "outputs": [
        {"column": "has_pii", "use": "fired", "of": "pii"},
        {"column": "pii_count", "use": "count", "of": "pii"},
        {"column": "cards", "use": "field", "of": "card_ok"},
        {"column": "email_text", "use": "field", "of": "email"},
    ],
    "cases": [
        {
            "text": f"card {CARD}",
            "expect": {"pii": True, "card_ok": 1},  # as served: vetoes are not applied here
            "outputs": {"has_pii": False, "pii_count": 0, "cards": []},  # the dataset row: the veto removed it
        },
        {
            "text": f"cards {CARD} and {REAL_CARD}, mail a@b.example",
            "expect": {"pii": {"fires": True, "count": 3}},
            "outputs": {"has_pii": True, "pii_count": 2, "cards": [REAL_CARD], "email_text": ["a@b.example"]},
        },
        {"text": f"card {BAD_CARD}", "expect": {"pii": False, "card": 1, "card_ok": 0}},
        {"text": f"pay to {IBAN} please", "expect": {"iban_valid": True}},
        {"text": "my ssn is 123-45-6789", "expect": {"pii": True, "ssn_near": {"fires": True, "count": 1}}},
        {"text": "call 123-45-6789", "expect": {"ssn_near": False}},
        {"text": "kill the bomb", "expect": {"threat_words": {"fires": True, "count": 2}, "no_threat": False}},
    ],
}


def pii(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(PII)
    doc.update(changes)
    return doc


@pytest.fixture(scope="session")
def docs() -> SimpleNamespace:
    """The shared documents and texts (test modules are not importable under --import-mode=importlib)."""
    return SimpleNamespace(
        PII=PII, pii=pii, CARD=CARD, REAL_CARD=REAL_CARD, BAD_CARD=BAD_CARD, IBAN=IBAN, BAD_IBAN=BAD_IBAN
    )


#: Until ``pip install -r requirements.txt`` installs this plugin (entry point ``rulesets``), the tests
#: load it by module; once installed, the entry point wins and this entry is skipped.
MODULE_ENTRY = "rulesets=millm_rulesets.plugin"


def with_rulesets(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` whose ``MILLM_PLUGIN_MODULES`` names this plugin besides the test-only plugins."""
    from millm_host.testing.extra_plugins import module_entries

    out = dict(env or {})
    # a generous rule budget: on a loaded CI machine the default 20 ms can run out (rule_timeout) on a
    # first chat; the budget itself is tested in test_budget.py
    out.setdefault("RULE_TIME_BUDGET_MS", "10000")
    named = [m for m in out.get("MILLM_PLUGIN_MODULES", "").split(",") if m.strip()]
    out["MILLM_PLUGIN_MODULES"] = ",".join([*named, *module_entries(), MODULE_ENTRY])
    return out


@pytest.fixture(scope="session")
def rulesets_env():
    return with_rulesets


def _probes_test_helpers() -> Any:
    """The probes plugin's test conftest (its ``Lab`` builds probes that pass parity on a tiny model).

    Loaded by path: test modules are not importable under ``--import-mode=importlib``.
    """
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "probes" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("millm_probes_tests_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_probes = _probes_test_helpers()
probe_model_dir = _probes.probe_model_dir
lab = _probes.lab


def pytest_collection_modifyitems(items):
    # The tests that store rule sets or results run on PostgreSQL too (pytest -m storage); the document
    # parser, the time budget and the code sandbox do not depend on the database.
    databases.mark_storage(items, Path(__file__).parent, only=STORED)


STORED = frozenset(
    {
        "test_live.py",
        "test_live_code.py",
        "test_long_names.py",
        "test_routes.py",
        "test_rules_server.py",
        "test_rule_sets_everywhere.py",
        "test_signals_server.py",
    }
)

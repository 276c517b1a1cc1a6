"""The refusals of the rule-set API, in OpenAI's error shape; ``param`` is the JSON pointer into the document."""

from __future__ import annotations

from millm_host.api import MillmError


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer (``~`` and ``/`` escaped in each part)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class InvalidRuleSet(MillmError):
    status, code = 400, "invalid_rule_set"


class PatternRefused(MillmError):
    """RE2 refused the pattern: back-references and look-around are not in the linear-time dialect."""

    status, code = 400, "rule_pattern_refused"


class CodeRuleInWithinN(MillmError):
    status, code = 400, "code_rule_in_within_n"


class CodeRulePositionsNeeded(MillmError):
    status, code = 400, "code_rule_positions_needed"


class CasesFailed(MillmError):
    status, code = 400, "rule_set_cases_failed"


class RuleSetNotFound(MillmError):
    status, code, type = 404, "rule_set_not_found", "not_found_error"


class RuleSetExists(MillmError):
    status, code = 409, "rule_set_exists"


class RuleSetAttached(MillmError):
    status, code = 409, "rule_set_attached"

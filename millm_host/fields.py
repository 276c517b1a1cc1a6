"""Every field is honoured, reported or refused.

Plugins claim the request fields they honour (``register_request_fields``). For a
request, the host walks the body and finds each location nothing claimed for its
endpoint and engine: an output-changing field (the spec's table) is refused with
``400 field_not_honoured``; anything else is reported in ``X-miLLM-Ignored-Fields``
(or refused under ``X-miLLM-Strict``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .engine import CAPABILITIES, EngineSpec
from .errors import FieldNotHonoured, InvalidParameter, UnusedFieldsRefused
from .headers import serialize_string_list

log = logging.getLogger("millm.fields")

ENDPOINTS = ("chat.completions", "completions", "embeddings", "tokenize", "detokenize")

#: Fields the spec's table lists as changing the output: refused, never ignored, where nothing honours
#: them, whether or not the plugin that honours them is installed (the light GGUF setup has no steering).
#: A plugin marks any others of its own with ``register(..., output_changing=True)``.
OUTPUT_CHANGING = frozenset(
    {
        "profile",
        "steering_intensity",
        "steering",
        "return_sae_activations",
        "logprobs",
        "top_logprobs",
        "allowed_token_ids",
        "return_tokens_as_token_ids",
        "response_format",
        "seed",
        "n",
        "max_completion_tokens",
        "dimensions",
        "pooling",
        "normalize",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "logit_bias",
        "scoring_precision",
        "extra_messages",
        "echo",
        "best_of",
        "suffix",
        "ignore_eos",
        "min_tokens",
        "prompt_logprobs",
    }
)

_MISSING = object()

#: OpenAI's fields that constrain or bias generation: a scoring request carrying one is refused
#: (scoring is never constrained). A plugin marks its own with ``register(..., scorable=False)``.
UNSCORABLE = frozenset(
    {
        "profile",
        "steering_intensity",
        "steering",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "logit_bias",
    }
)

#: Values that ask for nothing different from the default: accepted everywhere.
NO_CHANGE: Mapping[str, Any] = {
    "n": 1,
    "logprobs": False,
    "response_format": {"type": "text"},
    "tools": [],
    "tool_choice": "none",
    "parallel_tool_calls": True,
    "logit_bias": {},
    "pooling": "mean",
    "normalize": False,
    "scoring_precision": "native",
    "echo": False,
    "best_of": 1,
    "return_tokens_as_token_ids": False,
    "ignore_eos": False,
    "min_tokens": 0,
    "with_unsteered": False,
}


def is_no_change(name: str, value: Any) -> bool:
    """True for an explicit null or the spec's "no change" value of ``name``."""
    if value is None:
        return True
    expected = NO_CHANGE.get(name, _MISSING)
    return expected is not _MISSING and type(value) is type(expected) and value == expected


@dataclass(frozen=True)
class _Claim:
    pattern: str
    engines: frozenset[str] | None


class FieldRegistry:
    """The fields each endpoint honours, per engine."""

    def __init__(self, engines: Iterable[EngineSpec] = ()) -> None:
        self._engines = list(engines)
        self._claims: dict[str, list[_Claim]] = defaultdict(list)
        self._cache: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {}
        #: Fields refused, never ignored, wherever nothing claims them (every endpoint and engine).
        self.output_changing: set[str] = set(OUTPUT_CHANGING)
        #: Fields a scoring request is refused for carrying.
        self.unscorable: set[str] = set(UNSCORABLE)

    def register(
        self,
        endpoint: str,
        fields: Iterable[str],
        engines: Iterable[str] | None = None,
        requires: str | None = None,
        *,
        output_changing: bool = False,
        scorable: bool = True,
    ) -> None:
        """Claim ``fields`` (location patterns) on ``endpoint`` for ``engines`` (None: all), or for the
        engines that declare capability ``requires`` (``EngineSpec.capabilities``).

        ``output_changing``: the fields change the output, so wherever nothing claims them (another
        endpoint, an engine without the capability) they are refused rather than reported.
        ``scorable=False``: a scoring request carrying one is refused. Both hold for every endpoint and
        engine, whether or not any engine can honour the claim.
        """
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {ENDPOINTS}")
        if isinstance(fields, str):
            fields = [fields]
        fields = list(fields)
        if output_changing:
            self.output_changing.update(fields)
        if not scorable:
            self.unscorable.update(fields)
        if requires is not None:
            if requires not in CAPABILITIES:
                raise ValueError(f"unknown capability {requires!r}; expected one of {sorted(CAPABILITIES)}")
            capable = {spec.name for spec in self._engines if requires in spec.capabilities}
            engines = capable if engines is None else capable & set(engines)
        engine_set = frozenset(engines) if engines is not None else None
        for pattern in fields:
            self._claims[endpoint].append(_Claim(pattern, engine_set))
        self._cache.clear()

    def patterns(self, endpoint: str, engine: str) -> tuple[frozenset[str], frozenset[str]]:
        """(claimed patterns, prefixes that have claimed children) for an endpoint and engine."""
        key = (endpoint, engine)
        if key not in self._cache:
            claimed = frozenset(c.pattern for c in self._claims[endpoint] if c.engines is None or engine in c.engines)
            parents = set()
            for pattern in claimed:
                for i, ch in enumerate(pattern):
                    if ch in ".[":
                        parents.add(pattern[:i])
            self._cache[key] = (claimed, frozenset(parents))
        return self._cache[key]

    def unused(self, endpoint: str, engine: str, body: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
        """``(location, pattern, value)`` of every sent field nothing claims, in body order."""
        claimed, parents = self.patterns(endpoint, engine)
        found: list[tuple[str, str, Any]] = []

        def walk(obj: Mapping[str, Any], pattern: str, location: str) -> None:
            for key, value in obj.items():
                pat = f"{pattern}.{key}" if pattern else key
                loc = f"{location}.{key}" if location else key
                if pat not in claimed:
                    found.append((loc, pat, value))
                else:
                    descend(value, pat, loc)

        def descend(value: Any, pat: str, loc: str) -> None:
            if isinstance(value, dict) and pat in parents:
                walk(value, pat, loc)
            elif isinstance(value, list) and f"{pat}[]" in parents | claimed:
                for i, item in enumerate(value):
                    descend(item, f"{pat}[]", f"{loc}[{i}]")

        walk(body, "", "")
        return found


def check_fields(
    registry: FieldRegistry, endpoint: str, engine: str, body: Mapping[str, Any], strict: bool
) -> list[str]:
    """Refuse unhonoured output-changing fields; return the locations to report.

    Under ``strict`` any unused location is refused with ``unused_fields_refused``.
    """
    reported: list[str] = []
    refused: list[str] = []
    for location, pattern, value in registry.unused(endpoint, engine, body):
        if pattern in registry.output_changing:
            if not is_no_change(pattern, value):
                refused.append(location)
            continue
        reported.append(location)
    if refused:
        where = f"{endpoint} on the {engine} engine"
        raise FieldNotHonoured(f"{', '.join(refused)} cannot be honoured by {where} on this server", param=refused[0])
    if strict and reported:
        raise UnusedFieldsRefused(
            "X-miLLM-Strict refuses fields this request path does not use: " + ", ".join(reported),
            param=reported[0],
        )
    if reported:
        log.warning("request_fields_unused: %s", ", ".join(reported), extra={"locations": reported})
    return reported


def strict_mode(headers: Mapping[str, str]) -> bool:
    """Read ``X-miLLM-Strict``: true/1 refuse, false/0/absent report, anything else is a 400."""
    raw = headers.get("x-millm-strict")
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise InvalidParameter(f"X-miLLM-Strict must be true, 1, false or 0, not {raw!r}", param="X-miLLM-Strict")


def ignored_fields_header(locations: list[str], max_bytes: int) -> str:
    """``X-miLLM-Ignored-Fields``: an RFC 8941 list of strings within ``max_bytes``.

    Past the cap, the entries that do not fit are replaced by ``"+N more"``. Each
    location is percent-encoded (``headers.percent_encode``), so any field name is carried.
    """
    full = serialize_string_list(locations)
    if len(full) <= max_bytes:
        return full
    kept: list[str] = []
    for i, entry in enumerate(locations):
        more = len(locations) - i - 1
        candidate = serialize_string_list([*kept, entry, f"+{more} more"] if more else [*kept, entry])
        if len(candidate) > max_bytes:
            break
        kept.append(entry)
    return serialize_string_list([*kept, f"+{len(locations) - len(kept)} more"])

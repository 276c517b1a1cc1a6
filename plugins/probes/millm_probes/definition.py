"""``mi.probe.definition/v1``: parsing and checking a probe document.

The document itself is stored verbatim (re-export is lossless); this module only
decides whether it is a probe millm can serve and gives typed access to it.
Unknown top-level keys are kept and never change behaviour; the blocks that make
up the detector and the bar refuse keys they do not know, so a misspelt field is
an error rather than a silent default.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from millm_host.api import loc_to_param

from .errors import InvalidDefinition

FORMAT = "mi.probe.definition/v1"
RUNG_LANGUAGE = {
    0: "trained",
    1: "detects on held-out data",
    2: "detects on unseen tasks",
    3: "detects on unseen tasks, compared with a judge",
}

Window = Literal["all", "prompt", "response", "last_user", "reasoning", "answer"]
WINDOWS: tuple[str, ...] = get_args(Window)  # also the order results are listed in
NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Open(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ModelBlock(_Closed):
    hf_id: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    d_model: Positive
    n_layers: Positive
    chat_template_sha256: str | None = None


class ReadBlock(_Closed):
    layer: NonNegative
    hook_point: Literal["resid_pre", "resid_post"]


class SaeBlock(_Closed):
    sae_id: Annotated[str, Field(min_length=1)]
    feature_indices: Annotated[list[NonNegative], Field(min_length=1)]


class Head(_Closed):
    weights: Annotated[list[float], Field(min_length=1)]
    bias: float = 0.0
    norm_mean: list[float] | None = None
    norm_std: list[float] | None = None
    attention_query: list[float] | None = None


class Aggregation(_Closed):
    rule: Literal["mean", "max", "last", "attention", "topk_mean"]
    params: dict[str, Any] = Field(default_factory=dict)
    skip_template_prefix: bool = False


class LengthBand(_Closed):
    max_tokens: Positive
    threshold: float


class Decision(_Closed):
    """The bar: where a score is cut. Everything here may move by recalibration."""

    threshold: float | None = None
    target_fpr: float | None = None
    realised_fpr: float | None = None
    threshold_source: str | None = None
    calibration: Any = None
    windows: Annotated[list[Window], Field(min_length=1)] | None = None
    length_bands: list[LengthBand] | None = None

    @model_validator(mode="after")
    def _unique_windows(self) -> Decision:
        if self.windows is not None and len(set(self.windows)) != len(self.windows):
            raise ValueError("windows lists a window twice")
        return self


class Evidence(_Open):
    rung: Annotated[int, Field(ge=0, le=3)]
    acknowledgement: str | None = None
    provisional: bool = False


class TestVector(_Open):
    token_ids: Annotated[list[NonNegative], Field(min_length=1)]
    prompt_tokens: int | None = None
    messages: list[dict[str, Any]] | None = None
    score: float
    per_token: list[float] | None = None


class ParityBlock(_Open):
    tolerance: Annotated[float, Field(ge=0)] = 0.001


class IdentityBlock(_Open):
    algorithm: str
    detector_digest: str | None = None
    decision_digest: str | None = None


class Provenance(_Open):
    probe_id: str | None = None


class ProbeDefinition(_Open):
    """A parsed ``mi.probe.definition/v1`` document."""

    format: Literal["mi.probe.definition/v1"]
    provenance: Provenance = Field(default_factory=Provenance)
    name: Annotated[str, Field(min_length=1, max_length=200)]
    behaviour: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    version: str | int | None = None
    model: ModelBlock
    read: ReadBlock
    scope: Literal["all", "prompt", "response"]
    basis: Literal["residual", "sae"]
    sae: SaeBlock | None = None
    head: Head
    aggregation: Aggregation
    decision: Decision | None = None
    evidence: Evidence
    test_vectors: list[TestVector] = Field(default_factory=list)
    parity: ParityBlock = Field(default_factory=ParityBlock)
    identity: IdentityBlock | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ProbeDefinition:
        problems = consistency_problems(self)
        if problems:
            raise ValueError(problems[0])
        return self

    @property
    def rung_language(self) -> str:
        return RUNG_LANGUAGE[self.evidence.rung]


def consistency_problems(d: ProbeDefinition) -> list[str]:
    """What makes a well-typed document unservable, as ``"field: why"`` strings."""
    problems = []
    width = len(d.head.weights)
    if d.read.layer >= d.model.n_layers:
        problems.append(f"read.layer: layer {d.read.layer} does not exist in a {d.model.n_layers}-layer model")
    if d.basis == "residual":
        if d.sae is not None:
            problems.append("sae: a residual probe carries no sae block")
        if width != d.model.d_model:
            problems.append(f"head.weights: {width} weights for a residual of width {d.model.d_model}")
    else:
        if d.sae is None:
            problems.append("sae: an sae-basis probe needs an sae block")
        elif width != len(d.sae.feature_indices):
            problems.append(f"head.weights: {width} weights for {len(d.sae.feature_indices)} feature_indices")
    for name in ("norm_mean", "norm_std"):
        values = getattr(d.head, name)
        if values is not None and len(values) != width:
            problems.append(f"head.{name}: {len(values)} values for {width} weights")
    if d.head.norm_std is not None and any(v == 0 for v in d.head.norm_std):
        problems.append("head.norm_std: a standard deviation of 0")
    query = d.head.attention_query
    if d.aggregation.rule == "attention":
        if query is None:
            problems.append("head.attention_query: the attention rule needs a query")
        elif len(query) != d.model.d_model:
            problems.append(f"head.attention_query: {len(query)} values for a residual of width {d.model.d_model}")
    if d.aggregation.rule == "topk_mean":
        k = d.aggregation.params.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            problems.append("aggregation.params.k: topk_mean needs a positive integer k")
    for i, vector in enumerate(d.test_vectors):
        if not math.isfinite(vector.score):
            problems.append(f"test_vectors[{i}].score: not a finite number")
    return problems


def parse(document: Any) -> ProbeDefinition:
    """Check a document; a problem is a ``400 invalid_probe_definition`` naming its field."""
    if not isinstance(document, dict):
        raise InvalidDefinition("a probe definition is a JSON object", param="body")
    if document.get("format") != FORMAT:
        raise InvalidDefinition(f"format must be {FORMAT!r}, not {document.get('format')!r}", param="format")
    try:
        return ProbeDefinition.model_validate(document)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = loc_to_param(err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if param == "body" and ": " in message:
            param, _, message = message.partition(": ")
            raise InvalidDefinition(f"{param}: {message}", param=param) from None
        if err["type"] == "missing":
            raise InvalidDefinition(f"{param} is required", param=param) from None
        raise InvalidDefinition(f"{param}: {message}", param=param) from None

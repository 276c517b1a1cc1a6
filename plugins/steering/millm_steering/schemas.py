"""The steering fields and management bodies as pydantic models, for ``/openapi.json``.

They describe what ``request.py``, ``activations.py`` and ``routes.py`` accept; those
modules do the validating (their errors name the parameter the way the rest of the
API does), so a change there is mirrored here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from millm_host.api import ResponseModel


class Feature(BaseModel):
    index: int = Field(ge=0)
    strength: float


class SteeringSpec(BaseModel):
    sae_id: str | None = None
    layer: int | None = Field(default=None, ge=0)
    features: list[Feature]


class Positions(BaseModel):
    start: int
    end: int


class ActivationsSpec(BaseModel):
    sae_id: str | None = None
    layer: int | None = Field(default=None, ge=0)
    features: list[int] | None = None
    top_k: int | None = Field(default=None, ge=1)
    positions: str | Positions | None = None
    read_point: str | None = None


class SteeringFields(BaseModel):
    """What the steering plugin adds to chat and text completions (engines with layer hooks)."""

    profile: str | None = Field(default=None, description="Steer with this saved profile")
    steering_intensity: float | Literal["off", "min", "max"] | None = Field(
        default=None, description="Scale the active steering: 0-2, or off/min/max"
    )
    steering: SteeringSpec | None = Field(default=None, description="Steer this request with these features")
    return_sae_activations: bool | ActivationsSpec | None = Field(
        default=None, description="Return an attached SAE's activations over the request's tokens"
    )


# --- management bodies ---------------------------------------------------------------


class RegisterSAE(BaseModel):
    path: str = Field(min_length=1, description="A SAELens directory")
    sae_id: str | None = None


class LayerBody(BaseModel):
    layer: int | None = Field(default=None, ge=0)


class SetSteering(BaseModel):
    sae_id: str = Field(min_length=1)
    layer: int | None = Field(default=None, ge=0)
    features: list[Feature]


class LockBody(BaseModel):
    model: str | None = Field(default=None, description="The model to narrow /v1/models to (default: the resident one)")


class CreateProfile(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    sae_id: str = Field(min_length=1)
    layer: int | None = Field(default=None, ge=0)
    features: list[Feature] = Field(min_length=1)


class ClusterDocument(BaseModel):
    """A ``mi.cluster/v1`` document; other keys are kept as received."""

    model_config = ConfigDict(extra="allow")

    format: Literal["mi.cluster/v1"]
    cluster_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    sae_id: str = Field(min_length=1, max_length=200)
    layer: int = Field(ge=0)
    features: list[Feature] = Field(min_length=1)
    intensity_range: list[float] | None = Field(default=None, min_length=2, max_length=2)


class CircuitMember(BaseModel):
    sae_id: str = Field(min_length=1, max_length=200)
    layer: int = Field(ge=0)
    features: list[Feature] = Field(min_length=1)


class SliceFallback(BaseModel):
    cluster: ClusterDocument


class CircuitDocument(BaseModel):
    """A ``mi.circuit/v1`` document; other keys are kept as received."""

    model_config = ConfigDict(extra="allow")

    format: Literal["mi.circuit/v1"]
    circuit_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    rung: int = Field(ge=0, le=3)
    intensity_range: list[float] | None = Field(default=None, min_length=2, max_length=2)
    members: list[CircuitMember] = Field(min_length=1)
    slice_fallback: SliceFallback | None = None


class IntensityBody(BaseModel):
    intensity: float = Field(ge=0, le=2, description="The persistent dial λ, within [0, max]")


class LabelRecord(BaseModel):
    """One explanation: Neuronpedia's export record, or a SAELens autointerp line (other keys ignored)."""

    model_config = ConfigDict(extra="allow")

    index: int | str = Field(description="The feature index (Neuronpedia sends it as a string)")
    description: str | None = Field(default=None, description="The label (Neuronpedia)")
    explanation: str | None = Field(default=None, description="The label (SAELens autointerp)")
    modelId: str | None = None
    layer: str | None = Field(default=None, description="Neuronpedia's SAE id, as <layer>-<set>")
    typeName: str | None = None
    explanationModelName: str | None = None
    explanationModel: str | None = None
    explanationScore: float | None = None


class ImportLabels(BaseModel):
    path: str | None = Field(
        default=None,
        description="A labels file under MILLM_SAE_DIRS: a JSON array or JSON lines, gzip-compressed or not",
    )
    content: str | None = Field(default=None, description="A labels file's text, uploaded")
    labels: list[LabelRecord] | None = Field(default=None, description="The records themselves")
    mode: Literal["replace", "merge"] = Field(
        default="replace", description="replace: the SAE's labels become these; merge: these replace theirs only"
    )
    duplicates: Literal["refuse", "first"] = Field(
        default="refuse", description="A feature labelled twice: refused, or its first label kept"
    )


class LabelImport(ResponseModel):
    sae_id: str
    mode: str
    imported: int
    skipped_duplicates: int
    formats: list[str] = Field(description="neuronpedia (description) and/or saelens (explanation)")
    source: str | None = Field(description="<modelId>/<layer> the records name, if they do")
    labels: int = Field(description="How many labels the SAE has now")


class FeatureLabel(ResponseModel):
    sae_id: str
    index: int
    label: str
    explainer: str | None
    method: str | None
    score: float | None
    imported: int


class FeatureLabelPage(ResponseModel):
    object: str
    data: list[FeatureLabel]
    first_id: int | None
    last_id: int | None
    has_more: bool


class LabelsDeleted(ResponseModel):
    sae_id: str
    deleted: int

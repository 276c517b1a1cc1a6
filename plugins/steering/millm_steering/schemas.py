"""The steering fields and management bodies as pydantic models, for ``/openapi.json``.

They describe what ``request.py``, ``activations.py`` and ``routes.py`` accept; those
modules do the validating (their errors name the parameter the way the rest of the
API does), so a change there is mirrored here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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

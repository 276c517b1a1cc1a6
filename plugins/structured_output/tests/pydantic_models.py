"""Pydantic models of the kinds clients send as ``response_format`` (their ``model_json_schema()`` is the schema)."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from typing import Literal

import pydantic


class Room(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Guest(pydantic.BaseModel):
    role: Literal["host", "guest"]
    age: int = pydantic.Field(gt=0, lt=120)


class Booking(pydantic.BaseModel):
    """Every common type at once: the formats, gt/lt, a set, Literal, Enum, Optional, nested and a dict."""

    day: datetime.date
    starts: datetime.time
    booked_at: datetime.datetime
    ref: uuid.UUID
    status: Literal["held", "confirmed"]
    kind: Literal["meeting"]
    room: Room
    tags: set[int] = pydantic.Field(max_length=3)
    note: Literal["quiet", "loud"] | None = None
    organiser: Guest
    counts: dict[str, int]


class Slot(pydantic.BaseModel):
    """What a tiny random model completes by itself under the constraint: no free-text string."""

    day: datetime.date
    starts: datetime.time
    ref: uuid.UUID
    status: Literal["held", "confirmed"]
    room: Room
    seats: set[int] = pydantic.Field(max_length=2)
    note: Literal["quiet", "loud"] | None = None
    organiser: Guest


BOOKING = Booking(
    day=datetime.date(2025, 3, 14),
    starts=datetime.time(9, 30, tzinfo=datetime.UTC),
    booked_at=datetime.datetime(2025, 3, 1, 12, 0, tzinfo=datetime.UTC),
    ref=uuid.UUID("123e4567-e89b-42d3-a456-426614174000"),
    status="held",
    kind="meeting",
    room=Room.LARGE,
    tags={1, 2},
    note=None,
    organiser=Guest(role="host", age=41),
    counts={"chairs": 8, "screens": 1},
)


def as_model_writes(model: pydantic.BaseModel) -> str:
    """The model as JSON in the constraint's layout (one space after ',' and ':')."""
    return json.dumps(model.model_dump(mode="json"), separators=(", ", ": "))

"""Feature labels: reading Neuronpedia's and SAELens' explanation files into one label per feature.

Two real formats, told apart per record by the key that holds the text:

- Neuronpedia's explanation export (``GET /api/explanation/export?modelId=…&saeId=…``): a JSON array
  of ``{"modelId", "layer", "index", "description", "typeName", "explanationModelName"}``, the index a
  string; its dataset dumps hold the same records as JSON lines.
- SAELens' autointerp output (``autointerp_neuronpedia_features(save_to_disk=True)``): JSON lines of
  ``{"modelId", "layer", "index", "explanation", "explanationScore", "explanationModel", …}``.
  SAELens has no other explanation file of its own; plain ``{"index", "description"}`` lists (a JSON
  array or JSON lines) are read too.

A text is a JSON array of records, or records one after another (JSON lines). Each record is checked
as the rest of the plugin checks what it is sent: the first bad one is refused, naming it. Parsing
goes one record at a time (``raw_decode``), so no single C call holds the GIL for a whole file.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millm_host.api import InvalidParameter, MillmError, check_display_name

from .errors import InvalidFeatureIndex

#: The longest label kept (Neuronpedia's and SAELens' explanations are a sentence).
LABEL_MAX_CHARS = 2000
#: The longest explainer, method or source name kept.
NAME_MAX_CHARS = 200
#: Records parsed between two releases of the GIL.
YIELD_EVERY = 1000
MODES = ("replace", "merge")
DUPLICATES = ("refuse", "first")

_WHITESPACE = re.compile(r"\s+")
_SKIP = re.compile(r"[ \t\n\r]*")
_DIGITS = re.compile(r"[0-9]{1,12}")


class LabelsTooLarge(MillmError):
    status, code = 413, "labels_too_large"


@dataclass(frozen=True)
class Label:
    """One feature's label, as stored."""

    index: int
    text: str
    explainer: str | None = None
    method: str | None = None
    score: float | None = None


@dataclass(frozen=True)
class LabelFile:
    """What a file holds: its labels (one per feature), what it was, and what it skipped."""

    labels: tuple[Label, ...]
    formats: tuple[str, ...]
    source: str | None
    skipped_duplicates: int


def read_file(path: Path, max_bytes: int) -> str:
    """The text of a labels file (gzip-compressed or not), at most ``max_bytes`` once decompressed."""
    if not path.is_file():
        raise InvalidParameter(f"path {str(path)!r} is not a file", param="path")
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    try:
        with gzip.open(path, "rb") if gzipped else path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        raise InvalidParameter(f"path {str(path)!r} could not be read: {exc}", param="path") from None
    if len(data) > max_bytes:
        raise LabelsTooLarge(f"the labels file is over the {max_bytes}-byte limit (SAE_LABELS_MAX_BYTES)", param="path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameter(
            f"the labels file is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})", param="path"
        ) from None


def check_content(content: str, max_bytes: int) -> str:
    """An uploaded file's text: UTF-8 encodable (no lone surrogate), within the limit."""
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidParameter(
            f"content holds a lone surrogate (U+{ord(content[exc.start]):04X} at position {exc.start})",
            param="content",
        ) from None
    if size > max_bytes:
        raise LabelsTooLarge(f"content is over the {max_bytes}-byte limit (SAE_LABELS_MAX_BYTES)", param="content")
    return content


def _position(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def records(text: str) -> Iterator[Any]:
    """The records of a text: the items of a JSON array, or JSON values one after another."""
    decoder = json.JSONDecoder()
    text = text.removeprefix("\ufeff")
    pos = _SKIP.match(text, 0).end()  # type: ignore[union-attr]  # matches the empty string
    in_array = text.startswith("[", pos)
    if in_array:
        pos = _SKIP.match(text, pos + 1).end()  # type: ignore[union-attr]
        if text.startswith("]", pos):
            pos = _SKIP.match(text, pos + 1).end()  # type: ignore[union-attr]
            in_array = False
    count = 0
    while pos < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            raise InvalidParameter(
                f"the labels are not JSON at {_position(text, pos)} (record {count})", param="labels"
            ) from None
        yield value
        count += 1
        if count % YIELD_EVERY == 0:
            time.sleep(0)  # give the GIL up between runs of records
        pos = _SKIP.match(text, pos).end()  # type: ignore[union-attr]
        if in_array:
            if text.startswith(",", pos):
                pos = _SKIP.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("]", pos):
                pos = _SKIP.match(text, pos + 1).end()  # type: ignore[union-attr]
                in_array = False
                continue
            raise InvalidParameter(f"the labels array is broken at {_position(text, pos)}", param="labels")
        if pos < len(text) and text[pos] in "],":
            raise InvalidParameter(f"the labels are not JSON at {_position(text, pos)}", param="labels")
    if in_array:
        raise InvalidParameter("the labels array is not closed", param="labels")


def _clean(value: Any, param: str, most: int) -> str:
    """A shown string: whitespace runs as one space, no hidden characters, 1 to ``most`` characters."""
    if not isinstance(value, str):
        raise InvalidParameter(f"{param} must be a string, not {type(value).__name__}", param=param)
    text = _WHITESPACE.sub(" ", value).strip()
    if not text:
        raise InvalidParameter(f"{param} is empty", param=param)
    if len(text) > most:
        raise InvalidParameter(f"{param} is longer than {most} characters", param=param)
    return check_display_name(text, param)


def _optional(record: dict[str, Any], key: str, param: str) -> str | None:
    value = record.get(key)
    return None if value is None else _clean(value, f"{param}.{key}", NAME_MAX_CHARS)


def _index(value: Any, param: str, d_sae: int, sae_id: str) -> int:
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidParameter(f"{param} must be a feature index (an integer ≥ 0, or one as a string)", param=param)
    if value >= d_sae:
        raise InvalidFeatureIndex(
            f"feature index {value} is out of range for SAE {sae_id!r} (d_sae {d_sae}: 0 to {d_sae - 1})",
            param=param,
        )
    return value


def read_labels(
    items: Iterator[Any] | list[Any], *, d_sae: int, sae_id: str, neuronpedia_id: str | None, duplicates: str
) -> LabelFile:
    """Check every record and keep one label per feature (``duplicates``: refuse a second, or keep the first)."""
    kept: dict[int, tuple[int, Label]] = {}
    formats: set[str] = set()
    sources: set[str] = set()
    skipped = 0
    for j, record in enumerate(items):
        where = f"labels[{j}]"
        if not isinstance(record, dict):
            raise InvalidParameter(f"{where} must be an object with index and description", param=where)
        index = _index(record.get("index"), f"{where}.index", d_sae, sae_id)
        if "description" in record:
            key, fmt = "description", "neuronpedia"
        elif "explanation" in record:
            key, fmt = "explanation", "saelens"
        else:
            raise InvalidParameter(
                f"{where} has no description (Neuronpedia) or explanation (SAELens)", param=f"{where}.description"
            )
        text = _clean(record[key], f"{where}.{key}", LABEL_MAX_CHARS)
        explainer = _optional(record, "explanationModelName" if fmt == "neuronpedia" else "explanationModel", where)
        method = _optional(record, "typeName", where)
        score = record.get("explanationScore")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score)
        ):
            raise InvalidParameter(
                f"{where}.explanationScore must be a finite number", param=f"{where}.explanationScore"
            )
        model, layer = record.get("modelId"), record.get("layer")
        if model is not None and layer is not None:
            sources.add(
                f"{_clean(model, f'{where}.modelId', NAME_MAX_CHARS)}/{_clean(layer, f'{where}.layer', NAME_MAX_CHARS)}"
            )
            if len(sources) > 1:
                raise InvalidParameter(
                    f"the labels are of several SAEs ({', '.join(sorted(sources))}); import one SAE's at a time",
                    param=f"{where}.layer",
                )
        if index in kept:
            if duplicates == "refuse":
                raise InvalidParameter(
                    f"feature {index} is labelled twice (labels[{kept[index][0]}] and {where}); send "
                    'duplicates: "first" to keep the first label of each feature',
                    param=f"{where}.index",
                )
            skipped += 1
            continue
        formats.add(fmt)
        kept[index] = (j, Label(index, text, explainer, method, None if score is None else float(score)))
    if not kept:
        raise InvalidParameter("the labels hold no record", param="labels")
    source = next(iter(sources), None)
    if source is not None and neuronpedia_id and source != neuronpedia_id:
        raise InvalidParameter(
            f"the labels are of {source}, but SAE {sae_id!r} is {neuronpedia_id} on Neuronpedia (its cfg.json)",
            param="labels",
            code="labels_of_another_sae",
        )
    return LabelFile(
        tuple(label for _, label in sorted(kept.values(), key=lambda kv: kv[1].index)),
        tuple(sorted(formats)),
        source,
        skipped,
    )


def choice(body: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    """An optional enumerated body field (its first allowed value by default)."""
    value = body.get(key, allowed[0])
    if value not in allowed:
        raise InvalidParameter(f"{key} must be one of {', '.join(allowed)}, not {value!r}", param=key)
    return value

"""``return_sae_activations``: one request's activations of an attached SAE.

A read hook at the SAE's hook point encodes the residual at the positions asked
for, after this layer's steering delta (``post_steering``) or before it
(``pre_steering``), and keeps the ``top_k`` largest among the candidate features.
The last sampled token is never fed back, so it has no activation: the
response lists the positions actually read.

The hook is batched (``read_rows``): in a continuous batch, one call per pass reads
every reading row, one encode per SAE and request shape, and one device-to-host copy
for all of them; alone, a request is a batch of one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm_host.api import (
    ORDER_READ_POST_STEERING,
    ORDER_READ_PRE_STEERING,
    READS_PROMPT,
    STEERED,
    HookRow,
    InvalidParameter,
    LayerHook,
)

from .features import check_indices, is_int, non_negative_int
from .resolve import select_attachment
from .state import Attachment, Snapshot

if TYPE_CHECKING:
    from millm_host.api import RequestContext

PARAM = "return_sae_activations"
POSITIONS = ("last", "prompt", "completion", "all")
READ_POINTS = ("post_steering", "pre_steering")
DEFAULT_TOP_K = 8

#: The read point a scoring request reports: its forward pass is never steered.
UNSTEERED = "unsteered"

NOTES = {
    "post_steering": (
        "post_steering is what the model computed at this layer for this request; it is not an unsteered "
        "counterfactual: steering at earlier layers, and tokens generated under steering, still shape it."
    ),
    "pre_steering": (
        "pre_steering is read before this layer's own steering delta; steering at earlier layers, and "
        "tokens generated under steering, still shape it."
    ),
    UNSTEERED: "a scoring request's forward pass is never steered: these are the unsteered model's activations.",
}


@dataclass(frozen=True)
class ActivationsRequest:
    """A validated ``return_sae_activations`` object. ``positions`` is a name or ``(start, end)``."""

    sae_id: str | None
    layer: int | None
    features: tuple[int, ...] | None
    top_k: int
    positions: str | tuple[int, int]
    read_point: str


def _field(name: str) -> str:
    return f"{PARAM}.{name}"


def parse(value: Any, max_top_k: int) -> ActivationsRequest | None:
    """The request's ``return_sae_activations`` (None when absent, null or false); 400 when malformed."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise InvalidParameter(f"{PARAM} must be an object", param=PARAM)
    sae_id = value.get("sae_id")
    if sae_id is not None and not isinstance(sae_id, str):
        raise InvalidParameter("sae_id must be a string", param=_field("sae_id"))
    layer = value.get("layer")
    if layer is not None:
        non_negative_int(layer, _field("layer"))
    features = value.get("features")
    if features is not None:
        if not isinstance(features, list) or not features:
            raise InvalidParameter("features must be a non-empty list of feature indices", param=_field("features"))
        for j, index in enumerate(features):
            non_negative_int(index, f"{_field('features')}[{j}]")
        if len(set(features)) != len(features):
            twice = next(i for i in features if features.count(i) > 1)
            raise InvalidParameter(f"feature {twice} is listed twice", param=_field("features"))
        features = tuple(features)
    top_k = value.get("top_k")
    if top_k is None:
        top_k = min(len(features) if features is not None else DEFAULT_TOP_K, max_top_k)
    elif not is_int(top_k) or top_k < 1:
        raise InvalidParameter("top_k must be a positive integer", param=_field("top_k"))
    elif top_k > max_top_k:
        raise InvalidParameter(f"top_k {top_k} is over SAE_ACTIVATIONS_MAX_TOP_K ({max_top_k})", param=_field("top_k"))
    return ActivationsRequest(
        sae_id,
        layer,
        features,
        top_k,
        _positions(value.get("positions", "completion")),
        _read_point(value.get("read_point", "post_steering")),
    )


def _positions(value: Any) -> str | tuple[int, int]:
    if isinstance(value, str) and value in POSITIONS:
        return value
    if isinstance(value, dict):
        start, end = value.get("start"), value.get("end")
        if is_int(start) and is_int(end) and 0 <= start < end:
            return (start, end)
        raise InvalidParameter(
            "positions {start, end} needs integers with 0 <= start < end (end exclusive)", param=_field("positions")
        )
    raise InvalidParameter(
        f"positions must be one of {', '.join(POSITIONS)} or {{start, end}}", param=_field("positions")
    )


def _read_point(value: Any) -> str:
    if value in READ_POINTS:
        return value
    raise InvalidParameter(f"read_point must be one of {', '.join(READ_POINTS)}", param=_field("read_point"))


def check_request_shape(ctx: RequestContext) -> None:
    """One position axis only: refuse ``n > 1``, ``extra_messages`` and several prompts."""
    if ctx.n > 1:
        raise InvalidParameter(f"{PARAM} needs n = 1 (one position axis)", param="n")
    if ctx.body.get("extra_messages"):
        raise InvalidParameter(
            f"{PARAM} cannot be combined with extra_messages (one position axis)", param="extra_messages"
        )
    if ctx.endpoint == "completions" and len(ctx.params.prompts) > 1:
        raise InvalidParameter(f"{PARAM} needs a single prompt (one position axis)", param="prompt")


def select(snap: Snapshot, request: ActivationsRequest) -> Attachment:
    """The attachment to read (400 when none or several match, or a feature is past its width)."""
    attachment = select_attachment(snap, request.sae_id, request.layer, PARAM)
    if request.features is not None:
        check_indices(
            request.features, attachment.sae.cfg.d_sae, attachment.sae_id, lambda j: f"{_field('features')}[{j}]"
        )
    return attachment


def worst_case_entries(request: ActivationsRequest, prompt_len: int, max_tokens: int) -> int:
    """positions × top_k, counting ``max_tokens`` in full for ``completion`` and ``all`` (a range
    counts the part of it that prompt and ``max_tokens`` can reach)."""
    positions = request.positions
    if isinstance(positions, str):
        count = {"last": 1, "prompt": prompt_len, "completion": max_tokens, "all": prompt_len + max_tokens}[positions]
    else:
        count = max(0, min(positions[1], prompt_len + max_tokens) - positions[0])
    return count * request.top_k


def _bounds(positions: str | tuple[int, int], prompt_len: int) -> tuple[int, float]:
    """The fixed ``[start, end)`` of the positions read; ``last`` has none (it moves with each pass)."""
    if positions in ("all", "last"):
        return 0, math.inf
    if positions == "prompt":
        return 0, prompt_len
    if positions == "completion":
        return prompt_len, math.inf
    assert not isinstance(positions, str)  # _positions admits no other name
    return positions


class ActivationReader:
    """The read hook's state: per position read, the top features."""

    def __init__(
        self,
        attachment: Attachment,
        request: ActivationsRequest,
        prompt_len: int,
        labels: Mapping[int, str] | None = None,
    ) -> None:
        self.attachment = attachment
        self.request = request
        self.labels = labels or {}  # the SAE's feature labels (label_cache.py): one dict per response
        self.records: dict[int, list[tuple[int, float]]] = {}
        self._candidates = attachment.sae.candidates(request.features)
        self._last = request.positions == "last"
        self._bounds = _bounds(request.positions, prompt_len)
        self._hook: LayerHook | None = None

    def _window(self, lo: int, hi: int) -> tuple[int, int]:
        if self._last:
            return hi - 1, hi
        start, end = self._bounds
        return max(lo, start), int(min(hi, end))  # an int: hi is finite, end an int or math.inf

    def read(self, hidden: Any, start: int) -> None:
        """The per-row callback (an engine that does not batch hooks): ``read_rows`` for its one row."""
        read_rows(hidden, [HookRow(0, start, 0, self.hook())])
        return None

    def _record(self, lo: int, tops: list[list[tuple[int, float]]]) -> None:
        if self._last:
            self.records.clear()
        for offset, top in enumerate(tops):
            self.records[lo + offset] = top

    def hook(self) -> LayerHook:
        """The read hook (one per reader: its callback and the batched ``read_rows``)."""
        if self._hook is not None:
            return self._hook
        order = ORDER_READ_POST_STEERING if self.request.read_point == "post_steering" else ORDER_READ_PRE_STEERING
        self._hook = LayerHook(
            self.attachment.layer,
            self.attachment.point,
            self.read,
            order,
            owner="steering",
            batched=read_rows,
            state=self,
            prompt_key=READS_PROMPT,  # a reused prompt's positions are replayed to it
            variant=STEERED,  # with_unsteered: the activations are the steered reply's
        )
        return self._hook

    def payload(self, token_ids: list[int], read_point: str | None = None) -> dict[str, Any]:
        """The ``millm`` object of the response; ``token_ids`` is prompt then generated.

        ``read_point`` overrides the requested one (a scoring request reports ``unsteered``).
        """
        read_point = read_point or self.request.read_point
        return {
            "sae_activations": {
                "sae_id": self.attachment.sae_id,
                "layer": self.attachment.layer,
                "read_point": read_point,
                "positions": [
                    {
                        "position": p,
                        "token_id": token_ids[p],
                        "features": self._features(self.records[p]),
                    }
                    for p in sorted(self.records)
                ],
                "note": NOTES[read_point],
            }
        }

    def _features(self, top: list[tuple[int, float]]) -> list[dict[str, Any]]:
        """A position's features, each with its label where one is known."""
        labels = self.labels
        if not labels:
            return [{"index": i, "value": v} for i, v in top]
        found = []
        for i, v in top:
            label = labels.get(i)
            found.append({"index": i, "value": v} if label is None else {"index": i, "value": v, "label": label})
        return found


def read_rows(hidden: Any, rows: Sequence[HookRow]) -> None:
    """Every reading row of a pass into its reader: ``LayerHook.batched``.

    ``hidden`` is ``[batch, seq, d]``; each row reads the columns of its window
    (``hidden[row.index, row.skip:]`` from position ``row.start`` on). Rows reading one
    SAE with the same features and ``top_k`` are encoded and ranked together (one
    matrix product, one ``topk``); then the values and indices of every row come to
    the host in one copy, not one per row.
    """
    import torch

    groups: dict[tuple[int, tuple[int, ...] | None, int], list[tuple[ActivationReader, int, Any]]] = {}
    for row in rows:
        reader: ActivationReader = row.hook.state
        length = hidden.shape[1] - row.skip
        lo, hi = reader._window(row.start, row.start + length)
        if lo >= hi:
            continue
        first = row.skip + lo - row.start
        key = (id(reader.attachment.sae), reader.request.features, reader.request.top_k)
        groups.setdefault(key, []).append((reader, lo, hidden[row.index, first : first + hi - lo]))
    if not groups:
        return None
    ranked = []  # per group: its members, and [positions, k] values and feature indices on the device
    for members in groups.values():
        reader = members[0][0]
        parts = [part for _, _, part in members]
        values, indices = reader.attachment.sae.rank(
            parts[0] if len(parts) == 1 else torch.cat(parts), reader._candidates, reader.request.top_k
        )
        ranked.append((members, values, indices))
    # One copy: float64 holds the float32 values and the feature indices exactly.
    packed = torch.cat([torch.cat([v.double().flatten(), i.double().flatten()]) for _, v, i in ranked]).tolist()
    at = 0
    for members, values, _ in ranked:
        count, k = values.shape
        group_values = packed[at : at + count * k]
        group_indices = packed[at + count * k : at + 2 * count * k]
        at += 2 * count * k
        offset = 0
        for reader, lo, part in members:
            tops = []
            for position in range(part.shape[0]):
                base = (offset + position) * k
                pairs = zip(group_indices[base : base + k], group_values[base : base + k], strict=True)
                tops.append([(int(i), v) for i, v in pairs if v != 0.0])
            reader._record(lo, tops)
            offset += part.shape[0]
    return None

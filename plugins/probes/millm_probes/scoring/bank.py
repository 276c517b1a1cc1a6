"""The scoring math of ``mi.probe.definition/v1`` (FORMATS.md), shared by live and stateless scoring.

Per position *t*: dense ``s_t = w · (h_t − μ)/σ + b``; k-sparse the same over
``f_t = encode(h_t)[features]``. The normalisation is folded into the weights
once (``w/σ`` and ``b − Σ w μ/σ``), so every probe armed at one residual point
is a column of one matrix product over the gathered rows. All columns of all
points are concatenated and copied to the host once (a row per column there);
windows and aggregation then run there in float64.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from millm_host.api import HookPointName

from ..definition import ProbeDefinition
from .sae import SaeUnavailable, load_encoder

if TYPE_CHECKING:
    from millm_saelens.weights import FeatureEncoder as Encoder

Point = tuple[int, HookPointName]  # (layer, hook point)


class ProbeUnusable(Exception):
    """This probe cannot be computed on this model; ``reason`` is the failed outcome's code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class CompiledProbe:
    """One probe's head, folded and placed on the engine's device."""

    key: str
    point: Point
    weights: Any  # [width] float32 tensor: w / σ
    bias: float  # b − Σ w μ / σ, kept in float64 on the host
    query: Any  # [d_model] float32 tensor, attention rule only
    encoder: Encoder | None


def compile_probe(
    key: str, d: ProbeDefinition, engine: Any, sae_dir: str | None, encoders: dict[str, Encoder] | None = None
) -> CompiledProbe:
    """Fold ``d``'s head for ``engine``'s device; raise ``ProbeUnusable`` when it cannot run there."""
    import torch

    info = engine.info
    if info.n_layers is not None and d.read.layer >= info.n_layers:
        raise ProbeUnusable("head_mismatch", f"layer {d.read.layer} does not exist (the model has {info.n_layers})")
    width = len(d.head.weights)
    encoder = None
    if d.basis == "sae":
        assert d.sae is not None
        cache_key = f"{d.sae.sae_id}|{','.join(map(str, d.sae.feature_indices))}"
        encoder = (encoders or {}).get(cache_key)
        if encoder is None:
            try:
                encoder = load_encoder(sae_dir, d.sae.sae_id, d.sae.feature_indices, info.d_model, info.device)
            except SaeUnavailable as exc:
                raise ProbeUnusable("encoder_failed", str(exc)) from None
            if encoders is not None:
                encoders[cache_key] = encoder
    elif width != info.d_model:
        raise ProbeUnusable("head_mismatch", f"the head has {width} weights; the residual has width {info.d_model}")
    w = np.asarray(d.head.weights, dtype=np.float64)
    mean = np.asarray(d.head.norm_mean, dtype=np.float64) if d.head.norm_mean is not None else np.zeros(width)
    std = np.asarray(d.head.norm_std, dtype=np.float64) if d.head.norm_std is not None else np.ones(width)
    folded = w / std
    query = None
    if d.aggregation.rule == "attention":
        query = torch.tensor(d.head.attention_query, dtype=torch.float32, device=info.device)
    return CompiledProbe(
        key=key,
        point=(d.read.layer, d.read.hook_point),
        weights=torch.tensor(folded, dtype=torch.float32, device=info.device),
        bias=float(d.head.bias - float(np.dot(folded, mean))),
        query=query,
        encoder=encoder,
    )


@dataclass
class _PointGroup:
    dense: list[CompiledProbe] = field(default_factory=list)
    sparse: list[CompiledProbe] = field(default_factory=list)
    attention: list[CompiledProbe] = field(default_factory=list)
    dense_matrix: Any = None  # [d_model, n_dense]
    query_matrix: Any = None  # [d_model, n_attention]


class Bank:
    """Every probe of one request, grouped by the residual point it reads.

    ``columns(rows)`` computes each probe's per-position score (and attention
    logits) for all probes in one product per point and one device-to-host copy.
    """

    def __init__(self, probes: Sequence[CompiledProbe]) -> None:
        import torch

        self.probes = list(probes)
        self.groups: dict[Point, _PointGroup] = defaultdict(_PointGroup)
        for probe in self.probes:
            group = self.groups[probe.point]
            (group.sparse if probe.encoder is not None else group.dense).append(probe)
            if probe.query is not None:
                group.attention.append(probe)
        self.score_column: dict[str, int] = {}
        self.logit_column: dict[str, int] = {}
        column = 0
        for group in self.groups.values():
            if group.dense:
                group.dense_matrix = torch.stack([p.weights for p in group.dense], dim=1)
            if group.attention:
                group.query_matrix = torch.stack([p.query for p in group.attention], dim=1)
            for probe in (*group.dense, *group.sparse):
                self.score_column[probe.key] = column
                column += 1
            for probe in group.attention:
                self.logit_column[probe.key] = column
                column += 1
        self.biases = {p.key: p.bias for p in self.probes}

    @property
    def points(self) -> list[Point]:
        return list(self.groups)

    def columns(self, rows: dict[Point, Any]) -> np.ndarray:
        """``[columns, positions]`` float64 on the host: the request's only device-to-host copy.

        One row per column, so each probe's per-position scores are contiguous: read across a
        ``[positions, columns]`` array instead, a set of thousands would take a cache miss per position."""
        import torch

        # torch's per-thread start-up before the first product: on a thread whose first torch call is
        # a product, MKL starts a team of every core beside the model's, and GNU OpenMP then throttles
        # both for as long as this thread lives (the transformers engine's intraop.py explains).
        torch.get_num_threads()
        parts = []
        for point, group in self.groups.items():
            hidden = rows[point].float()
            if group.dense:
                parts.append(hidden @ group.dense_matrix)
            for probe in group.sparse:
                assert probe.encoder is not None
                parts.append((probe.encoder.encode(hidden) @ probe.weights).unsqueeze(1))
            if group.attention:
                parts.append(hidden @ group.query_matrix)
        matrix = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        host = matrix.t().contiguous().to("cpu").numpy().astype(np.float64)
        for key, column in self.score_column.items():
            host[column] += self.biases[key]
        return host

    def per_token(self, host: np.ndarray, key: str) -> np.ndarray:
        return host[self.score_column[key]]

    def logits(self, host: np.ndarray, key: str) -> np.ndarray | None:
        column = self.logit_column.get(key)
        return None if column is None else host[column]


def aggregate(rule: str, k: int | None, scores: np.ndarray, logits: np.ndarray | None) -> float:
    """One score from a window's per-position scores (``scores`` is non-empty)."""
    if rule == "mean":
        return float(scores.mean())
    if rule == "max":
        return float(scores.max())
    if rule == "last":
        return float(scores[-1])
    if rule == "topk_mean":
        count = min(k or 1, scores.size)
        return float(np.sort(scores)[-count:].mean())
    if rule == "attention":
        assert logits is not None
        shifted = logits - logits.max()
        alpha = np.exp(shifted)
        alpha /= alpha.sum()
        return float((alpha * scores).sum())
    raise ValueError(f"unknown aggregation rule {rule!r}")

"""``Series``: one metric a plugin named (``host.metrics.counter`` and ``histogram`` give it)."""

from __future__ import annotations

from typing import Any


class Series:
    """One metric a plugin named: ``inc`` a counter, ``observe`` a histogram, labels by name."""

    def __init__(self, metric: Any, labels: tuple[str, ...]) -> None:
        self._metric = metric
        self.labels = labels

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).inc(amount)

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(value)

    def _child(self, labels: dict[str, str]) -> Any:
        return self._metric.labels(**labels) if self.labels else self._metric

"""Builders the exporter's collectors share (hsmon.metrics.exporter, hsmon.metrics.engine_metrics):
a family with the metrics contract's default label, and a sample that is skipped when its figure
is unknown."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def gauge(name: str, doc: str, labels: tuple[str, ...] = ("job",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def counter(name: str, doc: str, labels: tuple[str, ...] = ("job",)) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def add_sample(metric: Any, labels: list[str], value: Any) -> None:
    """A sample of ``value``, or none when it is not known (never a guess)."""
    if value is not None:
        metric.add_metric(labels, float(value))

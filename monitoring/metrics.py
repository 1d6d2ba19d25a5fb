"""``/metrics``: what kfloop recorded, per model, in the Prometheus text format. Every scrape reads MLflow (the drift
and quality checks' runs, the registered model's champion alias) and the trigger state's store, never the process's
memory, so every replica of ``kfloop serve`` answers the same."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterator

import mlflow
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from monitoring.records import drift_checks, quality_checks
from monitoring.trigger import OUTCOMES, TriggerStore, outcome_counts
from training.registry.versions import CHAMPION_ALIAS, registered_model


class RecordsCollector(Collector):
    """The ``kfloop_*`` series of every model ``models()`` names (label ``model``), read on each ``collect()``;
    ``store_for(model)`` is the trigger state the webhook and the pipelines decide on."""

    def __init__(self, *, models: Callable[[], list[str]], store_for: Callable[[str], TriggerStore]):
        self.models, self.store_for = models, store_for

    def collect(self) -> Iterator[Metric]:
        """One family per series; a model without a drift check, quality check or champion has no sample there.

        Raises:
            mlflow.exceptions.MlflowException, monitoring.trigger.TriggerStateError: the records cannot be read.
        """
        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["model", *labels])

        drift_share = gauge("kfloop_drift_share_drifted_columns", "Share of drifted columns in the last drift check")
        drift_verdict = gauge("kfloop_drift_detected", "1 when the last drift check found drift, else 0")
        drift_at = gauge("kfloop_drift_check_timestamp_seconds", "When the last drift check ran (Unix time)")
        quality_value = gauge("kfloop_quality_value", "The champion's primary metric on the last labelled rows",
                              "metric")
        quality_baseline = gauge("kfloop_quality_baseline", "The champion's holdout value the last quality check "
                                 "compared against", "metric")
        quality_verdict = gauge("kfloop_quality_degraded", "1 when the last quality check found the champion "
                                "degraded, else 0")
        quality_insufficient = gauge("kfloop_quality_insufficient_labels", "1 when the last quality check had too "
                                     "few labels for a verdict (neither degraded nor fine), else 0")
        quality_at = gauge("kfloop_quality_check_timestamp_seconds", "When the last quality check ran (Unix time)")
        champion = gauge("kfloop_champion_version", "The registered model version alias 'champion' points at")
        fired = CounterMetricFamily("kfloop_trigger_fired", "Retrain triggers that started a training run",
                                    labels=["model"])
        suppressed = CounterMetricFamily("kfloop_trigger_suppressed", "Retrain triggers that started nothing, by "
                                         "reason (duplicate, cooldown, in_flight)", labels=["model", "reason"])
        for model in self.models():
            for check in drift_checks(model, limit=1):
                drift_share.add_metric([model], check["share_drifted_columns"])
                drift_verdict.add_metric([model], float(check["drifted"]))
                drift_at.add_metric([model], _unix(check["at"]))
            for check in quality_checks(model, limit=1):
                if check["value"] is not None:
                    quality_value.add_metric([model, check["metric"]], check["value"])
                if check["baseline"] is not None:
                    quality_baseline.add_metric([model, check["metric"]], check["baseline"])
                quality_verdict.add_metric([model], float(check["degraded"]))
                quality_insufficient.add_metric([model], float(check["verdict"] == "insufficient_labels"))
                quality_at.add_metric([model], _unix(check["at"]))
            version = _champion_version(model)
            if version is not None:
                champion.add_metric([model], float(version))
            entry = self.store_for(model).load()["models"].get(model)
            counts = outcome_counts(entry) if entry else {}
            fired.add_metric([model], counts.get("fired", 0))
            for outcome in OUTCOMES[1:]:
                suppressed.add_metric([model, outcome], counts.get(outcome, 0))
        yield from (drift_share, drift_verdict, drift_at, quality_value, quality_baseline, quality_verdict,
                    quality_insufficient, quality_at, champion, fired, suppressed)


def exposition(collector: Collector) -> bytes:
    """``collector``'s samples in the Prometheus text format (content type
    ``prometheus_client.exposition.CONTENT_TYPE_LATEST``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def registered_models(client: Any = None) -> list[str]:
    """Names of every registered model in MLflow (``kfloop serve`` exports them all: each model kfloop trains is
    registered with its first candidate).

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    client = client or mlflow.MlflowClient()
    names, token = [], None
    while True:
        page = client.search_registered_models(max_results=1000, page_token=token)
        names += [model.name for model in page]
        token = page.token
        if not token:
            return sorted(names)


def _champion_version(model: str) -> str | None:
    registered = registered_model(model)
    version = registered.aliases.get(CHAMPION_ALIAS) if registered else None
    return None if version is None else str(version)


def _unix(at: str) -> float:
    """An ``at`` of the records (UTC ISO 8601) as seconds since the epoch."""
    return datetime.fromisoformat(at).timestamp()

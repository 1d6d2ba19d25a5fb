"""What an accepted alert starts, for ``kfloop serve``: the training settings of an alert, and the runs it starts on
this machine (``kfloop serve --local``); a run on the KFP server is :func:`pipelines.kfp_server.runs.alert_starter`."""
from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from components.run_starters import local_training_process
from monitoring.trigger import RunInFlight
from monitoring.webhook import Alert
from pipelines.config import TRAINING_KEYS


def alert_settings(settings: dict[str, Any], alert: Alert) -> dict[str, Any]:
    """The training settings of a run started by ``alert``: its model and data (``dataset_uri`` of the alert, else
    of ``settings``) and the training sections of ``settings``.

    Raises:
        ValueError: neither the alert nor ``settings`` names a dataset.
    """
    dataset_uri = alert.dataset_uri or settings.get("dataset_uri")
    if not dataset_uri:
        raise ValueError(f"alert for {alert.model!r} names no dataset_uri and none is configured: add annotation "
                         "dataset_uri to the alert or set dataset_uri in kfloop.yaml")
    base = {k: v for k, v in settings.items() if k in TRAINING_KEYS or k in ("schema_uri", "target", "task")}
    return {**base, "dataset_uri": dataset_uri, "model_name": alert.model}


class LocalAlertRuns:
    """``start(alert)`` for :class:`monitoring.webhook.AlertWebhook` on this machine: the training pipeline under
    kfp.local (``kfloop run training --local``) in a background process, so the alert is answered at once, as a
    KFP run's creation is. One run at a time (what the in-flight guard of the cluster path checks on the KFP
    server): ``start`` raises :class:`RunInFlight` while one runs. Each run leaves ``<runs_dir>/<id>.json`` (the
    ``--json`` summary) and ``<id>.log``; ``on_done(run_id, exit_code)`` is called when it ends."""

    def __init__(self, settings: dict[str, Any], runs_dir: Path, *, on_done: Callable[[str, int], None]):
        self.settings, self.runs_dir, self.on_done = settings, runs_dir, on_done
        self._lock = threading.Lock()
        self._running: tuple[str, subprocess.Popen] | None = None
        self._waiters: list[threading.Thread] = []

    def start(self, alert: Alert) -> str:
        """Start a run for ``alert`` and return its id (``local-<hex>``).

        Raises:
            RunInFlight: a run started here has not ended yet.
            ValueError: no dataset for the alert (see :func:`alert_settings`).
        """
        with self._lock:
            if self._running is not None and self._running[1].poll() is None:
                raise RunInFlight(f"local training run {self._running[0]} (pid {self._running[1].pid}) is running")
            settings = alert_settings(self.settings, alert)
            run_id = f"local-{uuid.uuid4().hex[:12]}"
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            summary, log_path = self.runs_dir / f"{run_id}.json", self.runs_dir / f"{run_id}.log"
            with summary.open("w") as out, log_path.open("w") as log:
                proc = local_training_process(settings, self.runs_dir / f"{run_id}.yaml", stdout=out, stderr=log)
            self._running = (run_id, proc)
            waiter = threading.Thread(target=lambda: self.on_done(run_id, proc.wait()), daemon=True)
            self._waiters.append(waiter)
            waiter.start()
            return run_id

    def result(self, run_id: str) -> dict[str, Any]:
        """The ``--json`` summary of a finished run (model version, promoted, reason, ...)."""
        return json.loads((self.runs_dir / f"{run_id}.json").read_text())

    def close(self) -> None:
        """Stop a run still going (the server is shutting down) and wait for its end to be reported."""
        with self._lock:
            if self._running is not None and self._running[1].poll() is None:
                self._running[1].terminate()
        for waiter in self._waiters:
            waiter.join()

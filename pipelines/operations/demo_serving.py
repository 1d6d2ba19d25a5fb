"""``kfloop demo --serve``'s server: a real ``kfloop serve-model`` child process serving the champion with its
inference logs, asked over Open Inference Protocol v2, and the windows of its logs read back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from data.settings import CODE_ROOT
from monitoring.inference_logs import VERSION_COLUMN, read_inference_logs
from training.launch.local import free_ports
from training.registry.versions import CHAMPION_ALIAS
from training.serving.table import table_request

START_TIMEOUT_S = 180.0
"""How long serve-model may take to load the champion and answer ``/v2/models/<name>/ready``."""
ROWS_PER_REQUEST = 500


@dataclass(kw_only=True, slots=True)
class Window:
    """The requests sent in one stretch of time: its bounds (UTC), how many requests and rows went out."""

    start: datetime
    end: datetime
    requests: int
    rows: int


class ServeModel:
    """``kfloop serve-model --model NAME --alias champion --log-dir LOGS`` on free loopback ports, in its own process
    group (its output in ``log``), ready once ``/v2/models/<name>/ready`` answers 200; :meth:`stop` ends the group."""

    def __init__(self, model: str, logs: Path, log: Path):
        self.model, self.logs = model, logs
        port, grpc_port = free_ports(2)
        self.url = f"http://127.0.0.1:{port}/v2/models/{model}"
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipelines", "serve-model", "--model", model, "--alias", CHAMPION_ALIAS,
                 "--port", str(port), "--grpc-port", str(grpc_port), "--log-dir", str(logs)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=CODE_ROOT)  # -m finds pipelines
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve-model did not answer {self.url}/ready within {START_TIMEOUT_S:.0f} s "
                                   f"(exit code {self.process.returncode}); its output: {log}")
            time.sleep(0.2)  # the polling interval of a deadline-bounded wait for readiness

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ready", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def send(self, rows: pd.DataFrame) -> Window:
        """``rows`` sent to the champion (:func:`send_rows`)."""
        return send_rows(self.url, self.model, rows)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 30 s."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def send_rows(url: str, model: str, rows: pd.DataFrame) -> Window:
    """``rows`` as v2 table requests of :data:`ROWS_PER_REQUEST` rows to ``url`` (``.../v2/models/<model>``), each
    answered 200 (else an error with the answer's start); the window they were sent in."""
    start = datetime.now(timezone.utc)
    requests = 0
    for first in range(0, len(rows), ROWS_PER_REQUEST):
        body, _ = table_request(rows.iloc[first:first + ROWS_PER_REQUEST], model).to_rest()
        request = urllib.request.Request(f"{url}/infer", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{url}/infer answered {exc.code}: {exc.read()[:500]!r}") from None
        requests += 1
    return Window(start=start, end=datetime.now(timezone.utc), requests=requests, rows=len(rows))


def logged(logs: Path, window: Window) -> dict[str, object]:
    """What the logs hold of ``window``: requests, rows read back and the versions that answered them."""
    served = read_inference_logs(logs, since=window.end - window.start, now=window.end)
    versions = sorted(served.rows[VERSION_COLUMN].unique().tolist()) if len(served.rows) else []
    return {"requests_sent": window.requests, "rows_sent": window.rows, "requests_logged": served.requests,
            "rows_logged": len(served.rows), "versions": versions}

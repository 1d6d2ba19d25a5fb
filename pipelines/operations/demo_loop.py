"""``kfloop demo``: the whole loop on the demo data, from a clean demo workdir."""
from __future__ import annotations

import math
import shlex
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from data.demo import DATA_DIR, DemoData, ensure_demo_data
from data.dvc_store import DEFAULT_STORE_DIR
from data.redaction import redact
from data.settings import Environment, activate, load_environment
from monitoring.steps.checks import drift_step
from pipelines.local.runs import run_pipeline
from training.progress import progress
from training.registry.verified import load_verified
from training.registry.versions import list_versions

MODEL_NAME = "kfloop-demo"
SCHEMA = "schema.yaml"


def _timed(steps: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    progress(f"== {name}")
    start = time.monotonic()
    result = fn()
    steps[name] = round(time.monotonic() - start, 2)
    return result


def run_demo(workdir: Path, *, serve: bool = False) -> dict[str, Any]:
    """(a) first training, promoted; (b) stable batch: no drift, no retrain; (c) drifted batch: drift, retrain,
    gate, decision; then the champion loaded with ``load_verified`` (its files checked, then ``mlflow.pyfunc``) predicts. Returns the summary.

    With ``serve`` the batches reach the checks through serving (:func:`_served_loop`) and the summary gains
    ``serving``.

    The demo owns ``<workdir>/demo`` (MLflow DB, the data store its DVC data is pushed to, trigger state) and
    starts it afresh; ``next_commands`` are the commands that look at its results, as a user types them.
    """
    root = workdir / "demo"
    shutil.rmtree(root, ignore_errors=True)
    env = load_environment(root)
    activate(env)
    steps: dict[str, float] = {}
    start = time.monotonic()
    data = _timed(steps, "data (dvc repro + push)", lambda: ensure_demo_data(root / DEFAULT_STORE_DIR))
    common = {"model_name": MODEL_NAME, "promotion": {"floor": 0.6}}
    first = _timed(steps, "(a) first training", lambda: run_pipeline(
        "training", {**common, "dataset_uri": str(data.train), "schema_uri": str(DATA_DIR / SCHEMA)}, env=env))
    serving = None
    if serve:
        stable, drifted, serving = _served_loop(root, data, common, env, steps)
    else:
        stable = _timed(steps, "(b) drift check: stable batch", lambda: run_pipeline(
            "drift", {**common, "current_uri": str(data.stable)}, env=env))
        drifted = _timed(steps, "(c) drift check: drifted batch", lambda: run_pipeline(
            "drift", {**common, "current_uri": str(data.drifted)}, env=env))
    prediction = _timed(steps, "champion via mlflow.pyfunc", lambda: _predict_with_champion(data.drifted))
    steps["total"] = round(time.monotonic() - start, 2)
    summary = {"model_name": MODEL_NAME, "workdir": str(root), "tracking_uri": redact(env.tracking_uri),
               "data_md5": data.md5, "first_training": first, "stable_batch": stable, "drifted_batch": drifted,
               "champion_prediction": prediction, "versions": _versions(), "seconds": steps,
               "next_commands": next_commands(root, env.tracking_uri)}
    return summary if serving is None else {**summary, "serving": serving}


def _served_loop(root: Path, data: DemoData, common: dict[str, Any], env: Environment,
                 steps: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The loop through ``kfloop serve-model --log-dir <root>/inference-logs``: the champion (v1) serves the stable
    batch's rows, then the drifted batch's; each window's drift pipeline reads the window's logged requests as the
    current batch (``current_logs_uri``, the window as ``drift.logs_since``; the batch's table as the data a
    retraining trains on), beside a check of the batch's table itself (which must agree); then serve-model
    restarts on the champion and answers a few more. The stable batch's and the drifted batch's summaries, and
    ``serving``: per window what was sent, logged and read back, both verdicts, and the versions that answered.
    """
    from pipelines.operations.demo_serving import ServeModel, logged

    logs, log = root / "inference-logs", root / "serve-model.log"
    server = _timed(steps, "serve-model: start (v1)", lambda: ServeModel(MODEL_NAME, logs, log))
    try:
        stable_rows = _timed(steps, "serve-model: stable batch", lambda: server.send(pd.read_parquet(data.stable)))
        # the stable window is all the logs hold yet: any window back to before serve-model started
        stable = _timed(steps, "(b) drift check: stable batch, from the logs", lambda: _check_logs(
            common, logs, _seconds_since(stable_rows.start, margin_s=60), data.stable, env))
        stable_table = _timed(steps, "(b) drift check: stable batch, its table", lambda: _check_table(data.stable))
        drifted_rows = _timed(steps, "serve-model: drifted batch",
                              lambda: server.send(pd.read_parquet(data.drifted)))
        drifted_table = _timed(steps, "(c) drift check: drifted batch, its table",
                               lambda: _check_table(data.drifted))
        # the window reaches back past the drifted requests by half the gap to the stable ones: the pipeline reads
        # the logs seconds after it starts, and the stable window lies a whole pipeline run earlier
        gap_s = (drifted_rows.start - stable_rows.end).total_seconds()
        drifted = _timed(steps, "(c) drift check: drifted batch, from the logs", lambda: _check_logs(
            common, logs, _seconds_since(drifted_rows.start, margin_s=math.floor(gap_s / 2)), data.drifted, env))
    finally:
        server.stop()
    server = _timed(steps, "serve-model: restart (champion)", lambda: ServeModel(MODEL_NAME, logs, log))
    try:
        after = _timed(steps, "serve-model: champion answers",
                       lambda: server.send(pd.read_parquet(data.drifted).head(100)))
    finally:
        server.stop()
    windows = {"stable_batch": (stable_rows, stable, stable_table),
               "drifted_batch": (drifted_rows, drifted, drifted_table)}
    serving = {"log_dir": str(logs),
               **{name: {**logged(logs, window), "drifted_from_logs": check["drifted"],
                         "drifted_from_table": table} for name, (window, check, table) in windows.items()},
               "after_retraining": logged(logs, after)}
    return stable, drifted, serving


def _seconds_since(at: datetime, *, margin_s: int) -> str:
    """A ``logs_since`` window reaching from now back to ``margin_s`` seconds before ``at``."""
    return f"{math.ceil((datetime.now(timezone.utc) - at).total_seconds()) + margin_s}s"


def _check_logs(common: dict[str, Any], logs: Path, since: str, retrain: Path, env: Environment) -> dict[str, Any]:
    """The drift pipeline on the requests logged under ``logs`` in ``since``; a retraining trains on ``retrain``."""
    return run_pipeline("drift", {**common, "current_logs_uri": str(logs), "retrain_uri": str(retrain),
                                  "drift": {"logs_since": since}}, env=env)


def _check_table(path: Path) -> bool:
    """The drift verdict on the batch's table, against the champion, the trigger left alone."""
    return drift_step(current_uri=str(path), reference_uri="", schema_uri="", model_name=MODEL_NAME, policy={},
                      report_out="").drift.drifted


def next_commands(workdir: Path, tracking_uri: str) -> list[str]:
    """Status, history, report, reproduce and the MLflow UI of the demo's state in ``workdir``, as shell commands
    that work from any directory."""
    kfloop = f"kfloop --workdir {shlex.quote(str(workdir))}"
    ui = (f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri)} --port 5000"
          if tracking_uri.startswith("sqlite:") else f"open {redact(tracking_uri)} (the MLflow server the demo used)")
    return [f"{kfloop} status --model {MODEL_NAME}", f"{kfloop} history --model {MODEL_NAME}",
            f"{kfloop} report --model {MODEL_NAME} --out {shlex.quote(str(workdir / 'report.html'))}",
            f"{kfloop} reproduce 1 --model {MODEL_NAME}", ui]


def _predict_with_champion(path) -> dict[str, Any]:
    model = load_verified(MODEL_NAME, "champion")
    rows = pd.read_parquet(path).head(5)  # whole rows: the model reads its features, the check knows the rest
    out = model.predict(rows)
    return {"model_uri": f"models:/{MODEL_NAME}@champion", "rows": len(rows),
            "predictions": out["prediction"].tolist()}


def _versions() -> list[dict[str, Any]]:
    return list_versions(MODEL_NAME)


def format_summary(s: dict[str, Any]) -> str:
    """The demo summary as a readable table."""
    lines = [f"kfloop demo: model '{s['model_name']}', state in {s['workdir']}", "",
             f"{'version':<8} {'decision':<11} {'champion':<9} {'accuracy':>9} {'roc_auc':>8}  reason"]
    for v in s["versions"]:
        m = v["metrics"]
        lines.append(f"{v['version']:<8} {v['decision']:<11} {('yes' if v['champion'] else ''):<9} "
                     f"{m.get('accuracy', float('nan')):>9.4f} {m.get('roc_auc', float('nan')):>8.4f}  {v['reason']}")
    lines.append("")
    for key, label in (("stable_batch", "stable batch "), ("drifted_batch", "drifted batch")):
        d = s[key]
        retrain = d["retrain"]
        what = (f"retrained -> v{retrain['model_version']} {'promoted' if retrain['promoted'] else 'not promoted'}"
                if retrain else "no retrain")
        lines.append(f"{label}: drifted={d['drifted']} share={d['share_drifted_columns']:.2f} ({what})")
    if "serving" in s:
        lines += _serving_lines(s["serving"])
    pred = s["champion_prediction"]
    lines += [f"champion {pred['model_uri']} predicts {pred['predictions']} for {pred['rows']} rows", "",
              "time per step (s): " + ", ".join(f"{k} {v}" for k, v in s["seconds"].items()), "",
              "next: status, history, report, reproduce v1 and the MLflow UI (http://127.0.0.1:5000):",
              *(f"  {command}" for command in s["next_commands"])]
    return "\n".join(lines)


def _serving_lines(serving: dict[str, Any]) -> list[str]:
    """``--serve``'s part of the summary: per window what serve-model was sent and logged, and the verdicts."""
    lines = [f"serve-model (inference logs in {serving['log_dir']}):"]
    for key, label in (("stable_batch", "stable batch "), ("drifted_batch", "drifted batch"),
                       ("after_retraining", "champion     ")):
        w = serving[key]
        verdicts = (f", drifted from logs={w['drifted_from_logs']} from table={w['drifted_from_table']}"
                    if "drifted_from_logs" in w else "")
        lines.append(f"  {label}: {w['requests_sent']} requests / {w['rows_sent']} rows sent, {w['requests_logged']} / "
                     f"{w['rows_logged']} logged, served by v{', v'.join(w['versions'])}{verdicts}")
    return [*lines, ""]

"""``kfloop demo``: the whole loop on the demo data, from a clean demo workdir."""
from __future__ import annotations

import shlex
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from data.demo import DATA_DIR, ensure_demo_data
from data.dvc_store import DEFAULT_STORE_DIR
from data.redaction import redact
from data.settings import activate, load_environment
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


def run_demo(workdir: Path) -> dict[str, Any]:
    """(a) first training, promoted; (b) stable batch: no drift, no retrain; (c) drifted batch: drift, retrain,
    gate, decision; then the champion loaded with ``load_verified`` (its files checked, then ``mlflow.pyfunc``) predicts. Returns the summary.

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
    stable = _timed(steps, "(b) drift check: stable batch", lambda: run_pipeline(
        "drift", {**common, "current_uri": str(data.stable)}, env=env))
    drifted = _timed(steps, "(c) drift check: drifted batch", lambda: run_pipeline(
        "drift", {**common, "current_uri": str(data.drifted)}, env=env))
    prediction = _timed(steps, "champion via mlflow.pyfunc", lambda: _predict_with_champion(data.drifted))
    steps["total"] = round(time.monotonic() - start, 2)
    return {"model_name": MODEL_NAME, "workdir": str(root), "tracking_uri": redact(env.tracking_uri),
            "data_md5": data.md5, "first_training": first, "stable_batch": stable, "drifted_batch": drifted,
            "champion_prediction": prediction, "versions": _versions(), "seconds": steps,
            "next_commands": next_commands(root, env.tracking_uri)}


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
    pred = s["champion_prediction"]
    lines += [f"champion {pred['model_uri']} predicts {pred['predictions']} for {pred['rows']} rows", "",
              "time per step (s): " + ", ".join(f"{k} {v}" for k, v in s["seconds"].items()), "",
              "next: status, history, report, reproduce v1 and the MLflow UI (http://127.0.0.1:5000):",
              *(f"  {command}" for command in s["next_commands"])]
    return "\n".join(lines)

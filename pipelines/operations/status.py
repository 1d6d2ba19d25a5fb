"""``kfloop status``, ``kfloop history`` and ``kfloop rollback``: what the loop did, read from MLflow (the registry,
its recorded champion history, the drift and quality checks) and the trigger's state; and undoing a promotion."""
from __future__ import annotations

import getpass
import time
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from components.run_starters import trigger_store
from data.fileio import utc_iso
from data.redaction import redact
from data.settings import Environment
from monitoring.records import drift_checks, quality_checks, trigger_status
from monitoring.trigger import TriggerPolicy
from training.launch.backends import step_backend
from training.registry.versions import champion_history, get_champion, holdout_metrics, list_versions, rollback

RECENT_RUNS = 5


def status(model_name: str, *, env: Environment, trigger_policy: dict[str, Any]) -> dict[str, Any]:
    """The champion (version, since, why, metrics, data hash, commit), the last drift check, the last quality
    check, the trigger's cooldown state and the most recent training runs of ``model_name``.

    Raises:
        ValueError: ``model_name`` is not registered.
        monitoring.trigger.TriggerStateError: the trigger state is unusable.
    """
    client = mlflow.MlflowClient()
    _require_model(client, model_name, env)
    champion = get_champion(model_name, client=client)
    moves = [m for m in champion_history(model_name, client=client) if champion and m.version == champion.version]
    checks = drift_checks(model_name, limit=1)
    quality = quality_checks(model_name, limit=1)
    policy = TriggerPolicy.from_dict(trigger_policy)
    return {
        "model_name": model_name, "tracking_uri": redact(env.tracking_uri),
        "champion": None if champion is None else {
            "version": champion.version, "run_id": champion.run_id,
            "since": moves[-1].at if moves else champion.record.promoted_at,
            "how": moves[-1].action if moves else "unrecorded", "reason": moves[-1].reason if moves else "",
            "by": moves[-1].actor if moves else "",
            "metrics": holdout_metrics(client, champion.run_id) if champion.run_id else {},
            "data_md5": champion.record.data_md5, "git_commit": champion.record.git_commit,
            "drift_report_uri": champion.record.drift_report_uri,
            "quality_report_uri": champion.record.quality_report_uri},
        "last_drift_check": ({k: checks[-1][k] for k in ("at", "drifted", "share_drifted_columns",
                                                          "champion_version", "data_md5", "run_id")}
                             | {"drifted_columns": [c for c, v in checks[-1]["columns"].items() if v["drifted"]]}
                             if checks else None),
        "last_quality_check": quality[-1] if quality else None,
        "trigger": trigger_status(_trigger_store(model_name, env), model_name,
                                  cooldown_seconds=policy.cooldown_seconds, now=time.time()),
        "recent_runs": list_versions(model_name, client=client)[-RECENT_RUNS:][::-1],
    }


def history(model_name: str, *, env: Environment) -> dict[str, Any]:
    """Every version (decision, reason, metrics, who/what started it, when it was champion) and every recorded
    move of ``champion``.

    Raises:
        ValueError: ``model_name`` is not registered.
        monitoring.trigger.TriggerStateError: the trigger state is unusable.
    """
    client = mlflow.MlflowClient()
    _require_model(client, model_name, env)
    moves = champion_history(model_name, client=client)
    versions = list_versions(model_name, client=client)
    fired = _fired_runs(model_name, env)
    for v in versions:
        v["triggered_by"] = fired.get(v["pipeline_run_id"]) or fired.get(v["version"]) or (
            f"manual or CI run {v['pipeline_run_id']}")
        v["champion_periods"] = _periods(moves, v["version"])
    return {"model_name": model_name, "versions": versions, "champion_moves": [m.to_dict() for m in moves]}


def rollback_champion(model_name: str, *, to: str | None, reason: str, env: Environment) -> dict[str, Any]:
    """Move ``champion`` back (see :func:`training.registry.versions.rollback`), under the promote step's lock.

    Raises:
        ValueError: nothing to roll back to, or the target may not serve (the message says why).
    """
    result = rollback(model_name, to=to, reason=reason, actor=getpass.getuser(),
                      lock=step_backend().promotion_lock(model_name, env.workdir))
    return {"model_name": model_name, **result.to_dict()}


def format_status(s: dict[str, Any]) -> str:
    """:func:`status` as a readable block."""
    lines = [f"model {s['model_name']}  ({s['tracking_uri']})"]
    c = s["champion"]
    if c is None:
        lines.append("champion: none")
    else:
        lines += [f"champion: v{c['version']} since {c['since']} ({c['how']} by {c['by']})",
                  f"  metrics: {_metrics(c['metrics'])}",
                  f"  data md5 {c['data_md5']}, commit {c['git_commit']}",
                  f"  why: {c['reason']}"]
    d = s["last_drift_check"]
    lines.append("last drift check: none" if d is None else
                 f"last drift check: {d['at']} {'DRIFTED' if d['drifted'] else 'no drift'} "
                 f"(share {d['share_drifted_columns']:.2f}; columns {', '.join(d['drifted_columns']) or 'none'}; "
                 f"champion v{d['champion_version']})")
    q = s["last_quality_check"]
    lines.append("last quality check: none" if q is None else _quality_line(q))
    t = s["trigger"]
    fired = t["last_fired"]
    lines.append(f"trigger: {'in cooldown until ' + t['cooldown_until'] if t['in_cooldown'] else 'ready'}; last "
                 f"fired {fired['at'] + ' (run ' + str(fired['run_id']) + ')' if fired else 'never'}")
    lines += ["", "recent runs:", _version_table(s["recent_runs"])]
    return "\n".join(lines)


def format_history(h: dict[str, Any]) -> str:
    """:func:`history` as two tables: versions, then the champion's moves."""
    lines = [f"model {h['model_name']}: versions", _version_table(h["versions"], with_trigger=True), "",
             "champion moves:", f"{'#':>3}  {'at':<25} {'to':<5} {'from':<5} {'how':<9} {'by':<22} reason"]
    for m in h["champion_moves"]:
        lines.append(f"{m['seq']:>3}  {m['at']:<25} v{m['version']:<4} {_v(m['previous']):<5} {m['action']:<9} "
                     f"{m['actor'][:22]:<22} {m['reason']}")
    return "\n".join(lines)


def _require_model(client: Any, model_name: str, env: Environment) -> None:
    try:
        client.get_registered_model(model_name)
    except MlflowException as e:
        raise ValueError(f"model '{model_name}' is not registered in {redact(env.tracking_uri)}; pass --model NAME or "
                         "--workdir DIR (or set MLFLOW_TRACKING_URI)") from e


def _trigger_store(model_name: str, env: Environment):
    """The trigger state where this place's backend keeps it (:func:`training.launch.backends.step_backend`): the
    trigger's ConfigMap (Kubernetes), else the workdir's file (this machine)."""
    return trigger_store(step_backend(), model_name, env.workdir)


def _fired_runs(model_name: str, env: Environment) -> dict[str, str]:
    """Run id -> 'drift on data <hash> at <time>' for every run the trigger started."""
    entry = _trigger_store(model_name, env).load()["models"].get(model_name) or {"fired": []}
    return {str(f["run_id"]): f"drift trigger: data {f['data_hash']} at {utc_iso(f['at'])}"
            for f in entry["fired"] if f["run_id"]}


def _periods(moves: list, version: str) -> list[dict[str, str | None]]:
    """When ``version`` was champion: [{from, until}] (``until`` None: still is)."""
    out = []
    for i, m in enumerate(moves):
        if m.version == version:
            out.append({"from": m.at, "until": moves[i + 1].at if i + 1 < len(moves) else None})
    return out


def _version_table(versions: list[dict[str, Any]], *, with_trigger: bool = False) -> str:
    head = (f"{'version':<8} {'decision':<11} {'champion':<9} {'accuracy':>9} {'roc_auc':>8}  "
            f"{'vs baseline / linear':<32} ")
    lines = [head + ("triggered by / " if with_trigger else "") + "reason"]
    for v in versions:
        m = v["metrics"]
        lines.append(f"v{v['version']:<7} {str(v['decision']):<11} {('yes' if v['champion'] else ''):<9} "
                     f"{m.get('accuracy', float('nan')):>9.4f} {m.get('roc_auc', float('nan')):>8.4f}  "
                     f"{_vs_baseline(v):<32} " + (f"{v['triggered_by']} / " if with_trigger else "")
                     + v["reason"][:160])
    return "\n".join(lines)


def _vs_baseline(version: dict[str, Any]) -> str:
    """``<primary metric> <candidate> vs <baseline> / <linear baseline>``, or ``-`` for versions gated before
    baselines (and ``-`` for the linear one before it was fitted)."""
    metric = version.get("primary_metric")
    baseline = version.get("baseline", {}).get(metric)
    if baseline is None:
        return "-"
    linear = version.get("linear", {}).get(metric)
    return (f"{metric} {version['metrics'].get(metric, float('nan')):.3f} vs {baseline:.3f} / "
            f"{'-' if linear is None else f'{linear:.3f}'}")


def _metrics(m: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in m.items()) or "none recorded"


def _v(version: str | None) -> str:
    return f"v{version}" if version else "-"


def _quality_line(q: dict[str, Any]) -> str:
    """The last quality check in one line: the verdict, and for ``insufficient_labels`` what fell short."""
    if q["verdict"] == "insufficient_labels":
        return (f"last quality check: {q['at']} INSUFFICIENT LABELS ({'; '.join(q['labels']['short'])}; "
                f"champion v{q['champion_version']})")
    return (f"last quality check: {q['at']} {'DEGRADED' if q['degraded'] else 'not degraded'} "
            f"({q['metric']} {q['value']:.4f} vs holdout {q['baseline']:.4f}, {q['rows']} rows; "
            f"champion v{q['champion_version']})")

"""``kfloop report``: one self-contained HTML page (inline SVG charts, no script, no network) of a model's life:
champion timeline, holdout metrics across versions, drift share over time, per-column drift of the last check,
the champion's quality on labelled rows over time and the last quality check with its slices."""
from __future__ import annotations

import html
import io
from datetime import datetime
from pathlib import Path
from typing import Any

from data.fileio import atomic_write_text
from training.figures import pyplot

CHART_IDS = ("champion-timeline", "metrics-by-version", "drift-share", "last-drift-columns", "quality-over-time")
"""The ``id`` of each chart's ``<figure>`` (a test renders the page and looks for them)."""
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
figure{display:inline-block;margin:0 1em 1.5em 0;vertical-align:top}figcaption{font-weight:600;margin-bottom:.3em}
figure svg{width:520px;height:auto}table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}.none{color:#888;font-style:italic}"""


def write_report(out: str | Path, *, model_name: str, history: dict[str, Any], drift: list[dict[str, Any]],
                 quality: list[dict[str, Any]], status: dict[str, Any]) -> Path:
    """Render the page from :func:`pipelines.operations.status.history`, :func:`monitoring.records.drift_checks`,
    :func:`monitoring.records.quality_checks` and :func:`pipelines.operations.status.status` and write it
    atomically to ``out``.

    Returns:
        ``out`` as a Path.
    """
    versions, moves = history["versions"], history["champion_moves"]
    champion = status["champion"]
    charts = [("champion-timeline", "Champion over time", _timeline(moves)),
              ("metrics-by-version", "Holdout metrics by version (each on its own data's holdout)",
               _metrics(versions)),
              ("drift-share", "Share of drifted columns per check", _drift_share(drift)),
              ("last-drift-columns", "Per-column drift, last check", _last_columns(drift)),
              ("quality-over-time", "Champion quality on labelled rows (bar: interval; dashed: holdout)",
               _quality(quality))]
    body = [f"<h1>kfloop: {html.escape(model_name)}</h1>",
            f"<p>champion: <b>{'v' + champion['version'] if champion else 'none'}</b>"
            + (f" since {html.escape(str(champion['since']))}" if champion else "")
            + f" &middot; {len(versions)} version(s) &middot; {len(drift)} drift check(s) &middot; "
            f"{len(quality)} quality check(s)</p>"]
    for chart_id, title, svg in charts:
        body.append(f'<figure class="chart" id="{chart_id}"><figcaption>{title}</figcaption>'
                    + (svg or '<p class="none">nothing recorded yet</p>') + "</figure>")
    body.append("<h2>Versions</h2>" + _table(
        ["version", "decision", "accuracy", "roc_auc", "primary metric", "candidate", "baseline", "linear baseline",
         "reason"], [
            [f"v{v['version']}" + (" (champion)" if v["champion"] else ""), v["decision"],
             _fmt(v["metrics"].get("accuracy")), _fmt(v["metrics"].get("roc_auc")), v.get("primary_metric") or "-",
             _fmt(v["metrics"].get(v.get("primary_metric"))), _fmt(v.get("baseline", {}).get(v.get("primary_metric"))),
             _fmt(v.get("linear", {}).get(v.get("primary_metric"))), v["reason"]] for v in versions]))
    body.append('<h2 id="last-quality-check">Last quality check</h2>' + _last_quality(quality))
    body.append("<h2>Champion moves</h2>" + _table(["at", "to", "from", "how", "by", "reason"], [
        [m["at"], f"v{m['version']}", f"v{m['previous']}" if m["previous"] else "-", m["action"], m["actor"],
         m["reason"]] for m in moves]))
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>kfloop report: "
            f"{html.escape(model_name)}</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")
    return atomic_write_text(out, page)


def _timeline(moves: list[dict[str, Any]]) -> str | None:
    if not moves:
        return None
    plt = pyplot()
    times = [datetime.fromisoformat(m["at"]) for m in moves]
    versions = [int(m["version"]) for m in moves]
    fig, ax = plt.subplots(figsize=(6.5, 3))
    ax.step(times + [max(times[-1], datetime.now(times[-1].tzinfo))], versions + versions[-1:], where="post")
    for t, v, m in zip(times, versions, moves):
        ax.plot([t], [v], "v" if m["action"] == "rollback" else "^",
                color="tab:red" if m["action"] == "rollback" else "tab:green", ms=9)
    ax.set(ylabel="champion version", yticks=sorted(set(versions)))
    fig.autofmt_xdate()
    return _svg(fig)


def _metrics(versions: list[dict[str, Any]]) -> str | None:
    if not versions:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3))
    x = [int(v["version"]) for v in versions]
    for name in ("accuracy", "roc_auc", "f1_macro"):
        ax.plot(x, [v["metrics"].get(name, float("nan")) for v in versions], marker="o", label=name)
    colors = {"promote": "tab:green", "reject": "tab:red", "superseded": "tab:orange"}
    for v in versions:
        ax.axvspan(int(v["version"]) - 0.4, int(v["version"]) + 0.4, alpha=0.08,
                   color=colors.get(v["decision"], "grey"))
    ax.set(xlabel="version (band: green promote, red reject, orange superseded)", xticks=x)
    ax.legend(fontsize=8)
    return _svg(fig)


def _drift_share(drift: list[dict[str, Any]]) -> str | None:
    if not drift:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3))
    times = [datetime.fromisoformat(d["at"]) for d in drift]
    ax.plot(times, [d["share_drifted_columns"] for d in drift], color="grey", zorder=1)
    ax.scatter(times, [d["share_drifted_columns"] for d in drift], zorder=2,
               c=["tab:red" if d["drifted"] else "tab:green" for d in drift])
    ax.set(ylim=(0, 1.05), ylabel="share drifted (red: drifted)")
    fig.autofmt_xdate()
    return _svg(fig)


def _last_columns(drift: list[dict[str, Any]]) -> str | None:
    if not drift:
        return None
    plt = pyplot()
    columns = drift[-1]["columns"]
    names = list(columns)
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(names) + 1.2))
    ax.barh(names, [c["score"] for c in columns.values()],
            color=["tab:red" if c["drifted"] else "tab:green" for c in columns.values()])
    for i, c in enumerate(columns.values()):
        ax.plot([c["threshold"]] * 2, [i - 0.4, i + 0.4], color="black")
    ax.set(xlabel="score (bar), threshold (line); red: drifted", title=drift[-1]["at"])
    ax.invert_yaxis()
    return _svg(fig)


def _quality(quality: list[dict[str, Any]]) -> str | None:
    if not quality:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3))
    times = [datetime.fromisoformat(q["at"]) for q in quality]
    values = [q["value"] for q in quality]
    for t, q in zip(times, quality):
        if q["ci_low"] is not None:
            ax.plot([t, t], [q["ci_low"], q["ci_high"]], color="grey", lw=3, alpha=0.5, zorder=1)
    ax.step(times, [q["baseline"] for q in quality], where="post", ls="--", color="black", label="holdout")
    ax.scatter(times, values, zorder=2, c=["tab:red" if q["degraded"] else "tab:green" for q in quality])
    ax.set(ylabel=f"{quality[-1]['metric']} (red: degraded)")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    return _svg(fig)


def _last_quality(quality: list[dict[str, Any]]) -> str:
    if not quality:
        return '<p class="none">none</p>'
    q = quality[-1]
    interval = "-" if q["ci_low"] is None else f"[{q['ci_low']:.4f}, {q['ci_high']:.4f}]"
    return (f"<p><b>{'DEGRADED' if q['degraded'] else 'not degraded'}</b> at {html.escape(q['at'])}, champion "
            f"v{html.escape(str(q['champion_version']))}: {html.escape(q['reason'])}</p>"
            + _table(["metric", "value", "interval", "holdout", "rows"],
                     [[q["metric"], _fmt(q["value"]), interval, _fmt(q["baseline"]), q["rows"]]])
            + _table(["slice", "rows", "value", "holdout", "skipped"],
                     [[f"{s['column']}={s['value']}", s["rows"], _fmt(s["score"]), _fmt(s["baseline"]),
                       s["skipped"] or ""] for s in q.get("slices", [])]))


def _svg(fig) -> str:
    plt = pyplot()
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{cells}</tr>{body}</table>" if rows else '<p class="none">none</p>'


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"

"""``kfloop report``'s page rendered by headless Chromium (Debian's ``chromium``): every chart is in the DOM and
the screenshot shows them; and the page loads nothing from the network."""
from __future__ import annotations

import re
import subprocess

import numpy as np
from binaries import require_binary

from pipelines.operations.report import CHART_IDS, write_report


def _inputs() -> dict:
    moves = [{"seq": 1, "at": "2026-11-01T10:00:00+00:00", "version": "1", "previous": None, "action": "promote",
              "reason": "promote: accuracy 0.71 (no champion)", "actor": "pipeline run a"},
             {"seq": 2, "at": "2026-11-08T10:00:00+00:00", "version": "3", "previous": "1", "action": "promote",
              "reason": "promote: accuracy 0.74 vs champion 0.71", "actor": "pipeline run c"},
             {"seq": 3, "at": "2026-11-09T08:00:00+00:00", "version": "1", "previous": "3", "action": "rollback",
              "reason": "latency regression", "actor": "alice"}]
    versions = [{"version": str(v), "decision": d, "reason": d, "champion": v == 1,
                 "metrics": {"accuracy": a, "roc_auc": a + 0.05, "f1_macro": a - 0.03}}
                for v, d, a in ((1, "promote", 0.71), (2, "reject", 0.69), (3, "promote", 0.74))]
    columns = {"age": {"method": "ks", "score": 0.01, "threshold": 0.05, "drifted": True},
               "plan": {"method": "chisquare", "score": 0.4, "threshold": 0.05, "drifted": False}}
    drift = [{"at": f"2026-11-0{d}T12:00:00+00:00", "drifted": s > 0.5, "share_drifted_columns": s,
              "columns": columns} for d, s in ((2, 0.1), (5, 0.3), (7, 0.7))]
    slices = [{"column": "plan", "value": "basic", "rows": 400, "score": 0.31, "baseline": 0.78, "drop": 0.47,
               "interval": [0.27, 0.35], "skipped": None},
              {"column": "plan", "value": "premium", "rows": 12, "score": None, "baseline": 0.8, "drop": None,
               "interval": None, "skipped": "12 rows < min_slice_rows 30"}]
    quality = [{"at": f"2026-11-0{d}T13:00:00+00:00", "run_id": f"r{d}", "degraded": v < 0.7, "metric": "accuracy",
                "value": v, "baseline": 0.78, "ci_low": v - 0.02, "ci_high": v + 0.02, "rows": 800,
                "reason": f"{'degraded' if v < 0.7 else 'not degraded'}: accuracy {v} vs 0.78", "champion_version": "1",
                "slices": slices} for d, v in ((3, 0.77), (6, 0.74), (8, 0.32))]
    status = {"champion": {"version": "1", "since": moves[-1]["at"]}}
    return {"history": {"versions": versions, "champion_moves": moves}, "drift": drift, "quality": quality,
            "status": status}


def test_page_is_self_contained_with_every_chart(tmp_path):
    page = write_report(tmp_path / "r.html", model_name="m", **_inputs()).read_text()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page) and "<script" not in page
    for chart in CHART_IDS:
        start = page.index(f'id="{chart}"')
        assert "<svg" in page[start:page.index("</figure>", start)], chart
    assert "latency regression" in page and "alice" in page
    last = page[page.index('id="last-quality-check"'):]
    assert "DEGRADED" in last and "accuracy 0.32 vs 0.78" in last and "plan=basic" in last
    assert "12 rows &lt; min_slice_rows 30" in last


def test_empty_model_renders_placeholders(tmp_path):
    page = write_report(tmp_path / "r.html", model_name="m", history={"versions": [], "champion_moves": []},
                        drift=[], quality=[], status={"champion": None}).read_text()
    assert page.count("nothing recorded yet") == len(CHART_IDS) and "<svg" not in page


def test_chromium_renders_the_charts(tmp_path):
    chromium = require_binary("chromium", "chromium-browser", package="chromium")
    path = write_report(tmp_path / "report.html", model_name="m", **_inputs())
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=2000"]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    for chart in CHART_IDS:
        figure = re.search(rf'<figure class="chart" id="{chart}">(.*?)</figure>', dom, re.S)
        assert figure and figure.group(1).count("<path") >= 5, chart
    assert "plan=basic" in dom[dom.index('id="last-quality-check"'):]
    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,1400", path.as_uri()],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (1400, 1200)
    colored = np.abs(pixels - pixels.mean(axis=2, keepdims=True)).max(axis=2) > 0.15  # lines, bars, markers
    assert colored.mean() > 0.005 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50

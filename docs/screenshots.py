"""Regenerate the pictures of the README and the docs site (docs/operations.md) from a real demo run:

    .venv/bin/python docs/screenshots.py [--workdir DIR]

runs ``kfloop demo`` (unless DIR already holds one), writes ``kfloop report`` of the demo model, starts a real
``mlflow server`` on the demo's database and takes headless-Chromium screenshots of the report
(``docs/report.png``), of the MLflow registry page of the model (``docs/mlflow.png``) and of the champion's
training run showing its gate figure (``docs/mlflow-run.png``).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
sys.path.insert(0, str(DOCS.parent / "tests"))

from cluster.mlflow_server import MlflowServer  # noqa: E402  (tests/ helper: own process group, /health deadline)

from pipelines.cli.commands import main  # noqa: E402
from pipelines.operations.demo_loop import MODEL_NAME  # noqa: E402


def screenshot(url: str, out: Path, *, width: int, height: int, wait_ms: int) -> None:
    """PNG of ``url`` by headless Chromium after ``wait_ms`` of virtual time, reduced to a 96-colour palette."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium binary on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--virtual-time-budget={wait_ms}",
                        f"--window-size={width},{height}", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=300)
    from PIL import Image

    Image.open(out).convert("RGB").quantize(colors=96).save(out, optimize=True)  # small enough for the repository
    print(out)


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "kfloop-screenshots")
    args = parser.parse_args()
    demo = args.workdir / "demo"
    if not (demo / "mlflow.db").exists():
        assert main(["--workdir", str(args.workdir), "demo"]) == 0
    report = demo / "report.html"
    assert main(["--workdir", str(demo), "report", "--model", MODEL_NAME, "--out", str(report)]) == 0
    screenshot(report.as_uri(), DOCS / "report.png", width=1150, height=1250, wait_ms=2000)
    server_root = Path(tempfile.mkdtemp(prefix="kfloop-mlflow-ui-"))
    shutil.copy(demo / "mlflow.db", server_root / "mlflow.db")
    server = MlflowServer(root=server_root).start()
    try:
        screenshot(f"{server.url}/#/models/{MODEL_NAME}", DOCS / "mlflow.png", width=1300, height=800,
                   wait_ms=15000)
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=server.url)
        run = client.get_run(client.get_model_version_by_alias(MODEL_NAME, "champion").run_id)
        screenshot(f"{server.url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/artifacts/"
                   "figures/gate_vs_champion.png", DOCS / "mlflow-run.png", width=1300, height=800, wait_ms=15000)
    finally:
        server.stop()
        shutil.rmtree(server_root, ignore_errors=True)


if __name__ == "__main__":
    main_()

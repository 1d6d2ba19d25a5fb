"""The loop end to end in real containers (``make e2e`` runs it after building the image; see deploy/e2e.sh).

Both pipelines are compiled with ``--image IMAGE`` and run from that IR by kfp.local's DockerRunner, each step a
container as a restricted pod runs it: UID 1000, read-only root filesystem, /tmp a tmpfs, HOME=/tmp, the host's
network used on loopback only. The data lives in a moto S3 server, MLflow is a real ``mlflow server`` whose
artifacts go to the same S3; the containers share nothing with the host but the pipeline root (and kfp.local's
empty workspace folder, not writable for UID 1000, so steps work in temp dirs). First training:
promoted; stable batch: no drift, no retrain; drifted batch: drift, retrain (inside the trigger step's container),
gate. The last line printed sums up what ran.

    python tests/e2e_docker.py --image kfloop:SHA    (DOCKER_HOST names the daemon)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import docker
import s3fs
from kfp import components, local

from data.generate import write_demo
from data.settings import load_environment
from fakes.mlflow_server import MlflowServer
from fakes.s3_server import S3Server
from pipelines.compile import compile_pipeline
from pipelines.config import pipeline_params
from pipelines.local.runner import run_local
from training.registry.versions import list_versions

REPO = Path(__file__).resolve().parents[1]
BUCKET = "kfloop-e2e"
MODEL = "kfloop-e2e"
STEP_USER = "1000:1000"
"""The image's user (deploy/Dockerfile)."""


def docker_runner(environment: dict[str, str]) -> local.DockerRunner:
    """Steps as restricted pods: non-root, read-only root, tmpfs /tmp, host network (servers on loopback)."""
    return local.DockerRunner(network_mode="host", user=STEP_USER, read_only=True, tmpfs={"/tmp": ""},
                              environment={**environment, "HOME": "/tmp"})


def upload_demo_data(s3: S3Server, scratch: Path) -> dict[str, str]:
    """The demo's three files and its schema, put in the bucket; returns {name: s3 URI}."""
    fs = s3fs.S3FileSystem(endpoint_url=s3.url, key=s3.env()["AWS_ACCESS_KEY_ID"],
                           secret=s3.env()["AWS_SECRET_ACCESS_KEY"])
    fs.mkdir(BUCKET)
    files = {**write_demo(scratch / "demo"), "schema.yaml": REPO / "data" / "schema.yaml"}
    for name, path in files.items():
        fs.put_file(str(path), f"{BUCKET}/data/{name}")
    return {name: f"s3://{BUCKET}/data/{name}" for name in files}


def s3_objects(s3: S3Server, prefix: str) -> list[str]:
    fs = s3fs.S3FileSystem(endpoint_url=s3.url, key=s3.env()["AWS_ACCESS_KEY_ID"],
                           secret=s3.env()["AWS_SECRET_ACCESS_KEY"])
    return fs.find(f"{BUCKET}/{prefix}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the kfloop image every step runs")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kfloop-e2e-"))
    s3 = S3Server(root=root).start()
    mlflow = None
    try:
        mlflow = MlflowServer(root=root, artifacts_destination=f"s3://{BUCKET}/mlflow", env=s3.env())
        uris = upload_demo_data(s3, root)
        mlflow.start()
        print(f"e2e: S3 {s3.url}, MLflow {mlflow.url} (artifacts s3://{BUCKET}/mlflow)", flush=True)
        os.environ["MLFLOW_TRACKING_URI"] = mlflow.url
        env = load_environment(root / "host")
        env.pipeline_root.mkdir(parents=True)
        os.chown(env.pipeline_root, *(int(i) for i in STEP_USER.split(":")))  # the one dir steps share with the host
        runner = docker_runner({**s3.env(), "MLFLOW_TRACKING_URI": mlflow.url})
        pipelines = {name: components.load_component_from_file(str(compile_pipeline(
            name, root / "compiled" / f"{name}.yaml", image=args.image))) for name in ("training", "drift")}
        common = {"model_name": MODEL, "schema_uri": uris["schema.yaml"], "promotion": {"floor": 0.6}}
        runs, steps = [], 0

        def run(name: str, settings: dict) -> object:
            nonlocal steps
            pipeline = pipelines[name]
            started = time.monotonic()
            done = run_local(pipeline, pipeline_params(pipeline, {**common, **settings}), env, runner=runner)
            steps += len(done.step_seconds)
            runs.append(f"{name} {time.monotonic() - started:.0f} s")
            print(f"e2e: {name} ({settings}) took {time.monotonic() - started:.0f} s", flush=True)
            return done.output

        first = run("training", {"dataset_uri": uris["train.parquet"]})
        versions = list_versions(MODEL)
        assert [v["champion"] for v in versions] == [True], f"first training not promoted: {versions}"
        stable = json.loads(Path(run("drift", {"current_uri": uris["batch_stable.parquet"]}).path).read_text())
        assert not stable["drifted"] and len(list_versions(MODEL)) == 1, f"stable batch retrained: {stable}"
        drifted = json.loads(Path(run("drift", {"current_uri": uris["batch_drifted.parquet"]}).path).read_text())
        versions = list_versions(MODEL)
        assert drifted["drifted"] and len(versions) == 2, f"drifted batch not retrained: {drifted} {versions}"
        retrain = versions[1]
        assert retrain["decision"] in ("promote", "reject") and retrain["git_commit"], retrain
        label = docker.from_env().images.get(args.image).labels["GIT_COMMIT"]  # deploy/image-commit.sh's, via the build
        assert {v["git_commit"] for v in versions} == {label}, f"lineage does not name the image's commit {label}"
        champion = next(v["version"] for v in versions if v["champion"])
        artifacts = s3_objects(s3, "mlflow")
        assert artifacts, "no MLflow artifact reached S3"
        print(f"e2e: ok: {len(runs)} pipeline runs ({', '.join(runs)}), {steps} steps as containers of "
              f"{args.image} (UID {STEP_USER}, read-only root, tmpfs /tmp, data and {len(artifacts)} MLflow "
              f"artifacts in S3): v{first} promoted; stable batch: no drift ({stable['share_drifted_columns']:.2f}), "
              f"no retrain; drifted batch: drift ({drifted['share_drifted_columns']:.2f}), retrained "
              f"v{retrain['version']} gated: {retrain['decision']} ({retrain['reason']}); champion v{champion}")
    except BaseException:
        print(f"e2e: failed; logs under {root}", file=sys.stderr)
        raise
    finally:
        if mlflow is not None:
            mlflow.stop()
        s3.stop()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

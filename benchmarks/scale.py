"""kfloop at scale: validation, building the reference profile, the drift check against it, one rank's training
input, and Evidently's ``DataDriftPreset``, each in its own process with its peak RSS from the OS (``wait4``).

    .venv/bin/python -m benchmarks.scale [--rows 10000000] [--workdir DIR] [--out benchmarks/results/scale.json]

Generates a reference and a current Parquet file (row groups of 500k rows) of ``--rows`` rows x 20 columns (12
numeric, 8 categorical, nulls; 7 columns drift in the current one, see ``benchmarks/drift.py``) and a label, trains
a small classifier on 20k reference rows (the champion whose predictions are profiled and checked), then measures.
Every child runs under a memory cap (``RLIMIT_AS``) and a time cap, so a failure is recorded, not the machine
taken down. Evidently runs on a ladder of sizes (first rows of both files) up to ``--rows`` and stops at the first
failure; its verdicts are compared with kfloop's (profile of the same rows, check of the same rows) at the largest
size it finishes. Writes ``benchmarks/results/scale.json``.

With ``--drift-rows N`` (e.g. 100000000) a second current file of N rows is generated and checked against the same
profile (``drift_100m_*``: disk about 4.8 GB per 100M rows). ``make bench-scale`` passes 100M (``SCALE_DRIFT_ROWS``).

Goals (issues 17 and 30, 10M x 20 on this 2-core machine): drift against the stored profile <= 30 s and <= 1 GiB;
the profile build (predictions included) <= 30 s and <= 1 GiB; validation <= 120 s and <= 3 GiB; training input
<= 1.5 GiB per rank at 1M and 10M rows; drift at 100M <= 300 s, peak RSS within 20% of the 10M run
(``drift_100m_rss_ratio`` <= 1.2). The Ray engine
(issue 30 item 4, ``ray_*``) checks the same current file on a local Ray with this machine's CPUs as workers, its
verdicts compared with the local engine's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from benchmarks.drift import CATEGORICAL, NUMERIC, make_frame
from data.fileio import atomic_write_json
from data.profiles import ReferenceProfile, profile_table
from data.sketches import SketchSettings
from data.tables import sketching_chunks
from data.validation import infer_schema, load_schema, schema_to_yaml, validate
from data.ray_cluster import ray_session
from monitoring.drift import check_drift_profile, evidently_drift
from monitoring.drift_policy import DriftPolicy
from monitoring.ray_drift import RayTable
from training.config import ModelSpec
from training.features import FeatureTransform, encode_target, target_classes
from training.model import Predictor, save_model_dir
from training.model_code import ModelCode

TARGET = "label"
GENERATE_ROWS = 500_000
"""Rows generated (and written as one row group) at a time."""
GIB = 1 << 30
GOALS = {"drift_seconds": 30, "drift_peak_rss_gib": 1, "profile_seconds": 30, "profile_peak_rss_gib": 1,
         "validate_seconds": 120, "validate_peak_rss_gib": 3, "train_input_peak_rss_gib": 1.5,
         "drift_100m_seconds": 300, "drift_100m_rss_ratio": 1.2}


def generate(path: Path, rows: int, *, seed: int, drift: bool) -> None:
    """``rows`` rows in row groups of :data:`GENERATE_ROWS`, a label that depends on two features."""
    with pq.ParquetWriter(path.with_suffix(".tmp"), schema=_arrow_schema()) as writer:
        for i, start in enumerate(range(0, rows, GENERATE_ROWS)):
            frame = make_frame(min(GENERATE_ROWS, rows - start), seed * 10_000 + i, drift=drift)
            score = frame["num_01"].to_numpy() + (frame["cat_01"] == "v3").to_numpy() * 1.5
            frame[TARGET] = np.where(score > 3.2, "yes", "no")
            writer.write_table(pa.Table.from_pandas(frame, schema=_arrow_schema(), preserve_index=False))
    path.with_suffix(".tmp").replace(path)


def _arrow_schema() -> pa.Schema:
    return pa.schema([*(pa.field(c, pa.float64()) for c in NUMERIC), *(pa.field(c, pa.string()) for c in CATEGORICAL),
                      pa.field(TARGET, pa.string())])


def head(path: Path, rows: int, out: Path) -> Path:
    """The first ``rows`` rows of ``path`` as their own Parquet file."""
    if not out.exists():
        with pq.ParquetWriter(out.with_suffix(".tmp"), schema=_arrow_schema()) as writer:
            left = rows
            for batch in pq.ParquetFile(path).iter_batches(batch_size=min(GENERATE_ROWS, rows)):
                writer.write_batch(batch.slice(0, left))
                left -= min(left, batch.num_rows)
                if left == 0:
                    break
        out.with_suffix(".tmp").replace(out)
    return out


def train_champion(reference: Path, out: Path) -> Path:
    """A small MLP on the first 20k reference rows: the champion whose predictions are profiled."""
    frame = next(pq.ParquetFile(reference).iter_batches(batch_size=20_000)).to_pandas()
    torch.manual_seed(0)
    transform = FeatureTransform.fit(frame, numeric=NUMERIC, categorical=CATEGORICAL)
    classes = target_classes(frame[TARGET])
    code = ModelCode.load(ModelSpec(params={"hidden": [16]}))
    model = code.build(transform.n_outputs, len(classes))
    x, y = torch.from_numpy(transform.transform(frame)), torch.from_numpy(encode_target(frame[TARGET], classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return save_model_dir(out, model=model, code=code, n_inputs=transform.n_outputs, n_outputs=len(classes),
                          transform=transform, classes=classes, target=TARGET)


# ------------------------------------------------------------------------------------- stages (one per process)

def stage_profile(work: Path, reference: Path, out: Path) -> dict:
    predictor = Predictor.load(work / "model")
    profile = profile_table(reference, load_schema(work / "schema.yaml"), predict=predictor.predict)
    profile.write(out)
    return {"sketched_columns": sorted(n for n, c in profile.columns.items() if not c.exact),
            "profile_bytes": out.stat().st_size}


def stage_drift(work: Path, profile: Path, current: Path) -> dict:
    predictor = Predictor.load(work / "model")
    with sketching_chunks(current, CATEGORICAL) as (chunks, _):
        result = check_drift_profile(ReferenceProfile.read(profile), chunks, numeric=NUMERIC, categorical=CATEGORICAL,
                                     policy=DriftPolicy(), report_path=work / "drift.html",
                                     schema=load_schema(work / "schema.yaml"), predict=predictor.predict)
    return {"drifted": result.drifted, "columns": {n: c.to_dict() for n, c in result.columns.items()}}


def stage_ray_drift(work: Path, profile: Path, current: Path) -> dict:
    """:func:`stage_drift` with ``engine: ray``: a local Ray of this machine's CPUs started for it, Ray Data
    reading and sketching the current file in blocks (the champion scoring each block on its worker)."""
    predictor = Predictor.load(work / "model")
    with ray_session(""):
        result = RayTable(str(current), text_columns=CATEGORICAL).drift(
            ReferenceProfile.read(profile), numeric=NUMERIC, categorical=CATEGORICAL, policy=DriftPolicy(engine="ray"),
            report_path=None, schema=load_schema(work / "schema.yaml"), predict=predictor.predict)
    return {"drifted": result.drifted, "columns": {n: c.to_dict() for n, c in result.columns.items()}}


def stage_validate(work: Path, current: Path) -> dict:
    report = validate(current, load_schema(work / "schema.yaml"))
    return {"ok": report.ok, "failures": len(report.failures), "rows": report.n_rows}


def stage_evidently(work: Path, reference: Path, current: Path) -> dict:
    predictor = Predictor.load(work / "model")
    frames = [pd.read_parquet(path) for path in (reference, current)]
    for frame in frames:
        frame["prediction"] = predictor.predict(frame).astype(str)
    verdicts = evidently_drift(*frames, numeric=NUMERIC, categorical=CATEGORICAL, policy=DriftPolicy())
    return {"columns": {n: c.to_dict() for n, c in verdicts.items()}}


STAGES = {"profile": stage_profile, "drift": stage_drift, "ray_drift": stage_ray_drift, "validate": stage_validate,
          "evidently": stage_evidently}


def measure(command: list[str], *, memory_gib: float | None, seconds: int) -> dict:
    """Run ``command`` in its own process under the caps (``memory_gib`` None: no address-space cap): wall seconds,
    CPU seconds (user + system: the figure to read on a shared machine), its peak RSS (GiB) from ``wait4``, the JSON
    line it printed last, or why it failed."""
    cap = resource.RLIM_INFINITY if memory_gib is None else int(memory_gib * GIB)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, preexec_fn=limit,
                                 env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        timer = threading.Timer(seconds, child.kill)
        timer.start()
        _, status, usage = os.wait4(child.pid, 0)
        timer.cancel()
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = {"seconds": round(elapsed, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
              "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 3), "error": None}
    if elapsed >= seconds:
        result["error"] = f"killed at the time cap of {seconds} s"
    elif child.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        memory = "MemoryError" in stderr or "Cannot allocate memory" in stderr or child.returncode == -9
        result["error"] = (f"out of memory under the cap of {memory_gib} GiB: " if memory else "") + \
            f"exit {child.returncode}: {last[:300]}"
    else:
        result["output"] = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    return result


def _stage(name: str, work: Path, *paths: Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.scale", "--stage", name, "--workdir", str(work), *map(str, paths)]


def compare(ours: dict, theirs: dict) -> dict:
    """Verdicts equal (method, threshold, drifted per column) and the largest score difference."""
    differ = sorted(n for n in theirs if (ours[n]["method"], ours[n]["threshold"], ours[n]["drifted"])
                    != (theirs[n]["method"], theirs[n]["threshold"], theirs[n]["drifted"]))
    gaps = [abs(ours[n]["score"] - theirs[n]["score"]) for n in theirs
            if ours[n]["score"] is not None and theirs[n]["score"] is not None]
    return {"verdicts_equal": not differ, "differing_columns": differ, "max_score_difference": max(gaps, default=0.0)}


def run(args: argparse.Namespace) -> int:
    work, rows = args.workdir, args.rows
    work.mkdir(parents=True, exist_ok=True)
    caps = {"memory_gib": args.memory_cap_gib, "seconds": args.time_cap}
    reference, current = work / f"reference-{rows}.parquet", work / f"current-{rows}.parquet"
    start = time.perf_counter()
    for path, seed, drift in ((reference, 1, False), (current, 2, True)):
        if not path.exists():
            generate(path, rows, seed=seed, drift=drift)
    sample = next(pq.ParquetFile(reference).iter_batches(batch_size=100_000)).to_pandas()
    (work / "schema.yaml").write_text(schema_to_yaml(infer_schema(sample, target=TARGET)))
    train_champion(reference, work / "model")
    print(f"data: 2 x {rows} rows x {len(NUMERIC) + len(CATEGORICAL)} columns in {time.perf_counter() - start:.0f} s")

    profile = measure(_stage("profile", work, reference, work / "profile.json"), **caps)
    drift = measure(_stage("drift", work, work / "profile.json", current), **caps)
    # Ray's processes reserve far more address space than they use (its object store, gRPC): RLIMIT_AS aborts them
    on_ray = measure(_stage("ray_drift", work, work / "profile.json", current), memory_gib=None, seconds=args.time_cap)
    ray_equal = None if on_ray["error"] or drift["error"] else compare(on_ray["output"]["columns"],
                                                                       drift["output"]["columns"])
    big = {"seconds": None, "peak_rss_gib": None, "error": "not run: pass --drift-rows 100000000"}
    if args.drift_rows:
        big_current = work / f"current-{args.drift_rows}.parquet"
        if not big_current.exists():
            generate(big_current, args.drift_rows, seed=3, drift=True)
        big = measure(_stage("drift", work, work / "profile.json", big_current), **caps)
    skipped = {"seconds": None, "cpu_seconds": None, "peak_rss_gib": None, "error": "not run (--profile-and-drift-only)"}
    only = args.profile_and_drift_only
    validation = skipped if only else measure(_stage("validate", work, current), **caps)
    train_input = {rows: skipped} if only else {}
    for size in [] if only else sorted({min(1_000_000, rows), rows}):
        path = reference if size == rows else head(reference, size, work / f"reference-head-{size}.parquet")
        train_input[size] = measure([sys.executable, "-m", "benchmarks.train_input", str(path), "--rank", "0",
                                     "--world-size", "2", "--target", TARGET], **caps)
    ladder, finished = [], None
    sizes = [] if only else (100_000, 1_000_000, 10_000_000)
    for size in [n for n in sizes if n <= min(rows, args.evidently_max_rows)]:
        ref_n = reference if size == rows else head(reference, size, work / f"reference-head-{size}.parquet")
        cur_n = current if size == rows else head(current, size, work / f"current-head-{size}.parquet")
        step = measure(_stage("evidently", work, ref_n, cur_n), **caps)
        ladder.append({"rows": size, **{k: step[k] for k in ("seconds", "cpu_seconds", "peak_rss_gib", "error")}})
        print(f"Evidently at {size} rows: {step['seconds']} s, {step['peak_rss_gib']} GiB, {step['error'] or 'ok'}")
        if step["error"]:
            break
        finished = (size, ref_n, cur_n, step)
    comparison = {"verdicts_equal": None}
    if finished:
        size, ref_n, cur_n, step = finished
        ours = drift
        if size != rows:
            built = measure(_stage("profile", work, ref_n, work / f"profile-{size}.json"), **caps)
            ours = built if built["error"] else measure(
                _stage("drift", work, work / f"profile-{size}.json", cur_n), **caps)
        comparison = ({"verdicts_equal": False, "error": ours["error"]} if ours.get("error")
                      else compare(ours["output"]["columns"], step["output"]["columns"]))
        comparison["compared_at_rows"] = size
    largest = ladder[-1] if ladder else {"rows": None, "seconds": None, "peak_rss_gib": None, "error": "not run"}
    result = {
        "rows": rows, "columns": len(NUMERIC) + len(CATEGORICAL),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "memory_cap_gib": args.memory_cap_gib, "time_cap_s": args.time_cap,
        "evidently_max_rows": args.evidently_max_rows, "profile_and_drift_only": only,
        "drift_seconds": drift["seconds"], "drift_cpu_seconds": drift["cpu_seconds"],
        "drift_peak_rss_gib": drift["peak_rss_gib"], "drift_error": drift["error"],
        "validate_seconds": validation["seconds"], "validate_peak_rss_gib": validation["peak_rss_gib"],
        "validate_error": validation["error"],
        "profile_seconds": profile["seconds"], "profile_cpu_seconds": profile["cpu_seconds"],
        "profile_peak_rss_gib": profile["peak_rss_gib"],
        "profile_error": profile["error"],
        "sketch_rank_error": SketchSettings().rank_error,
        "drift_100m_rows": args.drift_rows, "drift_100m_seconds": big["seconds"],
        "drift_100m_peak_rss_gib": big["peak_rss_gib"], "drift_100m_error": big["error"],
        "drift_100m_rss_ratio": (round(big["peak_rss_gib"] / drift["peak_rss_gib"], 3)
                                 if big["peak_rss_gib"] and drift["peak_rss_gib"] else None),
        "ray_drift_seconds": on_ray["seconds"], "ray_drift_cpu_seconds": on_ray["cpu_seconds"],
        "ray_drift_error": on_ray["error"],
        "ray_verdicts_equal": None if ray_equal is None else ray_equal["verdicts_equal"],
        "ray_differing_columns": None if ray_equal is None else ray_equal["differing_columns"],
        "ray_max_score_difference": None if ray_equal is None else ray_equal["max_score_difference"],
        "ray_note": "a local Ray of this machine's CPUs started by the measured process (its start included), run "
                    "without the address-space cap (Ray's processes reserve more than they use)",
        "train_input_peak_rss_gib": train_input[rows]["peak_rss_gib"],
        "train_input": {str(n): {k: m[k] for k in ("seconds", "peak_rss_gib", "error")} for n, m in train_input.items()},
        "evidently_rows": largest["rows"],
        "evidently_seconds": None if largest["error"] else largest["seconds"],
        "evidently_peak_rss_gib": largest["peak_rss_gib"], "evidently_error": largest["error"],
        "evidently_ladder": ladder,
        **comparison,
        "goals": GOALS,
    }
    result["within_goals"] = {key: None if result[key] is None else result[key] <= goal for key, goal in GOALS.items()}
    print(f"{'measure':<28}{'seconds':>10}{'CPU s':>8}{'peak RSS GiB':>14}  result")
    for label, m in (("build the profile", profile), ("drift vs profile", drift), ("drift, engine ray", on_ray),
                     *((((f"drift @ {args.drift_rows}", big),) if args.drift_rows else ())),
                     ("validation", validation),
                     *((f"train input rank 0 @ {n}", m) for n, m in train_input.items()),
                     *((f"Evidently @ {step['rows']}", step) for step in ladder)):
        print(f"{label:<28}{m['seconds'] or 0:>10.1f}{m.get('cpu_seconds') or 0:>8.1f}{m['peak_rss_gib'] or 0:>14.2f}  "
              f"{m['error'] or 'ok'}")
    print(f"Ray engine's verdicts equal to the local engine's: {result['ray_verdicts_equal']} (largest score "
          f"difference {result['ray_max_score_difference']})")
    print(f"verdicts equal to Evidently's at {comparison.get('compared_at_rows')} rows: {comparison['verdicts_equal']}"
          f" (largest score difference {comparison.get('max_score_difference')})")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--evidently-max-rows", type=int, default=10_000_000,
                        help="largest size of Evidently's ladder (it runs out of memory at 10M under the 8 GiB cap)")
    parser.add_argument("--profile-and-drift-only", action="store_true",
                        help="measure only the profile build and the drift check (validation, training input and "
                             "Evidently's ladder not run: their keys null)")
    parser.add_argument("--drift-rows", type=int, default=0,
                        help="also check a current file of this many rows (e.g. 100000000) against the profile")
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/results/scale-data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scale.json"))
    parser.add_argument("--memory-cap-gib", type=float, default=8.0,
                        help="address-space cap of every measured process (RLIMIT_AS)")
    parser.add_argument("--time-cap", type=int, default=600, help="seconds before a measured process is killed")
    parser.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        start = time.perf_counter()
        output = STAGES[args.stage](args.workdir, *args.paths)
        print(json.dumps({**output, "seconds": round(time.perf_counter() - start, 2)}))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

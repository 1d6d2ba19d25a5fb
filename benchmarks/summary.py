"""One table of the headline figures from ``benchmarks/results/*.json`` (written by ``make bench``), against the
goals, printed and written to ``benchmarks/results/summary.md`` and ``summary.json``.

    .venv/bin/python benchmarks/summary.py [--results benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from data.fileio import atomic_write_json, atomic_write_text


def rows(results: Path) -> list[dict[str, Any]]:
    """(figure, value, goal, met, correct) for every result file present."""
    def load(name: str) -> dict | None:
        path = results / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    out = []
    if loop := load("loop"):
        out += [{"figure": "whole demo, wall", "value": f"{loop['demo_wall_s']:.1f} s",
                 "goal": f"<= {loop['demo_goal_s']:.0f} s", "met": loop["demo_within_goal"], "correct": True},
                {"figure": "kfp.local overhead per step", "value": f"{loop['mean_overhead_per_step_s']:.2f} s",
                 "goal": f"<= {loop['overhead_goal_s']} s", "met": loop["overhead_within_goal"], "correct": True}]
    if coll := load("collectives"):
        key, ceilings = coll["all_reduce_64MiB"], coll["ceilings_gbps"]
        backend = coll["collectives"]["backend"]
        out += [{"figure": f"{backend} all_reduce busbw at 64 MiB ({coll['collectives']['world_size']} ranks)",
                 "value": f"{key['busbw_gbps']:.2f} GB/s", "goal": "", "met": None, "correct": coll["correct"]},
                {"figure": "  as a share of two-way loopback TCP, interleaved "
                           f"({ceilings['loopback_tcp_two_way_per_direction']:.2f} GB/s)",
                 "value": f"{key['share_of_two_way_tcp']:.2f} (median; rounds "
                          f"{key['share_spread'][0]:.2f}-{key['share_spread'][1]:.2f})",
                 "goal": f">= {key['share_goal']}",
                 "met": coll["share_within_goal"], "correct": coll["correct"]},
                {"figure": f"{backend} vs gRPC all_reduce at 64 MiB", "value": f"{key['grpc_over_collective_time']}x",
                 "goal": f">= {key['ratio_goal']:.0f}x", "met": coll["ratio_within_goal"], "correct": coll["correct"]},
                {"figure": "  across sizes (4 KiB .. 64 MiB)", "value": ", ".join(
                    f"{_size(int(k))} {v}x" for k, v in sorted(coll["grpc_over_collective_time_by_size"].items(),
                                                               key=lambda kv: int(kv[0]))), "goal": "", "met": None,
                 "correct": coll["correct"]}]
    if ddp := load("ddp"):
        n = ddp["config"]["ranks"]
        medians = ddp["samples_per_s_median"]
        out.append({"figure": f"DDP {n}-rank scaling efficiency ({medians['1']:,.0f} -> {medians[str(n)]:,.0f} "
                              "samples/s)", "value": f"{ddp['scaling_efficiency']:.2f}",
                    "goal": f">= {ddp['efficiency_goal']}", "met": ddp["efficiency_within_goal"],
                    "correct": ddp["correct"]})
        if "ray_overhead" in ddp:
            out.append({"figure": f"  Ray Train overhead, {n} workers ({medians[str(n)]:,.0f} -> "
                                  f"{ddp['ray_samples_per_s']:,.0f} samples/s; start-up {ddp['torchrun_startup_s']:.1f}"
                                  f" -> {ddp['ray_startup_s']:.1f} s)", "value": f"{ddp['ray_overhead']:.1%}",
                        "goal": "", "met": None, "correct": ddp["correct"]})
    if drift := load("drift"):
        largest = next(s for s in drift["sizes"] if s["rows"] == drift["largest_rows"])
        out.append({"figure": f"drift check speed-up at {drift['largest_rows']:,} rows x 20 "
                              f"({largest['evidently_s']:.1f} s -> {largest['kfloop_s']:.1f} s)",
                    "value": f"{drift['speedup_at_largest']}x", "goal": f">= {drift['speedup_goal']:.0f}x",
                    "met": drift["within_goal"], "correct": drift["correct"]})
    if serving := load("serving"):
        worst = max(serving["sizes"], key=lambda s: s["check_share"])
        out.append({"figure": f"served model's schema check, share of a predict call ({worst['rows']:,} rows)",
                    "value": f"{worst['check_share']:.1%}", "goal": f"<= {serving['overhead_goal']:.0%}",
                    "met": serving["within_goal"], "correct": True})
    if quality := load("quality_calibration"):
        worst = max(quality["false_alarm_rate"].items(), key=lambda kv: kv[1])
        largest = max(quality["detection_rate"], key=int)
        out += [{"figure": f"quality check false alarms, worst size ({worst[0]} labelled rows)",
                 "value": f"{worst[1]:.3f}", "goal": f"<= {quality['nominal_rate']:.2f} (not significantly above)",
                 "met": quality["false_alarms_within_nominal"], "correct": True},
                {"figure": f"quality check detects a 10-point accuracy drop ({largest} rows)",
                 "value": f"{quality['detection_rate'][largest]:.3f}", "goal": f">= {quality['detection_goal']}",
                 "met": quality["detection_within_goal"], "correct": True}]
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| figure | value | goal | met | checked correct |", "| --- | --- | --- | --- | --- |"]
    for r in table:
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"| {r['figure']} | {r['value']} | {r['goal']} | {met} | {'yes' if r['correct'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    table = rows(args.results)
    if not table:
        print(f"no results in {args.results}: run make bench", file=sys.stderr)
        return 1
    text = markdown(table)
    print(text)
    atomic_write_text(args.results / "summary.md", text)
    atomic_write_json(args.results / "summary.json", table)
    return 0 if all(r["correct"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())

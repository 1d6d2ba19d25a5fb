"""The hardening report of ``make chaos`` (issue 41, item 8): hostile alerts, duplicate retrainings, secrets in
output and tampered model files, as a table and as keys of ``benchmarks/results/hardening.json`` (the ``webhook``
key, connections held open and alerts answered under load, is ``benchmarks/webhook_load.py``'s and is kept).

    .venv/bin/python -m benchmarks.hardening [--fuzz 500] [--out benchmarks/results/hardening.json]

- **hostile inputs**: every reproduction of issue 41 against ``POST /alerts`` (:func:`benchmarks.hostile_alerts.
  corpus`) and ``--fuzz`` alert bodies drawn by hypothesis (:func:`benchmarks.hostile_alerts.fuzzed_bodies`), each
  sent to ``kfloop serve``'s server on loopback (uvicorn on a thread, MLflow on SQLite, a ``start`` that counts);
  each must be answered 4xx (a fuzzed Alertmanager payload with no firing alert: 200 with no decision, as the
  protocol needs) and start no run.
- **duplicate retrainings**: one valid alert posted by 20 clients at once, then replayed 5 times with fresh
  signatures, then a new data hash inside the cooldown: one run may start, every further one is a duplicate.
- **secrets in output**: every answer and log line above searched for the planted AWS key, URI password,
  presigned signature, the webhook token and the HMAC key.
- **tampered files**: each kind of :data:`benchmarks.tampering.TAMPERS` applied to a registered version in the
  artifact store; serving and evaluation must both refuse it naming the file, and none of its code may run.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from benchmarks.hostile_alerts import (PLANTED, PLANTED_AWS_SECRET, PREFIX, answered_as_required, corpus,
                                       fuzzed_bodies, plain, request, signed)
from benchmarks.tampering import tamper_report
from benchmarks.webhook_load import LoadedWebhook, exchange
from data.fileio import atomic_write_json
from data.settings import activate, load_environment
from monitoring.http_server import ServerLimits


def hostile_report(hook: LoadedWebhook, hmac_secret: str, fuzz: int) -> tuple[dict[str, Any], list[bytes]]:
    """Send the corpus and ``fuzz`` fuzzed bodies; the figures and every answer body."""
    answers, refused, before = [], {}, len(hook.started)
    for case in corpus(hook.token, hmac_secret, int(time.time())):
        status, body = exchange(hook.port, case.request)
        answers.append(body)
        refused[case.name] = status
    fuzzed = []

    @settings(max_examples=fuzz, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=fuzzed_bodies())
    def probe(body: bytes) -> None:
        status, answer = exchange(hook.port, request(body, {"Authorization": f"Bearer {hook.token}"}))
        answers.append(answer)
        fuzzed.append((answered_as_required(status, answer), status, body))

    probe()
    not_4xx = {name: status for name, status in refused.items() if not 400 <= status < 500}
    return {"corpus": len(refused), "corpus_4xx": len(refused) - len(not_4xx), "corpus_not_4xx": not_4xx,
            "corpus_statuses": refused, "fuzzed": len(fuzzed), "fuzzed_4xx": sum(a == "4xx" for a, _, _ in fuzzed),
            "fuzzed_ignored": sum(a == "ignored" for a, _, _ in fuzzed),
            "fuzzed_otherwise": [{"status": s, "body": b[:300].decode(errors="replace")}
                                 for a, s, b in fuzzed if a is None],
            "runs_started": len(hook.started) - before}, answers


def duplicate_report(hook: LoadedWebhook, hmac_secret: str) -> tuple[dict[str, Any], list[bytes]]:
    """Post one valid alert 20 times at once, replay it signed 5 times, then a new hash inside the cooldown."""
    body = plain(data_md5="d" * 32)
    auth = {"Authorization": f"Bearer {hook.token}", "Content-Type": "application/json"}
    before = len(hook.started)
    with ThreadPoolExecutor(20) as clients:
        answers = list(clients.map(lambda _: exchange(hook.port, request(body, auth)), range(20)))
    answers += [exchange(hook.port, request(body, signed(body, hmac_secret, int(time.time())))) for _ in range(5)]
    answers.append(exchange(hook.port, request(plain(data_md5="e" * 32), auth)))
    started = len(hook.started) - before
    return {"alerts": len(answers), "answered_200": sum(s == 200 for s, _ in answers), "runs_started": started,
            "duplicate_retrainings": max(started - 1, 0)}, [b for _, b in answers]


def secrets_found(texts: list[str], planted: tuple[str, ...]) -> dict[str, int]:
    """How many of ``texts`` hold each planted secret (keyed by its first 4 characters: the report holds none)."""
    return {f"{secret[:4]}...": sum(secret in text for text in texts) for secret in planted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz", type=int, default=500, help="fuzzed alert bodies (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hardening.json"))
    args = parser.parse_args(argv)

    hmac_secret = secrets.token_hex(16)
    os.environ["AWS_SECRET_ACCESS_KEY"] = PLANTED_AWS_SECRET
    with tempfile.TemporaryDirectory() as tmp:
        activate(load_environment(Path(tmp) / "workdir"))
        hook = LoadedWebhook(Path(tmp) / "workdir", ServerLimits(), hmac_secret=hmac_secret, allowed_prefix=PREFIX)
        try:
            hostile, hostile_answers = hostile_report(hook, hmac_secret, args.fuzz)
            duplicates, duplicate_answers = duplicate_report(hook, hmac_secret)
        finally:
            hook.close()
        tampered = tamper_report(Path(tmp) / "tamper")
    output = [b.decode(errors="replace") for b in hostile_answers + duplicate_answers]
    output += hook.log.getvalue().splitlines()
    found = secrets_found(output, (*PLANTED, hook.token, hmac_secret))
    kinds = {k: v for k, v in tampered.items() if k != "untampered"}
    result = {
        "hostile_inputs": hostile, "duplicates": duplicates,
        "secrets": {"texts_scanned": len(output), "found": found, "total": sum(found.values())},
        "tampered": {"kinds": kinds, "refused": sum(v["serving"] and v["evaluation"] and not v["code_ran"]
                                                    for v in kinds.values()),
                     "untampered_loads": tampered["untampered"]["loads"]},
    }
    ok = (hostile["corpus_4xx"] == hostile["corpus"] and not hostile["fuzzed_otherwise"]
          and hostile["runs_started"] == 0 and duplicates["duplicate_retrainings"] == 0
          and duplicates["runs_started"] == 1 and result["secrets"]["total"] == 0
          and result["tampered"]["refused"] == len(kinds) and result["tampered"]["untampered_loads"])
    result["passed"] = ok
    print(f"{'check':<36} {'tried':>6} {'as required':>11}")
    rows = [("hostile corpus answered 4xx", hostile["corpus"], hostile["corpus_4xx"]),
            ("fuzzed bodies answered 4xx", hostile["fuzzed"], hostile["fuzzed_4xx"]),
            ("  or 200, nothing firing (ignored)", hostile["fuzzed"], hostile["fuzzed_ignored"]),
            ("runs started by hostile input (0)", hostile["corpus"] + hostile["fuzzed"], hostile["runs_started"]),
            ("duplicate retrainings started (0)", duplicates["alerts"], duplicates["duplicate_retrainings"]),
            ("secrets found in output (0)", len(output), result["secrets"]["total"]),
            ("tampered files refused", len(kinds), result["tampered"]["refused"])]
    for name, tried, count in rows:
        print(f"{name:<36} {tried:>6} {count:>11}")
    for name, status in hostile["corpus_not_4xx"].items():
        print(f"  not 4xx: {name}: {status}")
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    atomic_write_json(args.out, {**report, **result})
    print(f"wrote {args.out} ({'passed' if ok else 'FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

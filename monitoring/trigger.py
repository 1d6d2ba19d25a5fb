"""The retrain decision: dedupe on (model, data hash, time window), a cooldown per model, and one JSON state file
whose lock makes decide -> start the run -> record a single step across processes."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from filelock import FileLock

from data.errors import KfloopError
from data.fileio import atomic_write_json, utc_iso
from data.settings import section_from_dict

HISTORY_LIMIT = 100
"""Fired triggers kept per model (oldest dropped first)."""
STATE_VERSION = 1
OUTCOMES = ("fired", "duplicate", "cooldown", "in_flight")
"""What a decision came to; the state counts each per model (``counts``), for ``/metrics``."""


@dataclass(kw_only=True, slots=True)
class TriggerPolicy:
    """How often drift may start a retraining run."""

    cooldown_seconds: float = 3600
    """After a model's trigger fires, no other trigger fires for that model for this long (any data)."""
    window_seconds: float = 86400
    """Dedupe window: the same model and data hash fire at most once per window (``floor(now / window)``)."""
    allowed_data_prefixes: tuple[str, ...] | None = None
    """Folders or bucket prefixes (``s3://bucket/churn/``, ``/mnt/data/churn/``) an alert to ``kfloop serve`` may
    start training on; ``None``: the folder of the champion's training data (its lineage). Data anywhere else is
    refused (403)."""

    def __post_init__(self) -> None:
        if self.allowed_data_prefixes is not None:
            prefixes = self.allowed_data_prefixes
            if isinstance(prefixes, str) or not all(isinstance(p, str) and p.strip("/") for p in prefixes):
                raise ValueError(f"allowed_data_prefixes={prefixes!r}: use a list of folders or bucket prefixes, "
                                 "e.g. ['s3://bucket/churn/'], or null for the folder of the champion's training data")
            self.allowed_data_prefixes = tuple(prefixes)
        for name in ("cooldown_seconds", "window_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name}={value!r}: use a finite number of seconds >= 0")
        if self.window_seconds == 0:
            raise ValueError("window_seconds=0: use a positive window, e.g. 86400 for one day")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TriggerPolicy:
        """Build a policy from a plain mapping (YAML, JSON or pipeline parameters).

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, data, "trigger")


@dataclass(kw_only=True, slots=True, frozen=True)
class TriggerDecision:
    """Whether to start a retraining run, and why."""

    fire: bool
    """True: start a run."""
    reason: str
    """Readable explanation (new data, duplicate, or cooldown with the time it ends)."""
    outcome: str
    """One of :data:`OUTCOMES`: ``fired``, or why not (``duplicate``, ``cooldown``, ``in_flight``)."""
    key: str
    """``<model>:<data_hash>:<window index>``: the dedupe key."""
    model: str
    """Registered model name."""
    data_hash: str
    """Content hash of the data that drifted."""
    window: int
    """``floor(now / window_seconds)``."""
    run_id: str | None = None
    """The started run's id, set by ``maybe_trigger`` when it fired."""


class TriggerStateError(KfloopError, ValueError):
    """The trigger state file cannot be used; it is never reset silently."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"trigger state file {path} is unusable: {problem}. It was left as is: repair it, or move it "
                         "aside to start with an empty trigger history (deduped triggers may then fire again)")
        self.path = path
        self.problem = problem


class RunInFlight(KfloopError, RuntimeError):
    """Raised by a ``start()`` callback that did not start a run because one is already pending or running."""


class TriggerStore:
    """The trigger history in one JSON file, written atomically. ``lock`` (``<path>.lock``, reentrant within a
    process) is held by ``record`` and across ``maybe_trigger``. Subclasses keep the same document elsewhere by
    overriding ``_read``/``_write`` (and ``lock``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = FileLock(f"{self.path}.lock")

    @classmethod
    def in_workdir(cls, workdir: Path, model_name: str) -> "TriggerStore":
        """The trigger state of ``model_name`` on this machine: ``<workdir>/trigger/<model>.json``."""
        return cls(workdir / "trigger" / f"{model_name}.json")

    def _read(self) -> bytes | None:
        """The stored document, or None when there is none yet."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def _write(self, state: dict[str, Any]) -> None:
        atomic_write_json(self.path, state)

    def load(self) -> dict[str, Any]:
        """The state: ``{"version": 1, "models": {model: {"fired": [...], "last_check": {...} | None, "counts":
        {outcome: n}}}}`` (``counts`` is absent in states written before it was kept); empty when the file does not
        exist yet.

        Raises:
            TriggerStateError: the file is not valid JSON or not a trigger state.
        """
        raw = self._read()
        if raw is None:
            return {"version": STATE_VERSION, "models": {}}
        try:
            state = json.loads(raw)
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            raise TriggerStateError(self.path, f"not valid JSON ({err})") from err
        problem = _state_problem(state)
        if problem:
            raise TriggerStateError(self.path, problem)
        return state

    def last_check(self, model: str, *, since: float) -> dict[str, Any] | None:
        """The last decision for ``model`` if made at or after ``since``: ``fire``, ``reason``, ``key``, ``at`` and
        ``run_id`` (of the run it started; None when it did not fire).

        Raises:
            TriggerStateError: the file is unusable.
        """
        entry = self.load()["models"].get(model)
        if not entry or not entry["last_check"] or entry["last_check"]["at"] < since:
            return None
        check = entry["last_check"]
        runs = [f["run_id"] for f in entry["fired"] if f["key"] == check["key"] and f["at"] == check["at"]]
        return {**check, "run_id": runs[0] if check["fire"] and runs else None}

    def record(self, decision: TriggerDecision, now: float, run_id: str | None = None) -> None:
        """Store ``decision`` as the model's last check, count its outcome and, when it fired, append it to the
        model's history.

        Raises:
            TriggerStateError: the existing file is unusable.
            ValueError: ``run_id`` given for a decision that did not fire.
        """
        if run_id is not None and not decision.fire:
            raise ValueError(f"run_id {run_id!r} given for a decision that did not fire ({decision.reason})")
        with self.lock:
            state = self.load()
            entry = state["models"].setdefault(decision.model, {"fired": [], "last_check": None})
            entry["last_check"] = {"at": now, "key": decision.key, "fire": decision.fire, "reason": decision.reason}
            counts = entry["counts"] = outcome_counts(entry)
            counts[decision.outcome] = counts.get(decision.outcome, 0) + 1
            if decision.fire:
                entry["fired"].append({"key": decision.key, "data_hash": decision.data_hash,
                                       "window": decision.window, "at": now, "run_id": run_id})
                del entry["fired"][:-HISTORY_LIMIT]
            self._write(state)


def decide(store: TriggerStore, *, model: str, data_hash: str, now: float, policy: TriggerPolicy) -> TriggerDecision:
    """Whether drift on ``data_hash`` should retrain ``model`` at time ``now`` (seconds since the epoch).

    Raises:
        ValueError: empty model or data hash, or a non-finite ``now``.
        TriggerStateError: the state file is unusable.
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model={model!r}: use the registered model name")
    if not isinstance(data_hash, str) or not data_hash:
        raise ValueError(f"data_hash={data_hash!r}: use the dataset's content hash (e.g. its DVC md5)")
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now={now!r}: use seconds since the epoch, e.g. time.time()")
    window = math.floor(now / policy.window_seconds)
    key = f"{model}:{data_hash}:{window}"
    made = dict(key=key, model=model, data_hash=data_hash, window=window)
    fired = store.load()["models"].get(model, {"fired": []})["fired"]
    same = [f for f in fired if f["data_hash"] == data_hash and f["window"] == window]
    if same:
        return TriggerDecision(fire=False, outcome="duplicate",
                               reason=f"duplicate: model {model!r} was already triggered for data {data_hash} in "
                               f"window {window} at {utc_iso(same[-1]['at'])} (run {same[-1]['run_id']})", **made)
    if fired:
        last = max(fired, key=lambda f: f["at"])
        if now - last["at"] < policy.cooldown_seconds:
            return TriggerDecision(fire=False, outcome="cooldown",
                                   reason=f"cooldown: model {model!r} was triggered at {utc_iso(last['at'])} (run "
                                   f"{last['run_id']}); the next trigger may fire from "
                                   f"{utc_iso(last['at'] + policy.cooldown_seconds)}", **made)
    return TriggerDecision(fire=True, outcome="fired",
                           reason=f"new data {data_hash} for model {model!r} in window {window}", **made)


def maybe_trigger(store: TriggerStore, *, model: str, data_hash: str, now: float, policy: TriggerPolicy,
                  start: Callable[[], str]) -> TriggerDecision:
    """Decide, call ``start()`` (which starts a training run and returns its id) when the decision fires, and record,
    all under the store's file lock, so concurrent triggers never both start a run. When ``start()`` raises
    :class:`RunInFlight` the decision is recorded as skipped (not fired) with that reason.

    Raises:
        ValueError, TriggerStateError: as ``decide``.
        Exception: whatever else ``start()`` raises; nothing is recorded then.
    """
    with store.lock:
        decision = decide(store, model=model, data_hash=data_hash, now=now, policy=policy)
        run_id = None
        if decision.fire:
            try:
                run_id = start()
            except RunInFlight as busy:
                decision = dataclasses.replace(decision, fire=False, outcome="in_flight",
                                               reason=f"in flight: {busy}")
        store.record(decision, now, run_id=run_id)
    return dataclasses.replace(decision, run_id=run_id)


def outcome_counts(entry: dict[str, Any]) -> dict[str, int]:
    """How many decisions of one model's state ``entry`` came to each outcome; a state written before the counts
    were kept starts from its fired history (capped at ``HISTORY_LIMIT``)."""
    return dict(entry.get("counts") or {"fired": len(entry["fired"])})


def _state_problem(state: Any) -> str | None:
    """What makes ``state`` not a trigger state, or None."""
    if (not isinstance(state, dict) or state.get("version") != STATE_VERSION
            or not isinstance(state.get("models"), dict)):
        return f'expected an object {{"version": {STATE_VERSION}, "models": {{...}}}}'
    for model, entry in state["models"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("fired"), list) or "last_check" not in entry:
            return f'model {model!r}: expected {{"fired": [...], "last_check": ...}}'
        counts = entry.get("counts", {})
        if not isinstance(counts, dict) or any(k not in OUTCOMES or isinstance(n, bool) or not isinstance(n, int)
                                               for k, n in counts.items()):
            return f"model {model!r}: counts {counts!r} must map outcomes {list(OUTCOMES)} to integers"
        for item in entry["fired"]:
            if (not isinstance(item, dict) or not isinstance(item.get("data_hash"), str)
                    or not isinstance(item.get("window"), int) or not isinstance(item.get("at"), (int, float))):
                return f"model {model!r}: fired entry {item!r} lacks data_hash (string), window (int) or at (number)"
    return None

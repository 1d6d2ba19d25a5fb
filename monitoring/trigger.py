"""The retrain decision: dedupe on (model, data hash, time window), a cooldown per model, and one JSON state
document changed only by :meth:`TriggerStore.update` (read, change, write; a store with compare-and-swap re-reads and
re-decides when another decider wrote first), so the decision is made on the state its pending record is written
over. The pending record is written before the run starts, so a lost write means no run, and a write lost after the
start leaves the pending record holding the cooldown: a run is never started twice."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from filelock import FileLock

from data.errors import KfloopError
from data.fileio import atomic_write_json, utc_iso
from data.redaction import redact_text
from data.storage import StorageError, check_uri
from data.settings import section_from_dict
from data.text import shorten

HISTORY_LIMIT = 100
"""Fired triggers kept per model (oldest dropped first)."""
STATE_VERSION = 1
OUTCOMES = ("fired", "duplicate", "cooldown", "in_flight")
"""What a decision came to; the state counts each per model (``counts``), for ``/metrics``."""
DATA_HASH = re.compile(r"(alert-)?[0-9a-f]{1,64}")
"""A data hash the trigger keys on: a content hash in lowercase hex of at most 64 characters (a DVC md5, a sha256),
or the webhook's ``alert-<hex>`` key for an alert that names no data."""
MAX_MODEL_CHARS = 256
"""The longest model name the trigger takes (MLflow's own limit on registered model names)."""
MAX_REASON_CHARS = 500
"""A reason is kept (in the state, the log, the answer) to this many characters."""
CAS_TRIES = 8
"""Compare-and-swap writes :meth:`TriggerStore.update` tries before giving up (each lost one is re-read and redone)."""
T = TypeVar("T")
_LOCKS: dict[str, threading.RLock] = {}
"""One lock per registered model: a slow MLflow or KFP call for one model holds up no other model's trigger."""
_LOCKS_GUARD = threading.Lock()


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
            for prefix in self.allowed_data_prefixes:
                try:
                    check_uri(prefix)
                except StorageError as err:
                    raise ValueError(f"allowed_data_prefixes: {err}") from None
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


class RunNotRecorded(KfloopError, RuntimeError):
    """A run was started but recording its id failed; its pending record keeps the cooldown and the dedupe."""

    def __init__(self, model: str, run_id: str, err: Exception):
        super().__init__(f"training run {run_id} of model {model!r} was started, but recording its id failed "
                         f"({type(err).__name__}: {shorten(redact_text(str(err)), MAX_REASON_CHARS, show_length=True)}); the pending record keeps the "
                         "cooldown, so no second run starts: check the trigger state's store")
        self.model, self.run_id = model, run_id


class RunInFlight(KfloopError, RuntimeError):
    """Raised by a ``start()`` callback that did not start a run because one is already pending or running."""


class StateConflict(KfloopError, RuntimeError):
    """Raised by a store's ``_write`` when the document changed since the version it was read at."""


class TriggerStateContended(KfloopError, RuntimeError):
    """Every compare-and-swap write of one update lost to another decider; nothing was written."""


class TriggerStore:
    """The trigger history in one JSON file, written atomically. ``lock`` (``<path>.lock``, reentrant within a
    process) is held by :meth:`update` and across ``maybe_trigger``. Subclasses keep the same document elsewhere by
    overriding ``_read``/``_write`` (and ``lock``); one with compare-and-swap raises :class:`StateConflict` from
    ``_write`` when the version read is stale."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = FileLock(f"{self.path}.lock")

    @classmethod
    def in_workdir(cls, workdir: Path, model_name: str) -> "TriggerStore":
        """The trigger state of ``model_name`` on this machine: ``<workdir>/trigger/<model>.json``."""
        return cls(workdir / "trigger" / f"{model_name}.json")

    def _read(self) -> tuple[bytes | None, Any]:
        """The stored document (None when there is none yet) and its version (None: the lock alone guards it)."""
        try:
            return self.path.read_bytes(), None
        except FileNotFoundError:
            return None, None

    def _write(self, state: dict[str, Any], version: Any) -> None:
        """Store ``state`` over the document read at ``version``."""
        atomic_write_json(self.path, state)

    def _load(self) -> tuple[dict[str, Any], Any]:
        raw, version = self._read()
        if raw is None:
            return {"version": STATE_VERSION, "models": {}}, version
        try:
            state = json.loads(raw)
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            raise TriggerStateError(self.path, f"not valid JSON ({err})") from err
        problem = _state_problem(state)
        if problem:
            raise TriggerStateError(self.path, problem)
        return state, version

    def load(self) -> dict[str, Any]:
        """The state: ``{"version": 1, "models": {model: {"fired": [...], "last_check": {...} | None, "counts":
        {outcome: n}}}}`` (``counts`` is absent in states written before it was kept); empty when the file does not
        exist yet.

        Raises:
            TriggerStateError: the file is not valid JSON or not a trigger state.
        """
        return self._load()[0]

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        """Read the state, apply ``change`` to it in place and write it over the version read; when another writer
        came first (:class:`StateConflict`), read again and apply ``change`` to the new state. Returns what
        ``change`` returned on the state that was written.

        Raises:
            TriggerStateError: the stored document is unusable.
            TriggerStateContended: all :data:`CAS_TRIES` writes lost.
        """
        with self.lock:
            for _ in range(CAS_TRIES):
                state, version = self._load()
                result = change(state)
                try:
                    self._write(state, version)
                except StateConflict:
                    continue
                return result
        raise TriggerStateContended(f"the trigger state at {self.path} changed under each of {CAS_TRIES} writes "
                                    "(other deciders wrote first); nothing was recorded, so no run was started: "
                                    "send the alert again")

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

    def complete(self, decision: TriggerDecision, now: float, run_id: str) -> None:
        """Give the pending record of ``decision`` (recorded at ``now``) the id of the run it started.

        Raises:
            TriggerStateError: the existing file is unusable.
            ValueError: no pending record of ``decision`` at ``now``.
        """
        def change(state: dict[str, Any]) -> None:
            pending = _pending(state, decision, now)
            if not pending:
                raise ValueError(f"no pending trigger record of {decision.key} at {utc_iso(now)} to complete")
            pending[-1].update(run_id=run_id, pending=False)
        self.update(change)


def _record(state: dict[str, Any], decision: TriggerDecision, now: float) -> dict[str, Any]:
    """Store ``decision`` in ``state`` as the model's last check, count its outcome and, when it fired, append it to
    the model's history as pending (no run id yet: :meth:`TriggerStore.complete` adds it); returns the model's
    entry."""
    entry = state["models"].setdefault(decision.model, {"fired": [], "last_check": None})
    entry["last_check"] = {"at": now, "key": decision.key, "fire": decision.fire,
                           "reason": shorten(decision.reason, MAX_REASON_CHARS, show_length=True)}
    counts = entry["counts"] = outcome_counts(entry)
    counts[decision.outcome] = counts.get(decision.outcome, 0) + 1
    if decision.fire:
        entry["fired"].append({"key": decision.key, "data_hash": decision.data_hash, "window": decision.window,
                               "at": now, "run_id": None, "pending": True})
        del entry["fired"][:-HISTORY_LIMIT]
    return entry


def _pending(state: dict[str, Any], decision: TriggerDecision, now: float) -> list[dict[str, Any]]:
    """The pending records of ``decision`` made at ``now`` in ``state``."""
    return [f for f in state["models"].get(decision.model, {"fired": []})["fired"]
            if f["key"] == decision.key and f["at"] == now and f.get("pending")]


def _withdraw(state: dict[str, Any], decision: TriggerDecision, now: float, before: dict[str, Any] | None,
              written: dict[str, Any]) -> None:
    """Take back the pending record of ``decision`` (its run did not start): the model's entry goes back to
    ``before`` when it is still the ``written`` one, else only the record and its count go (another decider's
    check since then stays)."""
    models = state["models"]
    if models.get(decision.model) == written:
        if before is None:
            models.pop(decision.model, None)
        else:
            models[decision.model] = before
        return
    entry = models.get(decision.model)
    mine = _pending(state, decision, now)
    if entry is None or not mine:
        return
    entry["fired"] = [f for f in entry["fired"] if not any(f is m for m in mine)]
    counts = entry["counts"] = outcome_counts(entry)
    counts["fired"] = max(counts.get("fired", 0) - 1, 0)


def model_lock(model_name: str) -> threading.RLock:
    """The process's lock of ``model_name``'s trigger state (the same object on every call): the lock of the stores
    kept off this machine, which serialises the deciders of one process."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model_name, threading.RLock())


def decide(store: TriggerStore, *, model: str, data_hash: str, now: float, policy: TriggerPolicy) -> TriggerDecision:
    """Whether drift on ``data_hash`` should retrain ``model`` at time ``now`` (seconds since the epoch).

    Raises:
        ValueError: empty model or data hash, or a non-finite ``now``.
        TriggerStateError: the state file is unusable.
    """
    _check_arguments(model, data_hash, now)
    return _decide(store.load(), model=model, data_hash=data_hash, now=now, policy=policy)


def _check_arguments(model: Any, data_hash: Any, now: Any) -> None:
    """Raise ValueError, saying the fix, for a model name, data hash or time :func:`decide` cannot take."""
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS:
        raise ValueError(f"model={shorten(repr(model), 80, show_length=True)}: use the registered model name (1 to {MAX_MODEL_CHARS} "
                         "characters)")
    if not isinstance(data_hash, str) or not DATA_HASH.fullmatch(data_hash):
        raise ValueError(f"data_hash={shorten(repr(data_hash), 80, show_length=True)}: use the dataset's content hash, lowercase hex "
                         "of at most 64 characters (e.g. its DVC md5)")
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now={now!r}: use seconds since the epoch, e.g. time.time()")


def _decide(state: dict[str, Any], *, model: str, data_hash: str, now: float,
            policy: TriggerPolicy) -> TriggerDecision:
    """The decision of :func:`decide` on ``state`` (arguments already checked)."""
    window = math.floor(now / policy.window_seconds)
    key = f"{model}:{data_hash}:{window}"
    made = dict(key=key, model=model, data_hash=data_hash, window=window)
    fired = state["models"].get(model, {"fired": []})["fired"]
    same = [f for f in fired if f["data_hash"] == data_hash and f["window"] == window]
    if same:
        return TriggerDecision(fire=False, outcome="duplicate",
                               reason=f"duplicate: model {model!r} was already triggered for data {data_hash} in "
                               f"window {window} at {utc_iso(same[-1]['at'])} ({_run(same[-1])})", **made)
    if fired:
        last = max(fired, key=lambda f: f["at"])
        if now - last["at"] < policy.cooldown_seconds:
            return TriggerDecision(fire=False, outcome="cooldown",
                                   reason=f"cooldown: model {model!r} was triggered at {utc_iso(last['at'])} "
                                   f"({_run(last)}); the next trigger may fire from "
                                   f"{utc_iso(last['at'] + policy.cooldown_seconds)}", **made)
    return TriggerDecision(fire=True, outcome="fired",
                           reason=f"new data {data_hash} for model {model!r} in window {window}", **made)


def maybe_trigger(store: TriggerStore, *, model: str, data_hash: str, now: float, policy: TriggerPolicy,
                  start: Callable[[], str]) -> TriggerDecision:
    """Decide and record the decision in one :meth:`TriggerStore.update` (the decision is made on the state the
    record is written over: of two deciders racing, the one whose write loses decides again on the winner's state),
    then, when it fired, call ``start()`` (which starts a training run and returns its id) and complete the pending
    record with the id. A failed pending write starts nothing; when ``start()`` raises, the pending record is taken
    back (:class:`RunInFlight`: the decision is recorded as skipped, with that reason).

    Raises:
        ValueError, TriggerStateError: as ``decide``.
        TriggerStateContended: as :meth:`TriggerStore.update` (no run is started).
        RunNotRecorded: the run started but its id could not be recorded; the pending record keeps the cooldown.
        Exception: what the store raises when the pending record cannot be written (no run is started then), or
            what ``start()`` raises (the pending record is taken back then).
    """
    _check_arguments(model, data_hash, now)
    made: dict[str, Any] = {}

    def decide_and_record(state: dict[str, Any]) -> TriggerDecision:
        entry = state["models"].get(model)
        made["before"] = copy.deepcopy(entry)
        decision = _decide(state, model=model, data_hash=data_hash, now=now, policy=policy)
        made["written"] = copy.deepcopy(_record(state, decision, now))
        return decision

    with store.lock:
        decision = store.update(decide_and_record)
        if not decision.fire:
            return decision

        def withdraw(state: dict[str, Any]) -> None:
            _withdraw(state, decision, now, made["before"], made["written"])
        try:
            run_id = start()
        except RunInFlight as busy:
            skipped = dataclasses.replace(decision, fire=False, outcome="in_flight", reason=f"in flight: {busy}")
            store.update(lambda state: (withdraw(state), _record(state, skipped, now)))
            return skipped
        except BaseException:
            store.update(withdraw)
            raise
        try:
            store.complete(decision, now, run_id)
        except Exception as err:  # any store failure: the run is started, its pending record holds
            raise RunNotRecorded(model, run_id, err) from None
    return dataclasses.replace(decision, run_id=run_id)


def _run(fired: dict[str, Any]) -> str:
    """How a fired entry names its run."""
    return "run pending" if fired.get("pending") else f"run {fired['run_id']}"


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

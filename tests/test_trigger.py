"""The retrain trigger: dedupe, cooldown, state on disk, and one run when processes race."""
from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from monitoring.trigger import (
    HISTORY_LIMIT,
    RunInFlight,
    RunNotRecorded,
    TriggerPolicy,
    TriggerStateError,
    TriggerStore,
    decide,
    maybe_trigger,
    outcome_counts,
)

POLICY = TriggerPolicy(cooldown_seconds=3600, window_seconds=86400)
T0 = 86400 * 20_000 + 600.0  # 10 minutes into a window


def fire(store, data_hash, now, model="churn", run_id="run-1"):
    return maybe_trigger(store, model=model, data_hash=data_hash, now=now, policy=POLICY, start=lambda: run_id)


def fired(store, model="churn"):
    return store.load()["models"][model]["fired"]


def test_fires_once_then_dedupes_the_same_key(tmp_path):
    store = TriggerStore(tmp_path / "state.json")

    first = fire(store, "0a", T0)
    again = fire(store, "0a", T0 + 4000, run_id="run-2")  # past the cooldown, same window

    assert (first.fire, first.run_id, first.key) == (True, "run-1", "churn:0a:20000")
    assert (again.fire, again.run_id, again.key) == (False, None, first.key)
    assert again.reason.startswith("duplicate:") and "run-1" in again.reason
    assert [(f["key"], f["run_id"], f["at"]) for f in fired(store)] == [(first.key, "run-1", T0)]
    assert store.load()["models"]["churn"]["last_check"] == {"at": T0 + 4000, "key": first.key, "fire": False,
                                                            "reason": again.reason}


def test_cooldown_blocks_other_data_for_the_same_model_only(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    fire(store, "0a", T0)

    blocked = decide(store, model="churn", data_hash="0b", now=T0 + 3599, policy=POLICY)
    other_model = decide(store, model="fraud", data_hash="0b", now=T0 + 1, policy=POLICY)
    after = decide(store, model="churn", data_hash="0b", now=T0 + 3600, policy=POLICY)

    assert not blocked.fire and blocked.reason.startswith("cooldown:")
    assert "next trigger may fire from" in blocked.reason
    assert other_model.fire and after.fire


def test_same_data_fires_again_in_a_new_window(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    first = fire(store, "0a", T0)

    next_window = fire(store, "0a", T0 + 86400, run_id="run-2")

    assert next_window.fire and next_window.window == first.window + 1
    assert [f["run_id"] for f in fired(store)] == ["run-1", "run-2"]


def test_the_last_check_gives_the_run_it_started_and_nothing_older_than_asked(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    assert store.last_check("churn", since=0) is None  # no state yet
    first = fire(store, "0a", T0)
    assert store.last_check("churn", since=T0) == {"at": T0, "key": first.key, "fire": True,
                                                   "reason": first.reason, "run_id": "run-1"}
    assert store.last_check("churn", since=T0 + 1) is None  # made before `since`
    assert store.last_check("fraud", since=0) is None  # another model
    duplicate = fire(store, "0a", T0 + 4000, run_id="run-2")
    assert store.last_check("churn", since=T0) == {"at": T0 + 4000, "key": first.key, "fire": False,
                                                   "reason": duplicate.reason, "run_id": None}


def test_state_survives_a_restart(tmp_path):
    fire(TriggerStore(tmp_path / "state.json"), "0a", T0)

    restarted = TriggerStore(tmp_path / "state.json")

    assert not decide(restarted, model="churn", data_hash="0a", now=T0 + 5000, policy=POLICY).fire
    assert not decide(restarted, model="churn", data_hash="0b", now=T0 + 10, policy=POLICY).fire


def test_state_is_written_atomically_without_leftovers(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    fire(store, "0a", T0)
    fire(store, "0b", T0 + 10)

    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("state.json", "state.json.lock")]
    assert leftovers == []
    assert json.loads((tmp_path / "state.json").read_text())["version"] == 1


def test_history_is_bounded_per_model(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    no_cooldown = TriggerPolicy(cooldown_seconds=0)
    for i in range(HISTORY_LIMIT + 3):
        maybe_trigger(store, model="churn", data_hash=f"{i:x}", now=T0 + i, policy=no_cooldown,
                      start=lambda i=i: f"run-{i}")

    history = fired(store)
    assert len(history) == HISTORY_LIMIT
    assert (history[0]["run_id"], history[-1]["run_id"]) == ("run-3", f"run-{HISTORY_LIMIT + 2}")


@pytest.mark.parametrize(("content", "problem"), [
    (b"{not json", "not valid JSON"),
    (b"[]", 'expected an object {"version": 1'),
    (b'{"version": 1, "models": {"churn": {"fired": [{"at": 1}], "last_check": null}}}', "lacks data_hash"),
])
def test_corrupt_state_is_a_clear_error_and_left_untouched(tmp_path, content, problem):
    path = tmp_path / "state.json"
    path.write_bytes(content)
    store = TriggerStore(path)

    with pytest.raises(TriggerStateError, match=problem) as err:
        fire(store, "0a", T0)

    assert str(path) in str(err.value) and "move it aside" in str(err.value)
    assert path.read_bytes() == content


def test_failed_start_records_nothing_and_propagates(tmp_path):
    store = TriggerStore(tmp_path / "state.json")

    def broken_start():
        raise RuntimeError("KFP API unreachable")

    with pytest.raises(RuntimeError, match="KFP API unreachable"):
        maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=broken_start)

    assert store.load()["models"] == {}  # the pending record was taken back: no run started
    assert fire(store, "0a", T0 + 1).fire


def test_start_runs_under_the_lock_and_only_when_firing(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    calls = []

    def start():
        with pytest.raises(Timeout):  # another holder (as another process would be) cannot take the lock now
            FileLock(f"{store.path}.lock", timeout=0).acquire()
        calls.append("started")
        return "run-1"

    maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=start)
    maybe_trigger(store, model="churn", data_hash="0a", now=T0 + 1, policy=POLICY, start=start)

    assert calls == ["started"]


class LosingStore(TriggerStore):
    """The file store whose writes fail from the ``fail_from``-th on, as a store that went away would."""

    def __init__(self, path, fail_from):
        super().__init__(path)
        self.writes, self.fail_from = 0, fail_from

    def _write(self, state, version):
        self.writes += 1
        if self.writes >= self.fail_from:
            raise OSError("the store went away")
        super()._write(state, version)


def test_a_lost_pending_write_starts_no_run(tmp_path):
    store = LosingStore(tmp_path / "state.json", fail_from=1)
    started = []

    with pytest.raises(OSError, match="the store went away"):
        maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY,
                      start=lambda: started.append("run-1") or "run-1")

    assert started == []


def test_a_write_lost_after_the_start_keeps_the_cooldown_so_no_second_run_starts(tmp_path):
    store = LosingStore(tmp_path / "state.json", fail_from=2)  # the pending record is written, its completion lost
    started = []

    def start() -> str:
        started.append(f"run-{len(started) + 1}")
        return started[-1]

    with pytest.raises(RunNotRecorded, match="training run run-1 of model 'churn' was started, but recording its id "
                                             "failed \\(OSError: the store went away\\); the pending record keeps"):
        maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=start)
    store.fail_from = float("inf")
    again = [maybe_trigger(store, model="churn", data_hash=data, now=now, policy=POLICY, start=start)
             for data, now in (("0a", T0 + 10), ("0b", T0 + 20), ("0c", T0 + 3000))]

    assert started == ["run-1"]
    assert [d.outcome for d in again] == ["duplicate", "cooldown", "cooldown"]
    assert "(run pending)" in again[0].reason and "(run pending)" in again[1].reason
    assert fired(store) == [{"key": "churn:0a:20000", "data_hash": "0a", "window": 20000, "at": T0, "run_id": None,
                             "pending": True}]


def _race(state_path: str, runs_dir: str, index: int, data_hash: str, barrier, ready, other_ready) -> None:
    """One racing trigger; its start() waits until the other process is on its way into maybe_trigger, so
    without the lock both would decide on the same empty state and both start a run."""
    store = TriggerStore(state_path)

    def start() -> str:
        assert other_ready.wait(timeout=60)
        run_id = f"run-{index}"
        (Path(runs_dir) / run_id).touch()
        return run_id

    barrier.wait(timeout=60)
    ready.set()
    maybe_trigger(store, model="churn", data_hash=data_hash, now=T0, policy=POLICY, start=start)


@pytest.mark.parametrize("same_data", [True, False], ids=["dedupe", "cooldown"])
def test_racing_processes_start_exactly_one_run(tmp_path, same_data):
    ctx = multiprocessing.get_context("spawn")
    runs = tmp_path / "runs"
    runs.mkdir()
    barrier, ready = ctx.Barrier(2), [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "state.json"), str(runs), i,
                                             "0a" if same_data else f"{i:x}", barrier, ready[i], ready[1 - i]))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)

    assert [p.exitcode for p in procs] == [0, 0]
    started = sorted(p.name for p in runs.iterdir())
    assert len(started) == 1
    history = fired(TriggerStore(tmp_path / "state.json"))
    assert [f["run_id"] for f in history] == started


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cooldown_seconds": -1}, "cooldown_seconds=-1: use a finite number of seconds >= 0"),
    ({"window_seconds": 0}, "window_seconds=0: use a positive window"),
    ({"window_seconds": float("inf")}, "window_seconds=inf"),
    ({"allowed_data_prefixes": ["s3://ml-data/churn/../"]},
     "allowed_data_prefixes: s3://ml-data/churn/../: rule uri.key"),
    ({"allowed_data_prefixes": ["http://169.254.169.254/"]}, "allowed_data_prefixes: http://169.254.169.254/: rule "
                                                             "uri.scheme"),
])
def test_invalid_policy_states_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TriggerPolicy(**kwargs)


def test_policy_from_dict():
    assert TriggerPolicy.from_dict({"cooldown_seconds": 60}) == TriggerPolicy(cooldown_seconds=60)
    with pytest.raises(ValueError, match=r"unknown trigger key\(s\) \['cooldown'\]"):
        TriggerPolicy.from_dict({"cooldown": 60})


def test_invalid_decide_arguments(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    with pytest.raises(ValueError, match="data_hash='': use the dataset's content hash"):
        decide(store, model="churn", data_hash="", now=T0, policy=POLICY)
    with pytest.raises(ValueError, match="now=nan"):
        decide(store, model="churn", data_hash="0a", now=float("nan"), policy=POLICY)
    with pytest.raises(ValueError, match="data_hash='md5-a': use the dataset's content hash, lowercase hex"):
        decide(store, model="churn", data_hash="md5-a", now=T0, policy=POLICY)
    with pytest.raises(ValueError, match=r"data_hash='aaaa.*\(30002 chars\): use the dataset's content hash"):
        decide(store, model="churn", data_hash="a" * 30_000, now=T0, policy=POLICY)
    with pytest.raises(ValueError, match="model='mmmm.*: use the registered model name \\(1 to 256"):
        decide(store, model="m" * 300, data_hash="0a", now=T0, policy=POLICY)
    decision = decide(store, model="churn", data_hash="0a", now=T0, policy=POLICY)
    with pytest.raises(ValueError, match="no pending trigger record of churn:0a:20000"):
        store.complete(decision, T0, "run-1")


def test_a_run_in_flight_is_recorded_as_skipped_and_fires_later(tmp_path):
    store = TriggerStore(tmp_path / "state.json")

    def busy() -> str:
        raise RunInFlight("training run r-7 is RUNNING")

    skipped = maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=busy)
    later = fire(store, "0a", T0 + 60)

    assert (skipped.fire, skipped.run_id) == (False, None) and "r-7 is RUNNING" in skipped.reason
    assert later.fire and [f["run_id"] for f in fired(store)] == ["run-1"]


def test_each_decision_is_counted_by_outcome_and_old_states_count_from_their_history(tmp_path):
    store = TriggerStore(tmp_path / "state.json")
    fire(store, "0a", T0)
    fire(store, "0a", T0 + 10)
    fire(store, "0b", T0 + 20)

    def busy() -> str:
        raise RunInFlight("run r-9 is RUNNING")

    maybe_trigger(store, model="churn", data_hash="0c", now=T0 + 4000, policy=POLICY, start=busy)
    assert store.load()["models"]["churn"]["counts"] == {"fired": 1, "duplicate": 1, "cooldown": 1, "in_flight": 1}

    state = store.load()
    del state["models"]["churn"]["counts"]  # written before the counts were kept
    store.path.write_text(json.dumps(state))
    assert outcome_counts(store.load()["models"]["churn"]) == {"fired": 1}
    fire(store, "0d", T0 + 8000)
    assert store.load()["models"]["churn"]["counts"] == {"fired": 2}

    state["models"]["churn"]["counts"] = {"fired": "2"}
    store.path.write_text(json.dumps(state))
    with pytest.raises(TriggerStateError, match="counts .* must map outcomes"):
        store.load()

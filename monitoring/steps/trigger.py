"""The retrain trigger step: a training run unless the cooldown, the dedupe or a run in flight says no."""
from __future__ import annotations

import time
from typing import Any, Callable

from data.settings import load_environment, step_function
from monitoring.trigger import TriggerPolicy, TriggerStore, maybe_trigger
from training.progress import progress


def trigger_store(model_name: str):
    """The trigger state of ``model_name`` in the workdir (a file that survives restarts of the step)."""
    return TriggerStore.in_workdir(load_environment().workdir, model_name)


@step_function
def trigger_step(*, model_name: str, data_md5: str, policy: dict[str, Any], start: Callable[[], str],
                 store: Any = None):
    """Retrain unless the cooldown or the dedupe on (model, data hash, window) says no; ``start()`` starts a
    training run and returns its id. ``store`` defaults to the workdir's file (:func:`trigger_store`). Returns the
    :class:`monitoring.trigger.TriggerDecision` (with ``run_id``)."""
    decision = maybe_trigger(store or trigger_store(model_name), model=model_name, data_hash=data_md5,
                             now=time.time(), policy=TriggerPolicy.from_dict(policy), start=start)
    progress(f"trigger: {'fired, run ' + str(decision.run_id) if decision.fire else 'skipped'}: {decision.reason}")
    return decision

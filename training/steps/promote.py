"""The promote step: ``champion`` moved under the lock, re-decided first if the champion changed since the gate.
Only that re-decision scores models, so only it loads the evaluate step's code (torch, the gate, the figures)."""
from __future__ import annotations

from typing import Any

from data.settings import load_environment, step_function
from training.launch.backends import step_backend
from training.progress import progress
from training.registry.versions import promote


@step_function
def promote_step(*, model_name: str, version: str, compared_against: str, model_dir: str, holdout_path: str,
                 holdout_sha256: str, policy: dict[str, Any]):
    """Move ``champion`` under the lock; if the champion changed since the gate, re-decide against it first."""
    def recheck(current):
        from training.steps.evaluate import score_against_champion  # the champion moved since the gate: rare

        decision, _ = score_against_champion(model_dir=model_dir, holdout_path=holdout_path,
                                             holdout_sha256=holdout_sha256, model_name=model_name,
                                             policy=policy, champion=current)
        return decision

    result = promote(model_name, version, compared_against=compared_against or None, recheck=recheck,
                     lock=step_backend().promotion_lock(model_name, load_environment().workdir))
    progress(f"promote: {model_name} v{version}: {'champion' if result.promoted else 'not promoted'}"
              f" ({result.reason})")
    return result

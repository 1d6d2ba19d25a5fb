"""The evaluation gate: challenger against champion on the same pinned holdout."""
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.base import kfloop_component


@kfloop_component
def evaluate_vs_champion(model: Input[Model], holdout_data: Input[Dataset], holdout_sha256: str, model_name: str,
                         promotion_policy: dict, metrics: Output[Metrics], report: Output[Artifact]) -> bool:
    """Score both models on the holdout and apply the PromotionPolicy. Returns ``blessed``, which drives
    ``dsl.If`` (a single output: kfp.local resolves conditions only on a task's ``Output``); the report's
    metadata holds the champion compared against and the reason."""
    from data.settings import from_struct
    from training.steps.evaluate import evaluate_step

    result = evaluate_step(model_dir=model.path, holdout_path=holdout_data.path, holdout_sha256=holdout_sha256,
                           model_name=model_name, policy=from_struct(promotion_policy), report_out=report.path,
                           run_id=model.metadata.get("mlflow_run_id", ""))
    for name, value in result.kfp_metrics.items():
        metrics.log_metric(name, value)
    report.metadata.update({"champion_version": result.champion_version, "reason": result.reason})
    return result.blessed

"""The evaluation gate: challenger against champion on the same pinned holdout."""
from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.base import kfloop_component


@kfloop_component
def evaluate_vs_champion(model: Input[Model], holdout_data: Input[Dataset], holdout_sha256: str, model_name: str,
                         promotion_policy: dict, metrics: Output[Metrics], report: Output[Artifact]
                         ) -> NamedTuple("GateOutputs", [("blessed", bool), ("champion_version", str), ("reason", str)]):
    """Score both models on the holdout and apply the PromotionPolicy; ``blessed`` drives ``dsl.If``."""
    from training.steps import evaluate_step

    result = evaluate_step(model_dir=model.path, holdout_path=holdout_data.path, holdout_sha256=holdout_sha256,
                           model_name=model_name, policy=promotion_policy, report_out=report.path)
    for name, value in result.kfp_metrics.items():
        metrics.log_metric(name, value)
    return result.blessed, result.champion_version, result.reason

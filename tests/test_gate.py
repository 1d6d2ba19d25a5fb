"""The promotion rule: decision table, metrics, paired bootstrap, determinism."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from training.gate import (
    METRICS,
    Decision,
    PromotionPolicy,
    _resampled_metric,
    align_proba,
    compute_metrics,
    default_primary_metric,
    evaluate,
    kfp_metrics,
)

CLASSES = ["no", "yes"]


def labels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).choice(CLASSES, n)


def proba_with_accuracy(y: np.ndarray, accuracy: float, *, seed: int, confidence: float = 0.8) -> np.ndarray:
    """Binary probabilities whose argmax is right on exactly round(accuracy * n) random rows."""
    n = len(y)
    right = np.zeros(n, dtype=bool)
    right[np.random.default_rng(seed).permutation(n)[:round(accuracy * n)]] = True
    y_idx = (y == "yes").astype(int)
    predicted = np.where(right, y_idx, 1 - y_idx)
    p = np.full((n, 2), 1 - confidence)
    p[np.arange(n), predicted] = confidence
    return p


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"region": np.where(np.arange(n) % 2 == 0, "north", "south")})


def policy(**kw) -> PromotionPolicy:
    return PromotionPolicy(**{"bootstrap_samples": 500, **kw})


def check(decision: Decision, name: str) -> dict:
    return next(c for c in decision.checks if c["name"] == name)


# --- decision table ---------------------------------------------------------------------------------------

def test_no_champion_is_promoted_iff_the_floor_is_cleared():
    y = labels(400)
    p = proba_with_accuracy(y, 0.75, seed=1)
    above = evaluate(y_true=y, challenger_proba=p, champion_proba=None, classes=CLASSES, holdout=frame(400),
                     policy=policy(floor=0.7))
    below = evaluate(y_true=y, challenger_proba=p, champion_proba=None, classes=CLASSES, holdout=frame(400),
                     policy=policy(floor=0.8))
    assert above.blessed and above.reason == "promote: accuracy 0.750 >= floor 0.700 (no champion)"
    assert not below.blessed and below.reason == "reject: accuracy 0.750 < floor 0.800 (no champion)"
    assert above.champion_metrics is None and above.confidence is None and above.slices == []


def test_clearly_better_challenger_is_promoted_with_the_numbers_in_the_reason():
    y = labels(2000)
    d = evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.85, seed=1),
                 champion_proba=proba_with_accuracy(y, 0.75, seed=2), classes=CLASSES, holdout=frame(2000),
                 policy=policy(floor=0.6, min_improvement=0.05, required_confidence=0.95, slice_columns=["region"],
                               max_slice_regression=0.02))
    assert d.blessed, d.reason
    assert d.improvement == pytest.approx(0.10)
    assert d.relative_improvement == pytest.approx(0.10 / 0.75)
    assert d.confidence >= 0.99
    assert d.reason.startswith("promote: accuracy 0.850 vs champion 0.750 (+0.100 >= 0.050), confidence 1.000 >= 0.95")
    assert "no slice regressed more than 0.020" in d.reason
    assert all(c["passed"] for c in d.checks)
    assert {(s["column"], s["value"]) for s in d.slices} == {("region", "north"), ("region", "south")}
    assert sum(s["rows"] for s in d.slices) == 2000


def test_worse_challenger_is_rejected():
    y = labels(1000)
    d = evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.70, seed=1),
                 champion_proba=proba_with_accuracy(y, 0.80, seed=2), classes=CLASSES, holdout=frame(1000),
                 policy=policy())
    assert not d.blessed
    assert d.improvement == pytest.approx(-0.10)
    assert d.confidence == 0.0
    assert "accuracy 0.700 vs champion 0.800 (-0.100 < 0.000)" in d.reason


def test_a_tie_keeps_the_incumbent():
    y = labels(1000)
    p = proba_with_accuracy(y, 0.8, seed=1)
    d = evaluate(y_true=y, challenger_proba=p, champion_proba=p.copy(), classes=CLASSES, holdout=frame(1000),
                 policy=policy(required_confidence=0.0))
    assert not d.blessed
    assert d.improvement == 0.0
    assert "tie; the incumbent stays" in d.reason
    assert [c["name"] for c in d.checks if not c["passed"]] == ["min_improvement"]


def test_improvement_below_the_absolute_minimum_is_rejected():
    y = labels(4000)
    d = evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.82, seed=1),
                 champion_proba=proba_with_accuracy(y, 0.80, seed=2), classes=CLASSES, holdout=frame(4000),
                 policy=policy(min_improvement=0.05, required_confidence=0.0))
    assert not d.blessed
    assert [c["name"] for c in d.checks if not c["passed"]] == ["min_improvement"]
    assert "(+0.020 < 0.050)" in d.reason


def test_improvement_below_the_relative_minimum_is_rejected():
    y = labels(4000)
    d = evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.52, seed=1),
                 champion_proba=proba_with_accuracy(y, 0.50, seed=2), classes=CLASSES, holdout=frame(4000),
                 policy=policy(min_relative_improvement=0.10, required_confidence=0.0))
    assert not d.blessed
    assert d.relative_improvement == pytest.approx(0.04)
    assert [c["name"] for c in d.checks if not c["passed"]] == ["min_relative_improvement"]
    assert "relative improvement +4.000% < 10.000%" in d.reason


def test_a_regressing_slice_blocks_and_a_small_slice_is_skipped():
    n = 2000
    y = labels(n)
    region = np.where(np.arange(n) < 1000, "north", "south").astype(object)
    region[:10] = "islands"
    region[10:20] = None
    holdout = pd.DataFrame({"region": region})
    north, south = region == "north", region == "south"
    champ = proba_with_accuracy(y, 0.75, seed=2)
    chal = champ.copy()
    # challenger: perfect on north, worse on south, wrong on every "islands" row
    y_idx = (y == "yes").astype(int)
    chal[north] = np.eye(2)[y_idx[north]] * 0.6 + 0.2
    wrong_south = np.flatnonzero(south)[::5]
    chal[wrong_south] = np.eye(2)[1 - y_idx[wrong_south]] * 0.6 + 0.2
    chal[:10] = np.eye(2)[1 - y_idx[:10]] * 0.6 + 0.2
    d = evaluate(y_true=y, challenger_proba=chal, champion_proba=champ, classes=CLASSES, holdout=holdout,
                 policy=policy(slice_columns=["region"], max_slice_regression=0.05, min_slice_rows=30,
                               required_confidence=0.0))
    by_value = {s["value"]: s for s in d.slices}
    assert set(by_value) == {"islands", None, "north", "south"}
    assert by_value["islands"]["skipped"] == "10 rows < min_slice_rows 30" and by_value["islands"]["ok"]
    assert by_value[None]["rows"] == 10 and by_value[None]["skipped"]
    assert by_value["north"]["ok"] and by_value["north"]["delta"] > 0
    south_slice = by_value["south"]
    assert not south_slice["ok"] and south_slice["delta"] < -0.05 and south_slice["rows"] == 1000
    assert d.improvement > 0 and not d.blessed
    assert [c["name"] for c in d.checks if not c["passed"]] == ["slices"]
    assert d.reason.startswith(f"reject: slice region=south accuracy fell {-south_slice['delta']:.3f} > 0.050")


def test_low_bootstrap_confidence_blocks_a_small_noisy_gain():
    y = labels(200)
    champ = proba_with_accuracy(y, 0.70, seed=2)
    chal = champ.copy()
    y_idx = (y == "yes").astype(int)
    # challenger fixes 3 of the champion's mistakes and makes 2 new ones: +1 row out of 200
    wrong = np.flatnonzero(champ.argmax(1) != y_idx)[:3]
    right = np.flatnonzero(champ.argmax(1) == y_idx)[:2]
    chal[wrong] = champ[wrong][:, ::-1]
    chal[right] = champ[right][:, ::-1]
    d = evaluate(y_true=y, challenger_proba=chal, champion_proba=champ, classes=CLASSES, holdout=frame(200),
                 policy=policy(required_confidence=0.9))
    assert d.improvement == pytest.approx(0.005)
    assert 0.2 < d.confidence < 0.9
    assert not d.blessed
    assert [c["name"] for c in d.checks if not c["passed"]] == ["confidence"]
    assert d.reason == f"reject: confidence {d.confidence:.3f} < 0.9"


def test_the_bootstrap_is_paired_so_a_consistent_small_gain_is_confident():
    y = labels(2000)
    champ = proba_with_accuracy(y, 0.80, seed=2)
    chal = champ.copy()
    fixed = np.flatnonzero(champ.argmax(1) != (y == "yes"))[:10]
    chal[fixed] = champ[fixed][:, ::-1]  # right where the champion was wrong, identical elsewhere
    d = evaluate(y_true=y, challenger_proba=chal, champion_proba=champ, classes=CLASSES, holdout=frame(2000),
                 policy=policy(required_confidence=0.99))
    assert d.improvement == pytest.approx(0.005)
    assert d.confidence > 0.99 and d.blessed, d.reason


def test_nan_metrics_never_promote():
    y = labels(300)
    broken = proba_with_accuracy(y, 0.9, seed=1)
    broken[5] = np.nan
    good = proba_with_accuracy(y, 0.7, seed=2)
    d = evaluate(y_true=y, challenger_proba=broken, champion_proba=good, classes=CLASSES, holdout=frame(300),
                 policy=policy())
    assert not d.blessed and "challenger accuracy is undefined" in d.reason
    assert math.isnan(d.challenger_metrics["accuracy"]) and d.to_dict()["challenger_metrics"]["accuracy"] is None
    alone = evaluate(y_true=y, challenger_proba=broken, champion_proba=None, classes=CLASSES, holdout=frame(300),
                     policy=policy())
    assert not alone.blessed and "undefined" in alone.reason
    single_class = np.array(["yes"] * 100)
    auc = evaluate(y_true=single_class, challenger_proba=proba_with_accuracy(single_class, 0.9, seed=1),
                   champion_proba=proba_with_accuracy(single_class, 0.5, seed=2), classes=CLASSES,
                   holdout=frame(100), policy=policy(primary_metric="roc_auc"))
    assert not auc.blessed and "challenger and champion roc_auc is undefined" in auc.reason


def test_log_loss_lower_is_better_and_its_floor_is_a_ceiling():
    y = labels(2000)
    sharp = proba_with_accuracy(y, 0.8, seed=1, confidence=0.8)   # calibrated: right 80% at 0.8
    overconfident = proba_with_accuracy(y, 0.8, seed=1, confidence=0.99)
    pol = policy(primary_metric="log_loss", floor=0.6, min_improvement=0.05)
    better = evaluate(y_true=y, challenger_proba=sharp, champion_proba=overconfident, classes=CLASSES,
                      holdout=frame(2000), policy=pol)
    assert better.challenger_metrics["log_loss"] < better.champion_metrics["log_loss"]
    assert better.blessed, better.reason
    assert better.improvement == pytest.approx(better.champion_metrics["log_loss"] -
                                               better.challenger_metrics["log_loss"])
    worse = evaluate(y_true=y, challenger_proba=overconfident, champion_proba=sharp, classes=CLASSES,
                     holdout=frame(2000), policy=pol)
    assert not worse.blessed and worse.improvement < 0 and worse.confidence == 0.0
    over_ceiling = evaluate(y_true=y, challenger_proba=overconfident, champion_proba=None, classes=CLASSES,
                            holdout=frame(2000), policy=pol)
    assert not over_ceiling.blessed and "> ceiling 0.600" in over_ceiling.reason


def test_multiclass_metrics_match_hand_computed_values():
    classes = ["a", "b", "c"]
    y = np.array([0, 0, 1, 1, 2, 2])
    p = np.array([[0.7, 0.2, 0.1],   # a, right
                  [0.2, 0.7, 0.1],   # a predicted b
                  [0.1, 0.8, 0.1],   # b, right
                  [0.1, 0.6, 0.3],   # b, right
                  [0.2, 0.2, 0.6],   # c, right
                  [0.5, 0.1, 0.4]])  # c predicted a
    m = compute_metrics(y, p, classes)
    assert m["accuracy"] == pytest.approx(4 / 6)
    # per-class F1: a: tp1 fp1 fn1 -> 0.5; b: tp2 fp1 fn0 -> 0.8; c: tp1 fp0 fn1 -> 2/3
    assert m["f1_macro"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert m["log_loss"] == pytest.approx(-np.mean(np.log([0.7, 0.2, 0.8, 0.6, 0.6, 0.4])))
    # one-vs-rest AUC by counting (positive, negative) pairs, a tie counting one half
    def auc(k):
        pos, neg = p[y == k, k], p[y != k, k]
        return np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
    assert m["roc_auc"] == pytest.approx(np.mean([auc(0), auc(1), auc(2)]))


@pytest.mark.parametrize("n_classes", [2, 3])
def test_vectorised_bootstrap_metrics_agree_with_the_point_metrics(n_classes):
    rng = np.random.default_rng(n_classes)
    n = 500
    y = rng.integers(0, n_classes, n)
    logits = rng.normal(size=(n, n_classes))
    logits[np.arange(n), y] += 1.0
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    p[:20] = np.round(p[:20], 1)  # ties in scores
    p[:20] /= p[:20].sum(axis=1, keepdims=True)
    classes = list(range(n_classes))
    rows = rng.integers(0, n, n)
    weights = np.stack([np.ones(n), np.bincount(rows, minlength=n)]).astype(float)
    for metric in METRICS:
        got = _resampled_metric(metric, weights, y, p)
        assert got[0] == pytest.approx(compute_metrics(y, p, classes)[metric], rel=1e-9), metric
        assert got[1] == pytest.approx(compute_metrics(y[rows], p[rows], classes)[metric], rel=1e-9), metric


def test_same_seed_same_decision_other_seed_other_resamples():
    y = labels(300)
    champ = proba_with_accuracy(y, 0.70, seed=2)
    chal = proba_with_accuracy(y, 0.72, seed=3)
    kw = dict(y_true=y, challenger_proba=chal, champion_proba=champ, classes=CLASSES, holdout=frame(300))
    first = evaluate(**kw, policy=policy(bootstrap_seed=7, slice_columns=["region"]))
    again = evaluate(**kw, policy=policy(bootstrap_seed=7, slice_columns=["region"]))
    other = evaluate(**kw, policy=policy(bootstrap_seed=8, slice_columns=["region"]))
    assert json.dumps(first.to_dict(), sort_keys=True) == json.dumps(again.to_dict(), sort_keys=True)
    assert 0 < first.confidence < 1 and other.confidence != first.confidence


def test_multiclass_gate_with_roc_auc_and_f1():
    rng = np.random.default_rng(0)
    classes = ["a", "b", "c"]
    n = 1500
    y_idx = rng.integers(0, 3, n)

    def model(signal: float) -> np.ndarray:
        logits = rng.normal(size=(n, 3))
        logits[np.arange(n), y_idx] += signal
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)

    strong, weak = model(2.0), model(0.5)
    y = np.asarray(classes, dtype=object)[y_idx]
    for metric in ("roc_auc", "f1_macro"):
        d = evaluate(y_true=y, challenger_proba=strong, champion_proba=weak, classes=classes, holdout=frame(n),
                     policy=policy(primary_metric=metric, min_improvement=0.1))
        assert d.blessed, d.reason
        assert d.challenger_metrics[metric] > d.champion_metrics[metric] + 0.1


# --- policy, report, helpers ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"primary_metric": "auc"}, "use one of"),
    ({"primary_metric": "accuracy", "floor": 1.5}, "accuracy is a probability metric that lies in [0, 1]"),
    ({"primary_metric": "log_loss", "floor": -1.0}, "log_loss is an error metric (>= 0, in nats"),
    ({"primary_metric": "rmse", "floor": -1.0}, "rmse is an error metric (>= 0, in the target units"),
    ({"primary_metric": "r2", "floor": 1.5}, "r2 is at most 1"),
    ({"primary_metric": "roc_auc", "min_improvement": 2.0}, "roc_auc is a probability metric"),
    ({"floor": math.inf}, "use a finite number"),
    ({"min_improvement": -0.1}, "min_improvement=-0.1"),
    ({"slice_columns": "region"}, "use a list of column names"),
    ({"bootstrap_samples": 0}, "bootstrap_samples=0"),
    ({"required_confidence": 1.5}, "share in [0, 1]"),
    ({"min_slice_rows": 0}, "min_slice_rows=0"),
])
def test_policy_rejects_bad_values_with_the_fix(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PromotionPolicy(**kw)


def test_policy_round_trips_and_rejects_unknown_keys():
    p = PromotionPolicy(primary_metric="f1_macro", floor=0.5, slice_columns=["region", "plan"])
    assert p.slice_columns == ("region", "plan")
    assert PromotionPolicy.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError, match=r"unknown promotion key\(s\) \['florr'\]"):
        PromotionPolicy.from_dict({"florr": 0.5})


def test_decision_is_json_ready_round_trips_and_flattens_for_kfp():
    y = labels(500)
    d = evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.9, seed=1),
                 champion_proba=proba_with_accuracy(y, 0.8, seed=2), classes=CLASSES, holdout=frame(500),
                 policy=policy(slice_columns=["region"]))
    text = json.dumps(d.to_dict(), allow_nan=False)
    assert Decision.from_dict(json.loads(text)) == d
    flat = kfp_metrics(d)
    assert flat["blessed"] == 1.0 and flat["challenger_accuracy"] == pytest.approx(0.9)
    assert flat["champion_accuracy"] == pytest.approx(0.8) and flat["confidence"] == d.confidence
    assert flat["slices_failed"] == 0.0 and all(isinstance(v, float) for v in flat.values())
    alone = kfp_metrics(evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.9, seed=1),
                                 champion_proba=None, classes=CLASSES, holdout=frame(500), policy=policy()))
    assert "confidence" not in alone and "champion_accuracy" not in alone and alone["blessed"] == 1.0


def test_align_proba_reorders_and_zero_fills_unknown_classes():
    p = np.array([[0.9, 0.1], [0.3, 0.7]])
    assert np.array_equal(align_proba(p, ["b", "a"], ["a", "b", "c"]), [[0.1, 0.9, 0.0], [0.7, 0.3, 0.0]])
    with pytest.raises(ValueError, match=r"predicts classes \['z'\]"):
        align_proba(p, ["a", "z"], ["a", "b"])


def test_bad_inputs_name_the_problem():
    y = labels(10)
    with pytest.raises(ValueError, match="labels \\['maybe'\\]"):
        evaluate(y_true=np.r_[y[:9], ["maybe"]], challenger_proba=np.full((10, 2), 0.5), champion_proba=None,
                 classes=CLASSES, holdout=frame(10), policy=policy())
    with pytest.raises(ValueError, match="slice columns \\['plan'\\] are not in the holdout"):
        evaluate(y_true=y, challenger_proba=np.full((10, 2), 0.5), champion_proba=None, classes=CLASSES,
                 holdout=frame(10), policy=policy(slice_columns=["plan"]))
    with pytest.raises(ValueError, match="proba has shape \\(10, 3\\)"):
        compute_metrics(np.zeros(10, dtype=int), np.full((10, 3), 1 / 3), CLASSES)


# --- the trivial baseline, default metric, thresholds, per-class figures -----------------------------------

def rare_labels(n: int, share: float = 0.03, seed: int = 0) -> np.ndarray:
    """Binary labels with exactly round(share * n) 'yes' rows at random positions."""
    y = np.full(n, "no", dtype=object)
    y[np.random.default_rng(seed).permutation(n)[:round(share * n)]] = "yes"
    return y


def scores(y: np.ndarray, signal: float, seed: int) -> np.ndarray:
    """Binary probabilities whose 'yes' score is noise plus ``signal`` on the positive rows."""
    rng = np.random.default_rng(seed)
    logit = rng.normal(size=len(y)) + signal * (y == "yes") - 3.0
    p = 1 / (1 + np.exp(-logit))
    return np.column_stack([1 - p, p])


def test_a_first_model_no_better_than_the_majority_class_is_rejected_naming_the_baseline():
    y = rare_labels(2000)
    priors = np.array([0.97, 0.03])
    constant_ish = np.tile([0.99, 0.01], (2000, 1))  # a model that learnt nothing: always "no", no ranking
    d = evaluate(y_true=y, challenger_proba=constant_ish, champion_proba=None, classes=CLASSES,
                 holdout=frame(2000), policy=policy(primary_metric="accuracy"), train_priors=priors)
    assert d.challenger_metrics["accuracy"] == pytest.approx(0.97) == d.baseline_metrics["accuracy"]
    assert not d.blessed
    assert d.reason == ("reject: accuracy 0.970 vs baseline 0.970 (always 'no', training priors): not beaten "
                        "(+0.000, confidence 0.000 < 0.9) (no champion)")
    assert check(d, "baseline")["passed"] is False and check(d, "floor")["passed"] is True
    by_default = evaluate(y_true=y, challenger_proba=constant_ish, champion_proba=None, classes=CLASSES,
                          holdout=frame(2000), policy=policy(), train_priors=priors)
    assert by_default.primary_metric == "roc_auc" and not by_default.blessed
    assert by_default.baseline_metrics["roc_auc"] == 0.5 and "vs baseline 0.500" in by_default.reason
    report = json.loads(json.dumps(by_default.to_dict(), allow_nan=False))
    assert report["baseline_metrics"]["accuracy"] == pytest.approx(0.97)
    assert report["baseline"]["kind"] == "majority_class" and report["baseline"]["predicts"] == "no"
    assert report["baseline"]["priors"] == [0.97, 0.03]
    assert report["baseline_metrics"]["log_loss"] == pytest.approx(
        -(0.97 * np.log(0.97) + 0.03 * np.log(0.03)), rel=1e-9)


def test_a_model_that_ranks_the_rare_class_beats_the_baseline_and_is_promoted():
    y = rare_labels(2000)
    d = evaluate(y_true=y, challenger_proba=scores(y, signal=3.0, seed=1), champion_proba=None, classes=CLASSES,
                 holdout=frame(2000), policy=policy(), train_priors=np.array([0.97, 0.03]))
    assert d.blessed, d.reason
    assert d.primary_metric == "roc_auc" and "rare" in d.metric_reason and "3.0%" in d.metric_reason
    assert d.challenger_metrics["roc_auc"] > 0.9 and d.baseline["confidence"] == 1.0
    assert d.baseline["improvement"] == pytest.approx(d.challenger_metrics["roc_auc"] - 0.5)
    flat = kfp_metrics(d)
    assert flat["baseline_roc_auc"] == 0.5 and flat["confidence_vs_baseline"] == 1.0


def test_beating_the_champion_is_not_enough_when_the_baseline_is_not_beaten():
    y = rare_labels(2000)
    worse, bad = scores(y, signal=-1.0, seed=2), scores(y, signal=-0.2, seed=3)
    d = evaluate(y_true=y, challenger_proba=bad, champion_proba=worse, classes=CLASSES, holdout=frame(2000),
                 policy=policy(required_confidence=0.5), train_priors=np.array([0.97, 0.03]))
    assert d.challenger_metrics["roc_auc"] > d.champion_metrics["roc_auc"]
    assert not d.blessed
    assert [c["name"] for c in d.checks if not c["passed"]] == ["baseline"]
    assert d.reason.startswith(f"reject: roc_auc {d.challenger_metrics['roc_auc']:.3f} vs baseline 0.500")


@pytest.mark.parametrize("priors, metric, words", [
    ([0.97, 0.03], "roc_auc", "rare (3.0% of training rows < 20%)"),
    ([0.69, 0.31], "accuracy", "minority class share 31.0% >= 20%"),
    ([0.5, 0.3, 0.2], "f1_macro", "multi-class target (3 classes)"),
])
def test_the_default_primary_metric_follows_the_target_and_says_why(priors, metric, words):
    assert default_primary_metric(np.array(priors))[0] == metric
    assert words in default_primary_metric(np.array(priors))[1]


def test_an_explicit_primary_metric_always_wins():
    y = rare_labels(1000)
    d = evaluate(y_true=y, challenger_proba=scores(y, 3.0, seed=1), champion_proba=None, classes=CLASSES,
                 holdout=frame(1000), policy=policy(primary_metric="log_loss"), train_priors=np.array([0.97, 0.03]))
    assert d.primary_metric == "log_loss" and d.metric_reason == "set in promotion.primary_metric"
    assert d.policy["primary_metric"] == "log_loss"
    assert PromotionPolicy().primary_metric is None


def test_a_floor_for_the_default_metric_is_checked_once_the_metric_is_chosen():
    """Without ``primary_metric`` the floor's units are those of the metric the gate picks (issue 29 item 4)."""
    PromotionPolicy(floor=5.0)  # could be an RMSE ceiling: accepted until the target is known
    y = labels(200)
    with pytest.raises(ValueError, match=r"floor=5.0: accuracy is a probability metric that lies in \[0, 1\]"):
        evaluate(y_true=y, challenger_proba=proba_with_accuracy(y, 0.8, seed=1), champion_proba=None,
                 classes=CLASSES, holdout=frame(200), policy=policy(floor=5.0))


def test_thresholds_decide_the_predicted_class_in_every_label_metric():
    y_idx = np.array([0, 0, 0, 1, 1])
    p = np.array([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    assert compute_metrics(y_idx, p, CLASSES)["accuracy"] == pytest.approx(4 / 5)
    at_035 = compute_metrics(y_idx, p, CLASSES, threshold=0.35)
    assert at_035["accuracy"] == pytest.approx(4 / 5)  # row 3 now right, row 2 now wrong
    assert compute_metrics(y_idx, p, CLASSES, threshold=0.3)["accuracy"] == pytest.approx(3 / 5)
    assert at_035["log_loss"] == compute_metrics(y_idx, p, CLASSES)["log_loss"]  # probabilities unchanged
    w = np.ones((1, 5))
    for metric in ("accuracy", "f1_macro"):
        assert _resampled_metric(metric, w, y_idx, p, 0.3)[0] == pytest.approx(
            compute_metrics(y_idx, p, CLASSES, threshold=0.3)[metric])


def test_per_class_figures_and_the_minority_class_in_each_slice():
    n = 1000
    y = rare_labels(n, share=0.1, seed=4)
    chal = scores(y, 4.0, seed=1)
    champ = scores(y, 1.0, seed=2)
    d = evaluate(y_true=y, challenger_proba=chal, champion_proba=champ, classes=CLASSES, holdout=frame(n),
                 policy=policy(slice_columns=["region"], required_confidence=0.0), train_priors=np.array([0.9, 0.1]),
                 challenger_threshold=0.2)
    y_idx, pred = (y == "yes").astype(int), (chal[:, 1] >= 0.2).astype(int)
    yes = next(r for r in d.per_class if r["class"] == "yes")
    tp = int(((pred == 1) & (y_idx == 1)).sum())
    assert yes["support"] == 100
    assert yes["challenger"]["precision"] == pytest.approx(tp / pred.sum())
    assert yes["challenger"]["recall"] == pytest.approx(tp / 100)
    assert yes["champion"]["recall"] == pytest.approx(((champ.argmax(1) == 1) & (y_idx == 1)).sum() / 100)
    north = next(s for s in d.slices if s["value"] == "north")
    rows = frame(n)["region"].to_numpy() == "north"
    assert north["minority"]["class"] == "yes" and north["minority"]["support"] == int(y_idx[rows].sum())
    assert north["minority"]["challenger"]["recall"] == pytest.approx(
        ((pred == 1) & (y_idx == 1) & rows).sum() / (y_idx[rows]).sum())
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_every_decision_reports_the_linear_baseline_and_require_beat_linear_makes_it_gate():
    """Issue 29 item 8: a challenger worse than the linear model is promoted with a note by default, and rejected
    with ``require_beat_linear``; one that beats it passes either way."""
    y = labels(1000)
    weak, strong = proba_with_accuracy(y, 0.7, seed=1), proba_with_accuracy(y, 0.85, seed=2)
    kind = {"kind": "logistic_regression", "rows": 4000, "threshold": None}

    def decide(chal, lin, **kw):
        return evaluate(y_true=y, challenger_proba=chal, champion_proba=None, classes=CLASSES, holdout=frame(1000),
                        policy=policy(primary_metric="accuracy", **kw), linear={**kind, "proba": lin})

    noted = decide(weak, strong)
    assert noted.blessed and noted.linear["gating"] is False and not noted.linear["beaten"]
    assert noted.linear_metrics["accuracy"] == pytest.approx(0.85)
    assert "Note: accuracy 0.700 vs linear baseline 0.850 (logistic_regression): not beaten" in noted.reason
    assert "linear_baseline" not in {c["name"] for c in noted.checks}
    assert kfp_metrics(noted)["linear_accuracy"] == pytest.approx(0.85)
    gated = decide(weak, strong, require_beat_linear=True)
    assert not gated.blessed and check(gated, "linear_baseline")["passed"] is False, gated.reason
    assert "a linear model does as well or better" in gated.reason
    beaten = decide(strong, weak, require_beat_linear=True)
    assert beaten.blessed and beaten.linear["beaten"] and beaten.linear["confidence"] >= 0.9, beaten.reason
    assert Decision.from_dict(json.loads(json.dumps(beaten.to_dict()))).linear_metrics == beaten.linear_metrics
    with pytest.raises(ValueError, match="require_beat_linear is set but the challenger recorded no linear"):
        evaluate(y_true=y, challenger_proba=strong, champion_proba=None, classes=CLASSES, holdout=frame(1000),
                 policy=policy(require_beat_linear=True))

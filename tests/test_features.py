"""The one preprocessing: fitted once, saved as JSON, applied identically after a round trip."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from training.features import FeatureTransform, encode_target, target_classes


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"zeta": [3.0, None, 1.0, 5.0], "alpha": [10, 20, 30, 40],
                         "colour": ["red", None, "blue", "red"], "b_cat": ["x", "y", "x", "y"]})


def test_json_round_trip_keeps_column_order_and_values():
    df = _frame()
    fitted = FeatureTransform.fit(df, numeric=["zeta", "alpha"], categorical=["colour", "b_cat"])
    # sort_keys JSON (as the model directory writes it) must not reorder the matrix columns
    loaded = FeatureTransform.from_dict(json.loads(json.dumps(fitted.to_dict(), sort_keys=True)))
    assert list(loaded.numeric) == ["zeta", "alpha"] and list(loaded.categorical) == ["colour", "b_cat"]
    assert np.array_equal(loaded.transform(df), fitted.transform(df))


def test_nulls_and_unseen_categories_share_slot_zero():
    fitted = FeatureTransform.fit(_frame(), numeric=["zeta"], categorical=["colour"])
    out = fitted.transform(pd.DataFrame({"zeta": [None], "colour": ["purple"], "extra": [1]}))
    assert out.shape == (1, fitted.n_outputs)
    assert out[0, 1] == 1.0  # null indicator of zeta
    assert out[0, 2:].tolist() == [1.0, 0.0, 0.0]  # unknown slot, then blue, red


def test_target_classes_and_encoding_errors():
    assert target_classes(pd.Series([1, 0, 1], name="y")) == [0, 1]
    with pytest.raises(ValueError, match="single class"):
        target_classes(pd.Series([1, 1], name="y"))
    with pytest.raises(ValueError, match=r"labels \[2\]"):
        encode_target(pd.Series([0, 2], name="y"), [0, 1])

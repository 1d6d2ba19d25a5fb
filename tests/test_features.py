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


def test_categories_map_to_the_vocabulary_alike_from_text_or_a_pandas_categorical():
    """A Parquet dictionary column arrives as a pandas Categorical (looked up once per category): its matrix equals
    the one of the same values as text, nulls, unseen values and numbers compared as text included."""
    fitted = FeatureTransform.fit(pd.DataFrame({"colour": ["red", "blue", "1"], "n": [1.0, 2.0, 3.0]}),
                                  numeric=["n"], categorical=["colour"])
    values = ["blue", None, "purple", "red", "1", "blue"]
    as_text = pd.DataFrame({"colour": values, "n": 1.0})
    as_category = pd.DataFrame({"colour": pd.Categorical(values, categories=["purple", "zzz", "blue", "red", "1"]),
                                "n": 1.0})
    as_numbers = pd.DataFrame({"colour": pd.Categorical([1, None, 1]), "n": 1.0})
    expected = fitted.transform(as_text)
    assert expected[:, 2:].argmax(axis=1).tolist() == [2, 0, 0, 3, 1, 2]  # slots: unknown, then 1, blue, red
    assert np.array_equal(fitted.transform(as_category), expected)
    assert fitted.transform(as_numbers)[:, 2:].argmax(axis=1).tolist() == [1, 0, 1]


def test_target_classes_and_encoding_errors():
    assert target_classes(pd.Series([1, 0, 1], name="y")) == [0, 1]
    with pytest.raises(ValueError, match="single class"):
        target_classes(pd.Series([1, 1], name="y"))
    with pytest.raises(ValueError, match=r"labels \[2\]"):
        encode_target(pd.Series([0, 2], name="y"), [0, 1])

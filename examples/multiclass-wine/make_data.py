"""Write wine.csv (178 wines, 13 chemical measurements, the cultivar as ``cultivar``: ``class_0``, ``class_1``,
``class_2``) from the copy of the data set that ships inside scikit-learn: nothing is downloaded.

    python make_data.py [OUT.csv]
"""
from __future__ import annotations

import sys
from pathlib import Path

from sklearn.datasets import load_wine


def write(out: Path) -> Path:
    """The bundled data set as CSV at ``out``, the target as the cultivar's name."""
    data = load_wine(as_frame=True)
    frame = data.frame.drop(columns="target").rename(columns=lambda c: c.replace("/", "_"))
    frame["cultivar"] = [str(data.target_names[i]) for i in data.target]
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("wine.csv"))).resolve())

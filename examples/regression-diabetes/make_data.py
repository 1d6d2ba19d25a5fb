"""Write diabetes.csv (442 patients, 10 features, disease progression one year later as ``progression``) from the
copy of the data set that ships inside scikit-learn: nothing is downloaded.

    python make_data.py [OUT.csv]
"""
from __future__ import annotations

import sys
from pathlib import Path

from sklearn.datasets import load_diabetes


def write(out: Path) -> Path:
    """The bundled data set, unscaled, as CSV at ``out``."""
    frame = load_diabetes(as_frame=True, scaled=False).frame.rename(columns={"target": "progression"})
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("diabetes.csv"))).resolve())

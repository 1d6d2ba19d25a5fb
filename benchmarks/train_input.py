"""The training input of one rank, as ``training/train.py`` builds it: the whole table read, the features fitted and
transformed, the rank's share of the rows; prints one JSON line (rows, rank_rows, seconds).

    .venv/bin/python -m benchmarks.train_input PATH --rank 0 --world-size 2 [--target label]

Run in its own process, so its peak RSS (read by ``benchmarks/scale.py``) is the input pipeline's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from data.validation import read_table_source
from training.features import FeatureTransform, encode_target, target_classes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--target", default="label")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    df, _ = read_table_source(args.path)
    features = [c for c in df.columns if c != args.target]
    numeric = [c for c in features if pd.api.types.is_numeric_dtype(df[c])]
    categorical = [c for c in features if c not in numeric]
    transform = FeatureTransform.fit(df, numeric=numeric, categorical=categorical)
    shard = df.iloc[args.rank::args.world_size]
    x = transform.transform(shard)
    y = encode_target(shard[args.target], target_classes(df[args.target]))
    print(json.dumps({"rows": len(df), "rank_rows": len(x), "labels": len(y),
                      "seconds": round(time.perf_counter() - start, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

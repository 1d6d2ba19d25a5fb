"""A table as an Open Inference Protocol v2 request (one input per column, ``content_type: pd``) and a v2 response
back as a table: what a client of ``kfloop serve-model`` sends and reads."""
from __future__ import annotations

import pandas as pd
from kserve.protocol.infer_type import InferInput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype

from training.serving.predictor import TABLE_CONTENT_TYPE


def table_request(frame: pd.DataFrame, model_name: str, **parameters: str) -> InferRequest:
    """``frame``'s columns as the inputs of a v2 request; nulls (NaN, None) travel as JSON ``null``; text columns as
    ``BYTES``; ``parameters`` (e.g. ``on_schema_violation="error"``) beside ``content_type``.

    Raises:
        ValueError: a column v2 has no datatype for (dates, mixed objects), named.
    """
    inputs = []
    for name in frame.columns:
        column = frame[name]
        datatype = from_np_dtype(column.dtype) or "BYTES"
        if datatype == "BYTES" and not column.dropna().map(type).eq(str).all():
            raise ValueError(f"column {name!r} ({column.dtype}) has no Open Inference Protocol datatype: send "
                             "numbers, booleans or text")
        data = column.astype(object).where(column.notna(), None).tolist()
        inputs.append(InferInput(name=str(name), shape=[len(frame)], datatype=datatype, data=data))
    return InferRequest(model_name=model_name, infer_inputs=inputs,
                        parameters={"content_type": TABLE_CONTENT_TYPE, **parameters})


def response_table(response: InferResponse) -> pd.DataFrame:
    """The outputs of a v2 response as columns of one table; ``BYTES`` as text (gRPC carries them as bytes)."""
    return pd.DataFrame({output.name: [v.decode() if isinstance(v, bytes) else v for v in output.data]
                         if output.datatype == "BYTES" else output.data for output in response.outputs})

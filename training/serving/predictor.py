"""The kfloop predictor on the KServe SDK: a ``kserve.Model`` answering Open Inference Protocol v2 with the pyfunc's
predictions and the schema check's ``schema_violations`` per row, served by ``kserve.ModelServer`` (REST, and gRPC
as the SDK gives it)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kserve
import mlflow
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferRequest, InferResponse, to_http_parameters
from kserve.utils.utils import get_predict_response

from data.schema_rules import (DEFAULT_LIMITS, ON_VIOLATION_PARAM, SchemaViolationError, ServingLimits, check_mode,
                               check_rows)
from training.serving.load import ModelSource, load_version

TABLE_CONTENT_TYPE = "pd"
"""``parameters.content_type`` of a request whose inputs are a table's columns (kserve's
``InferRequest.as_dataframe``)."""
InferenceHook = Callable[[InferRequest, InferResponse], None]
"""Called with each answered request and its response (the inference-log writer's place)."""


class KfloopPredictor(kserve.Model):
    """One registered version (or downloaded model folder) behind ``/v2/models/<name>/infer``."""

    def __init__(self, name: str, source: ModelSource, *, limits: ServingLimits = DEFAULT_LIMITS,
                 on_inference: InferenceHook | None = None):
        super().__init__(name)
        self.source, self.limits, self.on_inference = source, limits, on_inference
        self.pyfunc: mlflow.pyfunc.PyFuncModel | None = None

    def load(self) -> bool:
        """Load the model (:func:`training.serving.load.load_version`); ready afterwards."""
        self.pyfunc = load_version(self.source)
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest | dict, headers: dict[str, str] | None = None,
                response_headers: dict[str, str] | None = None) -> InferResponse:
        """Score the table in ``payload``: one output per column of the pyfunc's answer (``prediction``,
        ``proba_<class>``, ``schema_violations``), one value per row. ``parameters.on_schema_violation`` is the
        pyfunc's mode (``flag`` by default, ``error``, ``ignore``).

        Raises:
            kserve.errors.InvalidInput: (HTTP 400) not a v2 table request, more rows than ``limits.max_rows``, an
                unknown mode, or ``error`` mode and rows outside the schema.
        """
        request = self._table_request(payload)
        try:
            mode = check_mode(to_http_parameters(request.parameters or {}))
            scored = self.pyfunc.predict(request.as_dataframe(), params={ON_VIOLATION_PARAM: mode})
        except (SchemaViolationError, ValueError) as exc:
            raise InvalidInput(str(exc)) from exc
        response = get_predict_response(request, scored, self.name)
        if self.on_inference is not None:
            self.on_inference(request, response)
        return response

    def _table_request(self, payload: Any) -> InferRequest:
        """``payload`` once it is a v2 table of at most ``limits.max_rows`` rows, checked before the table is built.

        Raises:
            kserve.errors.InvalidInput: why it is not.
        """
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"kfloop answers the Open Inference Protocol v2: POST /v2/models/{self.name}/infer "
                               f"with one input per column and parameters.content_type {TABLE_CONTENT_TYPE!r}")
        content_type = to_http_parameters(payload.parameters or {}).get("content_type")  # gRPC: InferParameter
        if content_type != TABLE_CONTENT_TYPE:
            raise InvalidInput(f"parameters.content_type={content_type!r}: send the table's columns as inputs with "
                               f"parameters.content_type {TABLE_CONTENT_TYPE!r}")
        if not payload.inputs:
            raise InvalidInput("no inputs: send one input per column of the table")
        rows = {len(column.data) for column in payload.inputs}
        if len(rows) != 1 or any(column.shape != [len(column.data)] for column in payload.inputs):
            raise InvalidInput("inputs of a table are columns of equal length, each of shape [rows]: got "
                               + ", ".join(f"{c.name} shape {c.shape} with {len(c.data)} values"
                                           for c in payload.inputs))
        try:
            check_rows(rows.pop(), self.limits)
        except SchemaViolationError as exc:
            raise InvalidInput(str(exc)) from exc
        return payload


def serve(predictor: KfloopPredictor, *, http_port: int, grpc_port: int) -> None:
    """Load ``predictor`` and serve it until SIGTERM or SIGINT (``kserve.ModelServer``: REST on ``http_port``, gRPC
    on ``grpc_port``)."""
    predictor.load()
    kserve.ModelServer(http_port=http_port, grpc_port=grpc_port, workers=1).start([predictor])

"""Trigger conditions (``triggerPolicy.condition``, what ``dsl.If`` compiles to) evaluated as KFP's driver evaluates
them: kubeflow/pipelines ``backend/src/v2/expression/expression.go`` (``Condition``), called from
``backend/src/v2/driver/dag.go`` and ``driver/container.go``, whose error fails the task (the driver returns it; the
run fails), never a skip.

The expression is CEL (cel-go upstream; here the ``common-expression-language`` bindings of the cel Rust crate),
over the task's ``ExecutorInput`` as a map of its fields (``msgToCELMap`` with unset fields present: ``inputs`` with
``parameter_values``, ``parameters`` and ``artifacts``, and ``outputs``), with the one custom function
``parseJson(string)``. A parse error, an unknown variable or function, a missing key or a result that is not a bool
is an error; upstream's own cases (``expression_test.go`` ``TestCondition``) are ported in
tests/cluster/test_kfp_server.py.
"""
from __future__ import annotations

import json
from typing import Any

import cel


class ConditionError(Exception):
    """The condition cannot be evaluated: the driver fails the task with this."""


def condition(executor_input: dict[str, Any], expression: str) -> bool:
    """``Expr.Condition``: whether the task runs.

    Raises:
        ConditionError: the expression does not parse or evaluate, or is not a bool.
    """
    inputs = executor_input.get("inputs", {})
    fields = {"inputs": {"parameters": {}, "artifacts": {}, "parameter_values": {}, **inputs},
              "outputs": executor_input.get("outputs", {})}
    context = cel.Context(variables=fields, functions={"parseJson": json.loads})
    try:
        result = cel.evaluate(expression, context)
    except KeyError as err:
        raise ConditionError(f"evaluation error: no such key: {err.args[0]}") from None
    except (ValueError, TypeError, RuntimeError) as err:
        raise ConditionError(f"evaluation error: {err}") from None
    if not isinstance(result, bool):
        raise ConditionError(f"evaluation error: return type is not bool, got {result!r}")
    return result

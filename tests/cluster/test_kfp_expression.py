"""Trigger conditions as KFP's driver evaluates them (tests/cluster/kfp_expression.py): upstream's own cases,
kubeflow/pipelines ``backend/src/v2/expression/expression_test.go`` ``TestCondition``, and what fails a task."""
import pytest
from cluster.kfp_expression import ConditionError, condition

INPUT = {"inputs": {
    "artifacts": {"model": {"artifacts": [{"name": "model", "type": {"schemaTitle": "system.Model"},
                                           "uri": "gs://pipeline-root/abcdefgh", "metadata": {"accuracy": 0.95}}]}},
    "parameter_values": {"type": "foo", "num": 1.0}}}


@pytest.mark.parametrize("executor_input, expression, output", [
    (INPUT, "inputs.parameter_values['type']=='foo'", True),
    (INPUT, "inputs.parameter_values['type']=='foo2'", False),
    (INPUT, "inputs.parameter_values['num'] == 1", True),  # errorOnTypeMismatch: double == int holds in CEL
    (INPUT, "inputs.parameter_values['type']=='foo' && inputs.parameter_values['num'] == 1.0", True),
    (INPUT, "inputs.artifacts['model'].artifacts[0].metadata['accuracy']*100.0 > 90.0", True),
    (INPUT, "inputs.artifacts['model'].artifacts[0].metadata['accuracy']*100.0 <= 90.0", False),
])
def test_upstream_condition_cases(executor_input, expression, output):
    assert condition(executor_input, expression) is output


@pytest.mark.parametrize("executor_input, expression, error", [
    ({}, "inputs.parameter_values['type']=='foo'", "no such key"),  # upstream's case on an empty ExecutorInput
    (INPUT, "inputs.parameter_values['pipelinechannel--typo-Output'] == 'go'", "no such key"),
    (INPUT, "lower(inputs.parameter_values['type']) == 'foo'", "evaluation error: Undefined variable or function"),
    (INPUT, "inputs.parameter_values['type'] ==", "evaluation error: Failed to parse expression"),
    (INPUT, "inputs.parameter_values['type']", "return type is not bool, got 'foo'"),
    (INPUT, "parseJson('{') == 1", "evaluation error: Function 'parseJson' error"),
])
def test_a_condition_that_cannot_be_evaluated_is_an_error_not_a_skip(executor_input, expression, error):
    with pytest.raises(ConditionError, match="^evaluation error: ") as failed:
        condition(executor_input, expression)
    assert error in str(failed.value)


def test_parse_json_is_the_drivers_custom_function():
    assert condition({"inputs": {"parameter_values": {"cfg": '{"epochs": 3}'}}},
                     "parseJson(inputs.parameter_values['cfg']).epochs == 3") is True

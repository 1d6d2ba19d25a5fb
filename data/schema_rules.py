"""The row-level rules of a pandera schema, checked vectorised: the one implementation behind ``kfloop validate``'s
value failures, the served model's ``schema_violations`` column and the drift check's schema-violation shares.

A column's rules: not null (unless nullable), a number (numeric columns; a whole number for integer columns), and
its checks: ranges (``in_range``, ``ge``, ``gt``, ``le``, ``lt``), allowed (``isin``) and forbidden (``notin``)
values are computed with numpy; any other check runs as pandera runs it. Each check sees the column's non-null
values that have the column's type, so one bad value fails one rule. Whole-table rules (missing or extra columns,
uniqueness, row counts) stay with pandera in :func:`data.validation.validate`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
import pandera.pandas as pa

from data.errors import KfloopError
from data.text import shorten

Kind = Literal["unexpected_null", "wrong_type", "out_of_range", "unseen_category", "failed_check"]
KINDS: tuple[Kind, ...] = get_args(Kind)
"""How a value can fall outside the schema, the keys of :meth:`RuleSet.shares`."""

SMALL_BATCH = 2_000
"""Up to this many values, :func:`_isin` looks each up in a Python set (serving's batches: no pandas overhead);
above it pandas' hash table is faster."""
MAX_VALUE_CHARS = 40
"""A value is shown (``repr``) to this many characters in a message."""
_LOWER = {"greater_than": False, "greater_than_or_equal_to": True}
_UPPER = {"less_than": False, "less_than_or_equal_to": True}


@dataclass(frozen=True, slots=True)
class Rule:
    """One row-level rule of one column."""

    column: str
    name: str
    """The rule as ``kfloop validate`` names it: ``not_nullable``, ``dtype('int64')``, ``in_range(18, 100)``, ..."""
    kind: Kind
    describe: Callable[[Any], str]
    """One failing value as text, e.g. ``unseen category 'atlantis'``."""
    fails: Callable[[np.ndarray], np.ndarray] | None = None
    """Failing mask over the column's non-null values of the right type (finite float64 for a numeric column);
    None for the null, type and finite rules, which the column applies itself."""
    fails_nulls: bool = False
    """``fails`` may be given every value of an untyped (object) column, nulls included, and fails the nulls: its
    one pass then finds the column's few candidate nulls as well (``isin``)."""


@dataclass(frozen=True, slots=True)
class RuleFailures:
    """The rows of a frame that fail one rule."""

    rule: Rule
    positions: np.ndarray
    """Row positions (0-based, ascending)."""
    values: pd.Series
    """The failing values as the rule saw them (numbers for a numeric column's checks), indexed by row label."""


class RuleSet:
    """The row-level rules of ``schema``'s ``columns`` (default: all), built once, applied to many frames."""

    def __init__(self, schema: pa.DataFrameSchema, columns: Iterable[str] | None = None):
        names = list(schema.columns) if columns is None else [c for c in columns if c in schema.columns]
        self.columns = {name: _column_rules(name, schema.columns[name]) for name in names}
        self.known = frozenset(schema.columns)
        """Every column the schema names (features or not)."""

    def check(self, df: pd.DataFrame) -> list[RuleFailures]:
        """Every rule that fails on at least one row of ``df``, in column order (columns ``df`` lacks are skipped:
        the model signature or pandera reports those)."""
        return [failed for name, rules in self.columns.items() if name in df.columns
                for failed in rules.check(df[name])]

    def row_messages(self, df: pd.DataFrame, *, max_chars: int | None = None) -> np.ndarray:
        """Per row: ``""`` when clean, else ``column: problem`` per failed rule joined by ``"; "``, each value shown
        to :data:`MAX_VALUE_CHARS`; a message over ``max_chars`` is cut there (:func:`data.text.shorten`)."""
        out = np.empty(len(df), dtype=object)
        out.fill("")  # np.full is slower for objects
        touched = np.zeros(len(df), dtype=bool)
        for failed in self.check(df):
            texts = _texts(failed.rule, failed.values.to_numpy())
            before = out[failed.positions]
            out[failed.positions] = np.where(before == "", texts, before + "; " + texts)
            touched[failed.positions] = True
        if max_chars is not None:  # only rows with a message can be long
            rows = np.flatnonzero(touched)
            long = rows[np.fromiter(map(len, out[rows]), dtype=np.int64, count=len(rows)) > max_chars]
            out[long] = [shorten(text, max_chars) for text in out[long]]
        return out

    def shares(self, df: pd.DataFrame) -> dict[str, dict[str, float]]:
        """Per column ``df`` has: the share of its rows failing any rule (``share``) and per kind (:data:`KINDS`)."""
        n = max(len(df), 1)
        masks = {name: {kind: np.zeros(len(df), dtype=bool) for kind in KINDS} for name in self.columns
                 if name in df.columns}
        for failed in self.check(df):
            masks[failed.rule.column][failed.rule.kind][failed.positions] = True
        return {name: {"share": float(np.logical_or.reduce(list(kinds.values())).sum() / n),
                       **{kind: float(mask.sum() / n) for kind, mask in kinds.items()}}
                for name, kinds in masks.items()}


@dataclass(frozen=True, slots=True)
class _ColumnRules:
    """One column's rules and how its values are typed before the checks run."""

    values: Literal["number", "whole number", "text", "as is"]
    null: Rule | None
    """Set unless the column is nullable."""
    wrong_type: Rule | None
    """Set for numeric columns."""
    infinite: Rule | None
    """Set for numeric columns: ``inf`` and ``-inf`` are outside every schema, with or without a range."""
    checks: list[Rule]

    @property
    def rules(self) -> list[Rule]:
        """All of the column's rules, in the order they apply."""
        return [rule for rule in (self.null, self.wrong_type, self.infinite) if rule is not None] + self.checks

    def check(self, series: pd.Series) -> list[RuleFailures]:
        """The rules that fail on ``series``: nulls, then the type, then infinities, then each check on the (finite)
        values of the type. Works on numpy arrays: pandas' per-operation overhead would cost more than the checks."""
        if isinstance(series.dtype, pd.CategoricalDtype):  # an Arrow dictionary: check each category once
            return self._check_categories(series)
        array = series.to_numpy()
        first = next((rule for rule in self.checks if rule.fails_nulls), None)
        if first is not None and self.wrong_type is None and array.dtype == object:
            return self._check_untyped(series, array, first)
        null = pd.isna(array)
        failures = [] if self.null is None else [_failed(self.null, np.flatnonzero(null), array, series)]
        positions = np.flatnonzero(~null) if null.any() else np.arange(len(array))
        values = array[positions] if len(positions) < len(array) else array
        if self.wrong_type is not None:
            numbers = values.astype("float64", copy=False) if values.dtype.kind in "iuf" else \
                pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype="float64",
                                                                                      na_value=np.nan)
            if values.dtype.kind not in "iu":  # integers are finite whole numbers
                infinite = np.isinf(numbers)
                bad = np.isnan(numbers)
                if self.values == "whole number":
                    bad |= ~bad & ~infinite & (np.mod(numbers, 1) != 0)
                failures.append(_failed(self.wrong_type, positions[bad], array, series))
                failures.append(_failed(self.infinite, positions[infinite], array, series))
                keep = ~(bad | infinite)
                if not keep.all():  # copies only when a value is dropped
                    positions, numbers = positions[keep], numbers[keep]
            values = numbers
        elif self.values == "text" and values.dtype.kind not in "OUS":
            values = values.astype(str)
        for rule in self.checks:
            failures.append(self._checked(rule, rule.fails(values), positions, values, series))
        return [failed for failed in failures if failed is not None]

    def _checked(self, rule: Rule, failed: np.ndarray, positions: np.ndarray, values: np.ndarray,
                 series: pd.Series) -> RuleFailures | None:
        """``rule`` failing where ``failed`` (a mask over ``values``, at ``positions`` of ``series``); None when it
        failed nowhere. Pandas objects only for what failed: their overhead exceeds the checks."""
        if not failed.any():
            return None
        shown = values[failed]
        if self.values == "whole number":
            shown = [int(v) for v in shown]
        return RuleFailures(rule, positions[failed], pd.Series(
            shown, index=series.index[positions[failed]], dtype=object if self.values == "whole number" else None))

    def _check_untyped(self, series: pd.Series, array: np.ndarray, first: Rule) -> list[RuleFailures]:
        """:meth:`check` of an object column in one pass: ``first`` (:attr:`Rule.fails_nulls`) over every value
        fails the nulls too, so only the values it fails are tested for null; other checks see the non-null values."""
        suspects = np.flatnonzero(first.fails(array))
        null = pd.isna(array[suspects])
        nulls = suspects[null]
        failures = [] if self.null is None else [_failed(self.null, nulls, array, series)]
        positions = np.delete(np.arange(len(array)), nulls) if len(nulls) else np.arange(len(array))
        values = array[positions] if len(nulls) else array
        for rule in self.checks:
            if rule is first:
                failures.append(_failed(rule, suspects[~null], array, series))
            else:
                failures.append(self._checked(rule, rule.fails(values), positions, values, series))
        return [failed for failed in failures if failed is not None]

    def _check_categories(self, series: pd.Series) -> list[RuleFailures]:
        """The null rule on a Categorical's codes, then each check on its categories (the dictionary) once, taken
        to the rows by their codes."""
        codes, categories = series.array.codes, series.array.categories  # views, not the .cat accessor's copies
        nulls = np.flatnonzero(codes < 0) if self.null is not None else ()
        failures = [RuleFailures(self.null, nulls, pd.Series(None, index=series.index[nulls], dtype=object))] \
            if len(nulls) else []
        if self.values == "text" and categories.inferred_type != "string":
            categories = categories.astype(str)
        categories = categories.to_numpy()
        for rule in self.checks:
            failing = np.flatnonzero(np.asarray(rule.fails(categories), dtype=bool))
            failed = np.flatnonzero(np.isin(codes, failing)) if len(failing) else ()
            if len(failed):
                failures.append(RuleFailures(rule, failed, pd.Series(categories[codes[failed]],
                                                                     index=series.index[failed], dtype=object)))
        return failures


def _texts(rule: Rule, values: np.ndarray) -> np.ndarray:
    """``column: problem`` for each of ``values`` (:attr:`Rule.describe`), each distinct value described once:
    numbers told apart by their bits (``-0.0`` is shown apart from ``0.0``), text and whole numbers by value; other
    values one by one (``1``, ``1.0`` and ``True`` are equal but shown apart)."""
    if values.dtype == np.float64:
        codes, distinct = pd.factorize(values.view(np.int64))
        distinct = distinct.view(np.float64)
    elif pd.api.types.infer_dtype(values, skipna=False) in ("string", "integer"):
        codes, distinct = pd.factorize(values)
    else:
        codes, distinct = np.arange(len(values)), values
    return np.array([f"{rule.column}: {rule.describe(v)}" for v in distinct], dtype=object)[codes]


def _failed(rule: Rule, positions: np.ndarray, array: np.ndarray, series: pd.Series) -> RuleFailures | None:
    """``rule`` failing at ``positions``, with the values there as given; None when it failed nowhere."""
    if not len(positions):
        return None
    return RuleFailures(rule, positions, pd.Series(array[positions], index=series.index[positions], dtype=object))


def _column_rules(name: str, column: pa.Column) -> _ColumnRules:
    dtype = column.dtype.type if column.dtype is not None else None
    if dtype is not None and pd.api.types.is_bool_dtype(dtype):
        values = "as is"
    elif dtype is not None and pd.api.types.is_integer_dtype(dtype):
        values = "whole number"
    elif dtype is not None and pd.api.types.is_numeric_dtype(dtype):
        values = "number"
    elif dtype is not None and pd.api.types.is_string_dtype(dtype):
        values = "text"
    else:
        values = "as is"
    null = None if column.nullable else Rule(name, "not_nullable", "unexpected_null", lambda v: "unexpected null")
    wrong_type = infinite = None
    if values in ("number", "whole number"):
        wrong_type = Rule(name, f"dtype('{column.dtype}')", "wrong_type",
                          lambda v: f"{_shown(v)} is not a {values} ({column.dtype})")
        infinite = Rule(name, "finite", "out_of_range", lambda v: f"{float(v):g} is not a finite number")
    return _ColumnRules(values=values, null=null, wrong_type=wrong_type, infinite=infinite,
                        checks=[_check_rule(name, check) for check in column.checks])


def _check_rule(column: str, check: pa.Check) -> Rule:
    name, stats = str(check.error or check.name), check.statistics or {}
    if check.name in ("in_range", *_LOWER, *_UPPER):
        lo = stats.get("min_value") if check.name in ("in_range", *_LOWER) else None
        hi = stats.get("max_value") if check.name in ("in_range", *_UPPER) else None
        lo_incl = stats.get("include_min", _LOWER.get(check.name, True))
        hi_incl = stats.get("include_max", _UPPER.get(check.name, True))

        def below(v):
            return lo is not None and (v < lo if lo_incl else v <= lo)

        def above(v):
            return hi is not None and (v > hi if hi_incl else v >= hi)

        def fails(values: np.ndarray) -> np.ndarray:
            v = values.astype("float64", copy=False)
            return np.asarray(below(v), dtype=bool) | np.asarray(above(v), dtype=bool)

        def describe(v):
            v = float(v)
            return f"{v:g} above max {hi!r}" if above(v) else f"{v:g} below min {lo!r}"

        return Rule(column, name, "out_of_range", describe, fails)
    if check.name == "isin":
        allowed = frozenset(stats["allowed_values"])
        return Rule(column, name, "unseen_category", lambda v: f"unseen category {_shown(v)}",
                    lambda v: ~_isin(v, allowed), fails_nulls=not any(pd.isna(v) for v in allowed))
    if check.name == "notin":
        forbidden = list(stats["forbidden_values"])
        return Rule(column, name, "failed_check", lambda v: f"forbidden value {_shown(v)}",
                    lambda v: pd.Series(v).isin(forbidden).to_numpy())
    return Rule(column, name, "failed_check", lambda v: f"{_shown(v)} failed {name}",
                lambda v: _pandera_fails(check, v))


def _isin(values: np.ndarray, allowed: frozenset) -> np.ndarray:
    """Per value: it is one of ``allowed`` (set lookups for a small batch, else pandas' hash table)."""
    if len(values) <= SMALL_BATCH:
        try:
            return np.fromiter(map(allowed.__contains__, values), dtype=bool, count=len(values))
        except TypeError:  # an unhashable value (a list in an untyped column): pandas compares those
            pass
    return pd.Series(values).isin(list(allowed)).to_numpy()


def _pandera_fails(check: pa.Check, array: np.ndarray) -> np.ndarray:
    values = pd.Series(array)
    output = check(values).check_output
    if isinstance(output, pd.Series):
        return ~output.reindex(values.index, fill_value=True).to_numpy(dtype=bool)
    return np.full(len(values), not bool(output))


def _shown(value: Any) -> str:
    """``repr`` of the plain Python value (``'a'``, not ``np.str_('a')``), cut to :data:`MAX_VALUE_CHARS`."""
    return shorten(repr(value.item() if isinstance(value, np.generic) else value), MAX_VALUE_CHARS)


# ------------------------------------------------------------------------------------------------------- serving

VIOLATIONS_COLUMN = "schema_violations"
"""Column the served model adds: ``""`` for a clean row, else what failed (:meth:`RuleSet.row_messages`)."""
ON_VIOLATION_PARAM = "on_schema_violation"
"""The served model's ``predict`` param choosing what a row outside the schema does (:data:`ON_VIOLATION_MODES`)."""
ON_VIOLATION_MODES = ("flag", "error", "ignore")
"""``flag`` (default) adds :data:`VIOLATIONS_COLUMN`; ``error`` raises :class:`SchemaViolationError` naming the
rows; ``ignore`` checks nothing and adds no column."""
MAX_ROWS_NAMED = 5
SEE_FIRST_ROW = "columns: see the first row"
"""What every row but the first says of the batch's column problems, which the first row lists once."""
MIN_MESSAGE_CHARS = 80
"""The shortest message cap: room for :data:`SEE_FIRST_ROW` and one problem."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ServingLimits:
    """Bounds on one scoring request, so a hostile or mistaken batch cannot make the answer explode."""

    max_rows: int = 100_000
    """Rows one request may score; more are refused with an error saying to split the batch."""
    max_message_chars: int = 200
    """A row's :data:`VIOLATIONS_COLUMN` text (and the column problems of a batch) is cut to this many characters."""

    def __post_init__(self) -> None:
        for name, least in (("max_rows", 1), ("max_message_chars", MIN_MESSAGE_CHARS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"serving {name}={value!r}: use a whole number of at least {least}")


DEFAULT_LIMITS = ServingLimits()


class SchemaViolationError(KfloopError, ValueError):
    """Rows to score fall outside the schema the model was trained on (``on_schema_violation="error"``)."""


def check_mode(params: dict | None) -> str:
    """The mode ``params`` asks for (:data:`ON_VIOLATION_PARAM`, default ``flag``).

    Raises:
        ValueError: not one of :data:`ON_VIOLATION_MODES`.
    """
    mode = (params or {}).get(ON_VIOLATION_PARAM, ON_VIOLATION_MODES[0])
    if mode not in ON_VIOLATION_MODES:
        raise ValueError(f"{ON_VIOLATION_PARAM}={mode!r}: use one of {list(ON_VIOLATION_MODES)}")
    return mode


def check_rows(n_rows: int, limits: ServingLimits = DEFAULT_LIMITS) -> None:
    """Refuse a request of more than ``limits.max_rows`` rows before anything is scored.

    Raises:
        SchemaViolationError: too many rows.
    """
    if n_rows > limits.max_rows:
        raise SchemaViolationError(f"{n_rows} rows in one request, over the serving limit max_rows="
                                   f"{limits.max_rows}: split the batch into requests of at most {limits.max_rows} "
                                   "rows")


def column_problems(rules: RuleSet, columns: Iterable[str], required: Iterable[str]) -> list[str]:
    """``missing column 'x'`` for each of ``required`` not in ``columns``, then ``unexpected column 'y'`` for each of
    ``columns`` the schema does not know."""
    present = set(columns)
    return [*(f"missing column {name!r}" for name in required if name not in present),
            *(f"unexpected column {name!r}" for name in columns if name not in rules.known)]


def _flagged(scored: pd.DataFrame, messages: np.ndarray) -> pd.DataFrame:
    """``scored`` plus :data:`VIOLATIONS_COLUMN`; the other columns are ``scored``'s own, not copies (copying them
    would cost more than the check)."""
    flags = pd.Series(messages, index=scored.index, dtype=object, copy=False)
    return pd.DataFrame({**dict(scored.items()), VIOLATIONS_COLUMN: flags}, copy=False)


def apply_violation_mode(rules: RuleSet, rows: pd.DataFrame, scored: pd.DataFrame, mode: str, *,
                         required: Iterable[str] = (), limits: ServingLimits = DEFAULT_LIMITS) -> pd.DataFrame:
    """``scored`` (one output row per input row) as ``mode`` asks: with :data:`VIOLATIONS_COLUMN` (``flag``),
    unchanged (``ignore``), or unchanged once the columns are the schema's and every row is clean (``error``).
    Under ``flag`` a missing ``required`` column or one the schema does not know is listed once, on the first row,
    every other row saying :data:`SEE_FIRST_ROW`; every message is cut to ``limits.max_message_chars``. The frame
    returned shares ``scored``'s columns.

    Raises:
        ValueError: ``mode`` is not one of :data:`ON_VIOLATION_MODES`.
        SchemaViolationError: more rows than ``limits.max_rows``; or ``mode`` is ``error`` and a column is missing or
            unknown (named), or a row breaks a rule (up to five rows and their columns named).
    """
    mode = check_mode({ON_VIOLATION_PARAM: mode})
    check_rows(len(rows), limits)
    if mode == "ignore":
        return scored
    cap = limits.max_message_chars
    problems = column_problems(rules, rows.columns, required)
    listed = shorten(f"{len(problems)} column problem(s): {', '.join(problems)}", cap)
    if problems and mode == "error":
        raise SchemaViolationError(f"the rows' columns differ from the model's training schema: {listed}; send the "
                                   f"schema's columns, or pass {ON_VIOLATION_PARAM}='flag' to score them with a "
                                   f"{VIOLATIONS_COLUMN} column")
    if mode == "flag" and problems:  # the batch's column problems first, within the same cap
        messages = rules.row_messages(rows, max_chars=max(cap - len(SEE_FIRST_ROW) - 2, 1))
        shared = np.full(len(rows), SEE_FIRST_ROW, dtype=object)
        shared[:1] = listed
        messages = np.where(messages == "", shared, shared + "; " + messages)
        messages[:1] = [shorten(text, cap) for text in messages[:1]]
        return _flagged(scored, messages)
    messages = rules.row_messages(rows, max_chars=cap)
    if mode == "flag":
        return _flagged(scored, messages)
    bad = np.flatnonzero(messages != "")
    if len(bad):
        named = "; ".join(f"row {rows.index[i]!r}: {messages[i]}" for i in bad[:MAX_ROWS_NAMED])
        more = f" (and {len(bad) - MAX_ROWS_NAMED} more)" if len(bad) > MAX_ROWS_NAMED else ""
        raise SchemaViolationError(f"{len(bad)} of {len(rows)} row(s) fall outside the model's training schema: "
                                   f"{named}{more}; fix the rows, or pass {ON_VIOLATION_PARAM}='flag' to score them "
                                   f"with a {VIOLATIONS_COLUMN} column")
    return scored

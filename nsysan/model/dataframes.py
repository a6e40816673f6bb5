"""Every table of an `Analysis` as a pandas DataFrame, for notebooks.

A table is any list of result objects in the model, found from its type hints, so a section
added to `Analysis` gets its table with no code here:

- a list field of `Analysis`: `groups`, `peaks`, `never_freed`, `sites`, `api_calls`,
  `failed_calls`, `ranges`, `diagnostics`, and whatever list a later version adds;
- a list inside a section: `capture.gpus` -> "gpus", `capture.processes` -> "processes",
  `timeline.bands` -> "bands", `timeline.series` -> "timeline" (see RENAMED), `oom.failures`;
- a list inside each row of another table, at any depth (`oom.failures[].live_at_failure`): `peaks[].live_at_peak` ->
  "live_at_peak", with the enclosing row's columns in front, prefixed with its class name
  (`peak_pid`; `peak_bytes` stays as it is). A list that holds its items under its own name
  (`steps[].steps`) gives the items that name, and its own rows are named after their class
  ("step_series"); another name taken twice is qualified by its parent's ("growth.holders").

One row per object; a nested object is spread into prefixed columns (`site` -> `site_label`,
`site_function` ...); a list of plain values stays a list in its cell (`apis`), except that an
object holding two or more lists of numbers (a `Series`: `ts_ns`, `live_bytes`) gives one row
per point. Column names are the JSON field names, so units are in the names: `*_bytes` in bytes,
`*_ns` in nanoseconds (times from the capture's start). Integers are int64, or pandas' nullable
Int64 where the model allows None. The column types come from the type hints, so an empty table
still has all its columns.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd

from ..errors import NsysanError
from .plain import is_optional, type_hints, unoptional

# Tables named after their section rather than the list's own field.
RENAMED = {("timeline", "series"): "timeline",
           # nvidia-smi logs against the trace (`analyze --smi`): "logs" and "series" alone say too little
           **{("smi", name): f"smi_{name}" for name in ("logs", "series", "not_in_trace", "missed", "someone_else")},
           # a table inside another's rows: (the enclosing table's name, the list's field)
           ("smi_someone_else", "processes"): "smi_other_processes",
           # "sites" is the analysis's own table; a spike's sites are its makers
           ("spikes", "sites"): "spike_sites",
           # the memory nobody can see and CUDA graphs, per process (capture.processes is "processes")
           ("hidden", "processes"): "hidden", ("hidden", "steps"): "hidden_steps",
           ("hidden", "libraries"): "hidden_libraries", ("hidden", "contexts"): "hidden_contexts", ("graphs", "processes"): "graphs",
           ("graphs", "steps"): "graph_steps",
           # what the bytes are at each step (byte_classes: per process and device)
           ("byte_classes", "steps"): "byte_class_steps"}
# The frames read from the export, kept on the Analysis (never serialized).
RAW_FRAMES = ("events", "calls", "nvtx_ranges")
_STRINGS = pd.Series(["text"])


@dataclasses.dataclass(frozen=True)
class _Table:
    name: str
    row_type: type
    path: tuple[str, ...]  # fields from the Analysis (or from a parent row) to the list
    parent: Optional["_Table"] = None  # the table in each of whose rows the list is


def table_names(analysis_type: type) -> list[str]:
    """The names `frame()` takes for the result tables of `analysis_type` (any result dataclass)."""
    return [t.name for t in _tables(analysis_type)]


def table_frame(analysis: Any, name: str) -> pd.DataFrame:
    """The table `name` of `analysis` (an Analysis, or any result dataclass) as a new DataFrame."""
    tables = {t.name: t for t in _tables(type(analysis))}
    if name not in tables:
        raw = [f.name for f in dataclasses.fields(analysis) if f.metadata.get("raw")]
        known = ", ".join([*tables, *raw])
        raise NsysanError(f"no table {name!r} in an {type(analysis).__name__}; the tables are: {known}")
    table = tables[name]
    columns = _columns(table)
    rows = [values for _, values in _rows(analysis, table)]
    data = {column: _series([row[i] for row in rows], hint) for i, (column, hint) in enumerate(columns.items())}
    frame = pd.DataFrame(data, columns=list(columns))
    # Fields that are lists of numbers: two or more of them are parallel point arrays.
    points = {name: item for name, _, _, item in _fields(table.row_type) if item in (int, float)}
    if len(points) >= 2:
        # A series without points has no row (explode would give it one of missing values).
        frame = frame[frame[next(iter(points))].map(len) > 0]
        frame = frame.explode(list(points), ignore_index=True)
        for name, item in points.items():
            frame[name] = frame[name].astype("int64" if item is int else "float64")
    return frame


# --- which tables there are -------------------------------------------------------------------


def _tables(analysis_type: type) -> list[_Table]:
    """Each list field's table, then the tables inside its rows (depth first), then the lists
    inside single sections. A name already taken is qualified with its parent's
    ("steps.kept"); a list holding items under its own name (`steps[].steps`) gives the items
    that name, and its own rows are named after their type ("step_series")."""
    found: dict[str, _Table] = {}
    singles = []
    for name, _, inner, item in _fields(analysis_type):
        if dataclasses.is_dataclass(item):
            _add(found, _Table(name, item, (name,)))
        elif dataclasses.is_dataclass(inner):
            singles.append((name, inner))
    for section, section_type in singles:
        for name, _, _, item in _fields(section_type):
            if dataclasses.is_dataclass(item):
                _add(found, _Table(RENAMED.get((section, name), name), item, (section, name)))
    return list(found.values())


def _add(found: dict[str, _Table], table: _Table) -> None:
    if table.parent is not None:
        table = dataclasses.replace(table, name=RENAMED.get((table.parent.name, table.name), table.name))
    children = list(_children(table))
    if any(child.name == table.name for child in children):
        table = dataclasses.replace(table, name=_snake(table.row_type.__name__))
    if table.name in found and table.parent is not None:
        table = dataclasses.replace(table, name=f"{table.parent.name}.{table.name}")
    if table.name in found:
        return
    found[table.name] = table
    for child in children:
        _add(found, dataclasses.replace(child, parent=table))


def _children(parent: _Table) -> Iterator[_Table]:
    for name, _, _, item in _fields(parent.row_type):
        if dataclasses.is_dataclass(item):
            yield _Table(name, item, (name,), parent)


# --- columns and rows -------------------------------------------------------------------------


def _columns(table: _Table) -> dict[str, Any]:
    """Column name -> type hint: the columns of the rows it is inside first, then its own."""
    own = {column: hint for column, hint, _ in _flat(table.row_type)}
    if table.parent is None:
        return own
    # A row inside another table's rows repeats that row's columns, prefixed with its type's
    # name (`peak_pid`; `peak_bytes` stays as it is), its own context columns as they were.
    prefix = _snake(table.parent.row_type.__name__) + "_"
    parent_own = {column for column, _, _ in _flat(table.parent.row_type)}
    context = {}
    for column, hint in _columns(table.parent).items():
        if column in parent_own and not (column.startswith(prefix) and column not in own):
            column = prefix + column
        context[column] = hint
    columns = {**context, **own}
    if len(columns) != len(context) + len(own):  # a value would land under another's name
        raise RuntimeError(f"table {table.name!r}: columns {sorted(set(context) & set(own))} come twice")
    return columns


@functools.lru_cache(maxsize=None)
def _flat(row_type: type) -> tuple[tuple[str, Any, tuple[str, ...]], ...]:
    """The columns of one object, as (name, type hint, the fields that lead to the value): its scalar
    and list-of-scalar fields, nested objects spread out with their field name as prefix, lists of
    objects left to their own table."""
    columns: list[tuple[str, Any, tuple[str, ...]]] = []
    for name, hint, inner, item in _fields(row_type):
        if dataclasses.is_dataclass(inner):
            columns += [(f"{name}_{column}", nested, (name, *path)) for column, nested, path in _flat(inner)]
        elif not dataclasses.is_dataclass(item):
            columns.append((name, hint, (name,)))
    return tuple(columns)


def _flat_values(obj: Any, row_type: type) -> list[Any]:
    values = []
    for _, _, path in _flat(row_type):
        value = obj
        for name in path:
            value = None if value is None else getattr(value, name)
        values.append(value)
    return values


def _rows(analysis: Any, table: _Table) -> Iterator[tuple[Any, list[Any]]]:
    """Each object of the table with its row's values, in the order of `_columns`."""
    if table.parent is None:
        holder: Any = analysis
        for step in table.path:
            holder = getattr(holder, step) if holder is not None else None
        for obj in holder or []:
            yield obj, _flat_values(obj, table.row_type)
        return
    for parent, parent_values in _rows(analysis, table.parent):
        for obj in getattr(parent, table.path[-1]) or []:
            yield obj, parent_values + _flat_values(obj, table.row_type)


def _series(values: list[Any], hint: Any) -> pd.Series:
    inner, optional = unoptional(hint), is_optional(hint)
    has_none = any(v is None for v in values)
    if inner is bool:
        return pd.Series(values, dtype="boolean" if optional or has_none else "bool")
    if inner is int:
        return pd.Series(values, dtype="Int64" if optional or has_none else "int64")
    if inner is float:
        return pd.Series([np.nan if v is None else v for v in values], dtype="float64")
    if inner is str:
        # The dtype pandas gives strings (object before pandas 3, str from 3 on), empty or not.
        return pd.Series(values, dtype=_STRINGS.dtype if not values else None)
    return pd.Series(values, dtype=object)


# --- type hints -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)  # once per class, not once per row
def _fields(tp: type) -> list[tuple[str, Any, Any, Any]]:
    """(name, type hint, the hint without Optional, the item type of a list or None) of each field."""
    hints = type_hints(tp)
    return [(f.name, hints[f.name], unoptional(hints[f.name]), _list_item(unoptional(hints[f.name])))
            for f in dataclasses.fields(tp)]


def _list_item(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is list else None


def _snake(name: str) -> str:
    """"StepSeries" -> "step_series" (leading underscores of a private class left out)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.lstrip("_")).lower()

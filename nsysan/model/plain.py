"""Result models to plain JSON data and back, guided by the dataclasses' type hints; a
malformed document names the first field that is missing or of the wrong type."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


_SCALARS = (int, float, str, bool, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass -> its fields' names, looked up once


def _to_plain(value: Any) -> Any:
    # An analysis of 1e7 events has 1e5 values here (series of numbers, allocation records):
    # scalars return first, and each class's fields are listed once, not at every record.
    kind = type(value)
    if kind in _SCALARS:
        return value
    names = _FIELD_NAMES.get(kind)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:  # scalars taken as they are, without a call for each (issue 31)
        return {name: v if type(v := getattr(value, name)) in _SCALARS else _to_plain(v) for name in names}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _SCALARS else _to_plain(v) for v in value]
    return value


class _Malformed(ValueError):
    """A document field that is missing or of the wrong type (the message names it)."""


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list", dict: "an object"}


def from_document(cls: Any, data: Any, schema_id: str, what: str) -> Any:
    """`cls` rebuilt from the JSON document `data` whose "schema" must be `schema_id`; raises
    NsysanError (one line: the schema found, or the first field missing or of the wrong type)
    for anything else, whatever shape `data` has. `what` names the document ("analysis")."""
    from ..errors import NsysanError  # lazily: the model stays free of I/O concerns

    if not isinstance(data, dict):
        kind = "null" if data is None else _TYPE_NAMES.get(type(data), type(data).__name__)
        raise NsysanError(f"not an nsysan {what}: the document is {kind}, not an object")
    schema = data.get("schema")
    if schema != schema_id:
        shown = repr(schema[:40] if isinstance(schema, str) else schema)[:60]
        raise NsysanError(f"not an nsysan {what} (schema {shown}, expected {schema_id!r})")
    try:
        return _from_plain(cls, data, "")
    except _Malformed as err:
        raise NsysanError(str(err)) from None


def _from_plain(tp: Any, value: Any, path: str = "") -> Any:
    """Rebuild a dataclass tree from plain JSON data, guided by the type hints; `path` names the
    field being read (e.g. "peaks[0].live_at_peak[2].bytes") for the error."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]: X or None (a wider union: taken as it is)
        return None if value is None else _from_plain(unoptional(tp), value, path)
    if tp is Any:
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        _expect(value, list, path)
        return [_from_plain(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        _expect(value, dict, path)
        hints, fields = _fields_of(tp)
        kwargs = {}
        for f in fields:
            where = f"{path}.{f.name}" if path else f.name
            if f.name in value:
                kwargs[f.name] = _from_plain(hints[f.name], value[f.name], where)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = _added_later(hints[f.name], where)
        return tp(**kwargs)
    if tp in _TYPE_NAMES:
        _expect(value, tp, path)
    return value


_FIELDS_READ: dict[type, tuple[dict[str, Any], tuple[dataclasses.Field, ...]]] = {}


def _fields_of(tp: type) -> tuple[dict[str, Any], tuple[dataclasses.Field, ...]]:
    """A dataclass's type hints and the fields a document holds (not the raw frames), looked up
    once per class: typing.get_type_hints evaluates every annotation anew at each call, which was
    two thirds of reading a 1e6-event analysis back (4.4 of 6.8 s profiled, 5,568 records)."""
    found = _FIELDS_READ.get(tp)
    if found is None:
        found = _FIELDS_READ[tp] = (type_hints(tp),
                                    tuple(f for f in dataclasses.fields(tp) if not f.metadata.get("raw")))
    return found


def type_hints(tp: type) -> dict[str, Any]:
    """`tp`'s fields' types, the model's lazily made classes (model/__init__.py) included: an
    annotation names them, but their modules are imported only here, when a type is read."""
    from . import oom_found, smi

    later = {name: kind for module in (oom_found, smi) for name, kind in vars(module).items()
             if isinstance(kind, type) and dataclasses.is_dataclass(kind)}
    return typing.get_type_hints(tp, localns=later)


def _expect(value: Any, tp: type, path: str) -> None:
    # JSON has one kind of number: an integral float is not an integer, a bool is neither.
    ok = isinstance(value, tp) and not (isinstance(value, bool) and tp is not bool)
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise _Malformed(f"field {path!r} should be {_TYPE_NAMES[tp]}, not {shown}")
    # Bytes, times and addresses fit 64 bits (the events frame's int64/uint64, SQLite's INTEGER in
    # nsysan.db); a larger JSON integer is no measurement, and would break the database later.
    if tp is int and not -(1 << 63) <= value < (1 << 64):
        raise _Malformed(f"field {path!r} should be an integer of at most 64 bits, not {value}")


def _added_later(hint: Any, path: str) -> Any:
    """The value of a field the document lacks: a list or an optional field may have been added
    to @1 after the document was written (empty / None then); anything else is missing."""
    if typing.get_origin(hint) is list:
        return []
    if is_optional(hint):
        return None
    raise _Malformed(f"field {path!r} is missing")


def is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def unoptional(hint: Any) -> Any:
    """X of Optional[X], Any of a wider union, any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 else Any
    return hint

"""`assert_type(value, annotation)`: a small runtime check that a parser returned what its signature says,
down to every field of the dataclasses it returns (bot/core/models.py), so a parser that put a str into a
`float | None` field fails the fuzz test even though nothing raised."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def assert_type(value: Any, annotation: Any, where: str = "result") -> None:
    """Raise AssertionError naming the path (`result[0].pcpu`) of the first value that does not match
    `annotation`. int is accepted for float (the numeric tower); bool is not accepted for int."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return
    if annotation is None or annotation is type(None):
        assert value is None, f"{where}: expected None, got {value!r:.200}"
        return
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                assert_type(value, arg, where)
                return
            except AssertionError:
                continue
        raise AssertionError(f"{where}: {type(value).__name__} {value!r:.200} is none of {annotation}")
    if origin in (list, set, frozenset):
        assert isinstance(value, origin), f"{where}: expected {origin.__name__}, got {type(value).__name__}"
        for i, item in enumerate(value):
            assert_type(item, args[0], f"{where}[{i}]")
        return
    if origin is tuple:
        assert isinstance(value, tuple), f"{where}: expected tuple, got {type(value).__name__}"
        if len(args) == 2 and args[1] is Ellipsis:
            for i, item in enumerate(value):
                assert_type(item, args[0], f"{where}[{i}]")
            return
        assert len(value) == len(args), f"{where}: expected {len(args)} items, got {len(value)}"
        for i, (item, arg) in enumerate(zip(value, args, strict=True)):
            assert_type(item, arg, f"{where}[{i}]")
        return
    if origin is dict:
        assert isinstance(value, dict), f"{where}: expected dict, got {type(value).__name__}"
        for k, v in value.items():
            assert_type(k, args[0], f"{where} key {k!r:.50}")
            assert_type(v, args[1], f"{where}[{k!r:.50}]")
        return
    if annotation is float:
        assert isinstance(value, int | float) and not isinstance(value, bool), \
            f"{where}: expected float, got {type(value).__name__} {value!r:.200}"
        return
    if annotation is int:
        assert isinstance(value, int) and not isinstance(value, bool), \
            f"{where}: expected int, got {type(value).__name__} {value!r:.200}"
        return
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        assert isinstance(value, annotation), f"{where}: expected {annotation.__name__}, got {value!r:.200}"
        return
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        assert isinstance(value, annotation), f"{where}: expected {annotation.__name__}, got {type(value).__name__}"
        hints = _hints(annotation)
        for f in dataclasses.fields(annotation):
            assert_type(getattr(value, f.name), hints[f.name], f"{where}.{f.name}")
        return
    if isinstance(annotation, type):
        assert isinstance(value, annotation), f"{where}: expected {annotation.__name__}, got {type(value).__name__}"
        return
    raise TypeError(f"assert_type cannot check {annotation!r}")  # pragma: no cover - a gap in this helper


def returns(func: Any) -> Any:
    """The return annotation of `func`, resolved."""
    return typing.get_type_hints(func)["return"]

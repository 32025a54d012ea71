"""Config errors: `ConfigError` and the formatting of pydantic errors into `location: message` strings.

The bottom of the package: it imports nothing from it. Where a message needs the schema (the
"did you mean" suggestion for an unknown key), the root model is passed in as `root`.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Collection
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError


class ConfigError(Exception):
    """Raised by `load_config` / `parse_config`; `.errors` is a list of `location: message` strings."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


class _Index(int):
    """A list index in a location path (shown as `[i]`; a mapping key is shown as `.key`)."""


def _loc(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, _Index) else (f".{part}" if out else str(part))
    return out


def _unwrap_model(annotation: Any, part: Any) -> Any:
    """The annotation one step below `annotation` at location part `part`, or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _unwrap_model(args[0], part)
    if origin is dict:
        return args[1]
    if origin is list:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            below = _unwrap_model(arg, part)
            if below is not None:
                return below
    return None


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _as_model(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((m for m in map(_as_model, args) if m is not None), None)
    return None


def _model_at(loc: tuple[Any, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (a pydantic error location below the model
    `root`), or None."""
    annotation: Any = root
    for part in loc:
        annotation = _unwrap_model(annotation, part)
        if annotation is None:
            return None
    return _as_model(annotation)


def _unknown_key_message(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    model = _model_at(loc[:-1], root)
    if model is None or not loc:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"unknown key; did you mean {close[0]!r}?" if close else "unknown key"


def _format_pydantic(e: ValidationError, root: type[BaseModel], skip_unknown: Collection[str] = ()) -> list[str]:
    """`location: message` strings for a pydantic error raised by validating the model `root`; "unknown key"
    is left out at `skip_unknown`."""
    out = []
    for err in e.errors(include_url=False):
        parts = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        if err["type"] == "extra_forbidden":
            if loc in skip_unknown:
                continue  # already reported as a secret
            msg = _unknown_key_message(parts, root)
        out.append(f"{loc or '(top level)'}: {msg}")
    return list(dict.fromkeys(out))

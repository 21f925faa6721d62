"""Payload field parsers: each turns a JSON value into the lake's type or raises `RefusedOp`
naming the field (DESIGN §2: binaries base64, digests lowercase hex, instants RFC 3339 UTC)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import RefusedOp

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MISSING = object()


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(field: str, expected: str, value: Any) -> RefusedOp:
    return RefusedOp(f"field '{field}': expected {expected}, got {_show(value)}")


def text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(field, "a non-empty string", value)
    return value


def uuid_text(field: str, value: Any) -> str:
    if isinstance(value, str):
        try:
            if str(uuid.UUID(value)) == value:
                return value
        except ValueError:
            pass
    raise _fail(field, "a UUID in lowercase text", value)


def integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, "an integer", value)
    return value


def positive(field: str, value: Any) -> int:
    number = integer(field, value)
    if number < 1:
        raise _fail(field, "an integer >= 1", value)
    return number


def boolean(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, "true or false", value)
    return value


def instant(field: str, value: Any) -> dt.datetime:
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.astimezone(dt.UTC)
    raise _fail(field, "an RFC 3339 instant with a UTC offset", value)


def b64(field: str, value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise _fail(field, "base64 bytes", value)


def hex_digest(field: str, value: Any) -> str:
    if isinstance(value, str) and _HEX64.match(value):
        return value
    raise _fail(field, "a SHA-256 digest in lowercase hex", value)


def json_text(field: str, value: Any) -> str:
    text(field, value)
    try:
        json.loads(value)
    except ValueError:
        raise _fail(field, "JSON text", value) from None
    return value


def one_of(*allowed: str) -> Callable[[str, Any], str]:
    def parse(field: str, value: Any) -> str:
        if value not in allowed:
            raise _fail(field, "one of " + "|".join(allowed), value)
        return value

    return parse


def list_of(item: Callable[[str, Any], Any]) -> Callable[[str, Any], list]:
    def parse(field: str, value: Any) -> list:
        if not isinstance(value, list):
            raise _fail(field, "a list", value)
        return [item(f"{field}[{i}]", v) for i, v in enumerate(value)]

    return parse


def record(*fields: Field) -> Callable[[str, Any], dict]:
    def parse(field: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise _fail(field, "an object", value)
        return parse_fields(value, fields, prefix=f"{field}.")

    return parse


@dataclass(frozen=True)
class Field:
    name: str
    parse: Callable[[str, Any], Any]
    required: bool = True
    nullable: bool = False


def parse_fields(payload: dict, fields: tuple[Field, ...], prefix: str = "") -> dict:
    """Parse the declared fields of `payload`; absent optional fields are left out."""
    out: dict[str, Any] = {}
    for f in fields:
        name = prefix + f.name
        value = payload.get(f.name, _MISSING)
        if value is _MISSING:
            if f.required:
                raise RefusedOp(f"field '{name}' is missing")
            continue
        if value is None:
            if not f.nullable:
                raise RefusedOp(f"field '{name}' must not be null")
            out[f.name] = None
            continue
        out[f.name] = f.parse(name, value)
    return out

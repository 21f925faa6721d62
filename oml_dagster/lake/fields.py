"""Payload field parsers: each turns a JSON value into the lake's type or raises `RefusedOp`
naming the field (DESIGN §2: binaries base64, digests lowercase hex, instants RFC 3339 UTC)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import RefusedOp

# \Z, not $: $ also matches before a final newline.
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
# RFC 3339 date-time (section 5.6): full date, "T", full time, fraction optional, offset required.
# fromisoformat alone also takes ISO 8601 forms RFC 3339 does not (week dates, basic format).
_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
# One ltree label (PostgreSQL 15: letters, digits and underscores).
_LTREE_LABEL = re.compile(r"^[A-Za-z0-9_]{1,256}\Z")
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
    # Exactly the strings str(uuid.UUID(value)) gives back unchanged: 8-4-4-4-12 lowercase hex.
    if isinstance(value, str) and _UUID.match(value):
        return value
    raise _fail(field, "a UUID in lowercase text", value)


def integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, "an integer", value)
    return value


def non_negative(field: str, value: Any) -> int:
    number = integer(field, value)
    if number < 0:
        raise _fail(field, "an integer >= 0", value)
    return number


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
    if isinstance(value, str) and _RFC3339.match(value):
        try:
            parsed = dt.datetime.fromisoformat(value.upper())
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


def b64_sized(size: int | None = None) -> Callable[[str, Any], bytes]:
    """Non-empty base64 bytes, exactly `size` of them when given (chain hashes, signatures)."""

    def parse(field: str, value: Any) -> bytes:
        data = b64(field, value)
        if not data or (size is not None and len(data) != size):
            raise _fail(field, f"base64 of {size or 'at least 1'} bytes", value)
        return data

    return parse


def ltree_path(field: str, value: Any) -> str:
    """A workarea path: ltree labels joined by dots."""
    if isinstance(value, str) and all(_LTREE_LABEL.match(label) for label in value.split(".")):
        return value
    raise _fail(field, "an ltree path (labels of letters, digits, _ joined by dots)", value)


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
        return parse_fields(value, fields, prefix=f"{field}.", strict=True)

    return parse


@dataclass(frozen=True)
class Field:
    name: str
    parse: Callable[[str, Any], Any]
    required: bool = True
    nullable: bool = False


def unknown_fields(payload: dict, fields: tuple[Field, ...]) -> list[str]:
    declared = {f.name for f in fields}
    return sorted(name for name in payload if name not in declared)


def parse_fields(
    payload: dict, fields: tuple[Field, ...], prefix: str = "", strict: bool = False
) -> dict:
    """Parse the declared fields of `payload`; absent optional fields are left out. `strict`
    refuses fields the declaration does not name."""
    if strict and (unknown := unknown_fields(payload, fields)):
        raise RefusedOp(f"unknown field(s) {', '.join(repr(prefix + n) for n in unknown)}")
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

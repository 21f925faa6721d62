"""Payload field parsing: instants land as µs UTC (nanoseconds cut, offsets converted), and every
malformed value is refused naming its field."""

from __future__ import annotations

import datetime as dt

import pytest

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model import catalog as f


def test_instants_are_microsecond_utc():
    assert f.instant("at", "2026-11-01T12:00:00.123456789Z") == dt.datetime(
        2026, 11, 1, 12, 0, 0, 123456, tzinfo=dt.UTC
    )
    converted = f.instant("at", "2026-11-01T14:00:00.5+02:00")
    assert converted == dt.datetime(2026, 11, 1, 12, 0, 0, 500000, tzinfo=dt.UTC)
    assert converted.tzinfo == dt.UTC


@pytest.mark.parametrize(
    "parse,value,message",
    [
        (f.instant, "2026-11-01T12:00:00", "with a UTC offset"),  # naive: no offset
        (f.instant, 1700000000, "RFC 3339"),
        (f.uuid_text, "3F2504E0-4F89-11D3-9A0C-0305E82C3301", "lowercase"),
        (f.hex_digest, "ab" * 31, "SHA-256"),
        (f.b64, "not base64!", "base64"),
        (f.integer, True, "an integer"),
        (f.positive, 0, ">= 1"),
        (f.text, "", "non-empty"),
        (f.json_text, "{nope", "JSON text"),
    ],
)
def test_malformed_values_are_refused_naming_the_field(parse, value, message):
    with pytest.raises(RefusedOp, match=f"field 'the_field'.*{message}"):
        parse("the_field", value)

"""The vectorized parts of bronze's columnar path agree with the per-value Python they replace:
base64 decoding with `binascii.a2b_base64`, the JSON text pattern with `json.loads` (Hypothesis)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.ingest.bronze import (
    _B64,
    _INSTANT,
    JSON_TEXT,
    _instant,
    _instant_by_parts,
    decode_base64,
    json_texts,
)

_VALID_B64 = st.one_of(
    st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
    # any text the checks pass, unused low bits of the last quad included
    st.from_regex(_B64.removeprefix("^").removesuffix("$"), fullmatch=True),
)


@settings(deadline=None)
@given(values=st.lists(_VALID_B64 | st.just(""), max_size=30), cut=st.integers(0, 5))
@example(values=["", "AA==", "AAA=", "AAAA", "", "e3==", "/+/+"], cut=0)
@example(values=[""], cut=0)
@example(values=[], cut=0)
def test_decode_base64_equals_binascii(values, cut):
    expected = [binascii.a2b_base64(v) for v in values]
    assert decode_base64(pa.array(values, pa.string())).to_pylist() == expected
    # a slice of a chunked column, as a filtered batch hands it over
    chunked = pa.chunked_array([pa.array(["QUJD", *values], pa.string())]).slice(1)
    assert decode_base64(chunked).to_pylist() == expected
    assert decode_base64(pa.array(values, pa.string()).slice(cut)).to_pylist() == expected[cut:]


@pytest.mark.parametrize("values", [["QUJD", None], ["QUJ"], ["QUJDRA"]])
def test_decode_base64_refuses_what_the_checks_never_pass(values):
    with pytest.raises(ValueError):
        decode_base64(pa.array(values, pa.string()))


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(deadline=None)
@given(value=_JSON, indent=st.sampled_from([None, 0, 2]))
def test_json_pattern_matches_only_json(value, indent):
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    if re.fullmatch(JSON_TEXT.removeprefix("^").removesuffix("$"), text, re.DOTALL):
        assert json.loads(text) == value
    mask = json_texts(pa.chunked_array([[text]]), pa.chunked_array([[True]]))
    assert mask.to_pylist() == [True]


@settings(deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list('{}[]":,. \n\t\\u0aeE+-1tfnrl\x01')), max_size=20)
)
@example(text='{"a": NaN}')
@example(text="[1,]")
@example(text='"\x01"')
@example(text='"\\x"')
@example(text="01")
@example(text="[[[[1]]]]")
def test_json_texts_agree_with_json_loads(text):
    try:
        json.loads(text)
        parses = True
    except ValueError:
        parses = False
    matched = re.fullmatch(JSON_TEXT.removeprefix("^").removesuffix("$"), text) is not None
    assert not matched or parses, text
    mask = json_texts(pa.chunked_array([[text]]), pa.chunked_array([[True]]))
    # orjson decides what the pattern leaves: it may refuse what json.loads takes (the catalog
    # then words the verdict), never the reverse
    assert not mask.to_pylist()[0] or parses, text


def test_json_texts_clear_payload_text_at_once_and_parse_the_rest():
    flat = json.dumps({"artifact_id": "a", "version": 1, "tags": ["x", 2.5e3, None]})
    deep = json.dumps({"a": {"b": {"c": [1]}}})
    texts = pa.chunked_array([[flat, deep, "{nope", deep]])
    # the pattern alone clears the usual text; only the rows asked about are parsed one by one
    mask = json_texts(texts, pa.chunked_array([[False, True, True, False]]))
    assert mask.to_pylist() == [True, True, False, False]


_CANONICAL = [
    "2026-11-01T12:00:00Z",
    "2026-11-01T12:00:00.1Z",
    "2026-11-01T12:00:00.123456+00:00",
    "2024-02-29T23:59:59.999999Z",
    "0001-01-01T00:00:00Z",
]


@pytest.mark.parametrize("bad", [None, "2023-02-29T00:00:00Z", "2026-11-01T24:00:00Z"])
def test_instants_cast_at_once_equal_the_parse_by_parts(bad):
    """The whole-array cast and the field-by-field parse agree; a batch with an impossible
    instant takes the second path and still clears the others."""
    texts = [*_CANONICAL, "0000-01-01T00:00:00Z", *([bad] if bad else [])]
    at = pa.chunked_array([pa.array(texts, pa.string())])
    shaped = pc.match_substring_regex(at, _INSTANT)
    valid, stamps = _instant(at, shaped)
    by_parts = _instant_by_parts(at, shaped)
    assert valid.to_pylist() == by_parts[0].to_pylist() == [True] * 5 + [False] * (len(texts) - 5)
    expected = [dt.datetime.fromisoformat(t).astimezone(dt.UTC) for t in _CANONICAL]
    assert stamps[:5].to_pylist() == by_parts[1][:5].to_pylist() == expected

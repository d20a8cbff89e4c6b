"""Hypothesis strategies for fuzzing ``POST /v1/classify`` from its schema: bodies with the
schema's fields holding values of every JSON type (and non-JSON NaN / Infinity), unknown fields,
and arbitrary JSON documents. Used by the test suite and by ``benchmarks/serve_load.py``.

Needs ``hypothesis`` (the test extra).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st


def texts(max_size: int):
    """Strings of any code point: lone surrogates (which JSON can carry as ``"\\ud800"`` but no
    tokenizer takes), control characters and NUL included, not just hypothesis' default alphabet."""
    awkward = st.sampled_from(["\ud800", "\udfff", "\x00", "\x1b", "\u202e", "\ufeff", "\U0010ffff"])
    return st.text(st.characters(codec=None, exclude_categories=()) | awkward, max_size=max_size)


def json_values():
    """Any JSON value (NaN and infinities included, which strict JSON forbids)."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | texts(20)
    return st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10
    )


def request_bodies(schema: dict[str, Any] | None = None):
    """Bodies built from the request schema's properties (``texts``, ``budget``, ``latency_ms``
    unless ``schema`` names others), each present or absent, valid or of any other type, plus an
    unknown field, plus any JSON document."""
    properties = list((schema or {}).get("properties", {})) or ["texts", "budget", "latency_ms"]
    anything = json_values()
    typed = {
        "texts": st.lists(texts(60), max_size=6),
        "budget": st.floats(allow_nan=True, allow_infinity=True),
        "latency_ms": st.floats(allow_nan=True, allow_infinity=True),
    }
    optional = {name: st.one_of(typed.get(name, anything), anything) for name in properties}
    optional["unknown_field"] = anything
    return st.one_of(st.fixed_dictionaries({}, optional=optional), anything, st.fixed_dictionaries({"texts": st.lists(texts(60), min_size=1, max_size=4)}))


def encode_body(body: Any) -> bytes:
    """``body`` as the bytes a client would send (NaN / Infinity written as Python's json does)."""
    return json.dumps(body, allow_nan=True).encode()

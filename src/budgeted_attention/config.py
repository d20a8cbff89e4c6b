"""Dataclass configuration helpers: strict construction from dicts/YAML with clear errors.

Every config section is a dataclass; ``from_dict`` rejects unknown keys and values of the
wrong type, naming the offending key, so a typo in a YAML file fails loudly instead of being
silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from budgeted_attention.budget import validate_budget
from budgeted_attention.errors import ConfigError

T = TypeVar("T")


# --------------------------------------------------------------------------- YAML numbers

# PyYAML implements YAML 1.1, whose float pattern needs a '.' (``1.0e-3``): ``1e-3``, ``2e4``
# and ``.5e-2`` come back as *strings*, so ``lr: 1e-3`` was refused as "expected float". This
# pattern also accepts the YAML 1.2 / Python forms; plain integers still resolve as ints (the
# int resolver is unchanged), and ``.nan`` / ``.inf`` still parse (validation rejects them).
_FLOAT_PATTERN = re.compile(
    r"""^(?:
        [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?     # 1.  1.5  1.5e-3
      | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                   # 1e-3  2E4
      | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?            # .5  -.5  .5e-2
      | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*        # 190:20:30.15 (YAML 1.1 base 60)
      | [-+]?\.(?:inf|Inf|INF)
      | \.(?:nan|NaN|NAN)
    )$""",
    re.X,
)
_FLOAT_TAG = "tag:yaml.org,2002:float"


class NumberLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3``, ``2E4``, ``.5`` and ``-2.5e-1`` as floats."""


NumberLoader.yaml_implicit_resolvers = {
    first: [(tag, _FLOAT_PATTERN if tag == _FLOAT_TAG else regexp) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "-+0123456789.":
    _resolvers = NumberLoader.yaml_implicit_resolvers.setdefault(_first, [])
    if not any(tag == _FLOAT_TAG for tag, _ in _resolvers):
        _resolvers.insert(0, (_FLOAT_TAG, _FLOAT_PATTERN))


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with :class:`NumberLoader` (floats in the forms people type)."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 - a SafeLoader subclass


# --------------------------------------------------------------------------- value checks


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _bounds_text(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    parts = []
    if gt is not None:
        parts.append(f"> {gt:g}")
    if ge is not None:
        parts.append(f">= {ge:g}")
    if lt is not None:
        parts.append(f"< {lt:g}")
    if le is not None:
        parts.append(f"<= {le:g}")
    return (" " + " and ".join(parts)) if parts else ""


def check_float(
    value: Any,
    key: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> float:
    """``value`` as a float if it is a finite number (not a bool) within the given bounds.

    Raises:
        ConfigError: ``"<key> must be a finite number > 0, got nan"`` and the like.
    """
    ok = _is_number(value) and math.isfinite(float(value))
    if ok:
        number = float(value)
        ok = (
            (gt is None or number > gt)
            and (ge is None or number >= ge)
            and (lt is None or number < lt)
            and (le is None or number <= le)
        )
    if not ok:
        raise ConfigError(f"{key} must be a finite number{_bounds_text(gt, ge, lt, le)}, got {value!r}")
    return float(value)


def check_int(value: Any, key: str, *, ge: int | None = None, le: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) within the given bounds.

    Raises:
        ConfigError: ``"<key> must be an integer >= 1, got 0"`` and the like.
    """
    if not _is_int(value) or (ge is not None and value < ge) or (le is not None and value > le):
        raise ConfigError(f"{key} must be an integer{_bounds_text(None, ge, None, le)}, got {value!r}")
    return int(value)


def check_int_list(values: Any, key: str, *, ge: int | None = None, allow_empty: bool = False) -> list[int]:
    """A list of integers within bounds (``allow_empty`` or at least one), each checked as ``key[i]``."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{key} must be a list of integers, got {values!r}")
    if not values and not allow_empty:
        raise ConfigError(f"{key} must list at least one value, got {values!r}")
    return [check_int(v, f"{key}[{i}]", ge=ge) for i, v in enumerate(values)]


def check_bool(value: Any, key: str) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def check_str(value: Any, key: str, *, allow_empty: bool = True) -> str:
    """``value`` if it is a string (non-empty unless ``allow_empty``)."""
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ConfigError(f"{key} must be a {'' if allow_empty else 'non-empty '}string, got {value!r}")
    return value


def check_budgets(values: Any, key: str, *, allow_empty: bool = False) -> list[float]:
    """Budgets (finite numbers in (0, 1]) as floats; ``ConfigError`` naming ``key[i]`` and the value."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{key} must be a list of budgets in (0, 1], got {values!r}")
    if not values and not allow_empty:
        raise ConfigError(f"{key} must list at least one budget, got {values!r}")
    checked = []
    for i, value in enumerate(values):
        try:
            checked.append(validate_budget(value))
        except ValueError as exc:
            raise ConfigError(f"{key}[{i}]: {exc}") from None
        if checked[-1] in checked[:-1]:
            # A repeated budget would be evaluated twice and counted as two seeds in the tables.
            raise ConfigError(f"{key}[{i}]: budget {value!r} is listed twice")
    return checked


def validate_seeds(seeds: Any, key: str = "seeds") -> list[int]:
    """``seeds`` as a list of distinct integers (at least one).

    Raises:
        ConfigError: naming ``key`` for an empty list, a non-integer (bools too) or a repeated seed.
    """
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise ConfigError(f"{key} must be a list of integers, got {seeds!r}")
    values = list(seeds)
    if not values:
        raise ConfigError(f"{key} must list at least one seed, got {seeds!r}")
    checked = [check_int(v, f"{key}[{i}]") for i, v in enumerate(values)]
    seen: set[int] = set()
    for value in checked:
        if value in seen:
            raise ConfigError(f"{key} must be distinct, but seed {value} is listed twice in {values!r}")
        seen.add(value)
    return checked


_RUN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def validate_run_name(name: Any, key: str = "name") -> str:
    """``name`` if it is a plain file name usable as ``runs/<name>``.

    Allowed: non-empty, only ``A-Z a-z 0-9 . _ -``, no leading ``.`` (so no ``..``, no hidden
    directory) and no ``/``.

    Raises:
        ConfigError: naming ``key`` and the value.
    """
    if (
        not isinstance(name, str)
        or not _RUN_NAME.fullmatch(name)
        or name.startswith(".")
        or ".." in name
    ):
        raise ConfigError(
            f"{key} must be a plain file name (letters, digits, '.', '_', '-'; not starting with '.'), got {name!r}"
        )
    return name


def _type_matches(value: Any, annotation: Any) -> bool:
    """Loose runtime check of ``value`` against a (possibly Optional/list) annotation."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            return False
        inner = args[0] if args else Any
        return all(_type_matches(item, inner) for item in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _type_name(annotation: Any) -> str:
    """``float``, ``list[float]``, ``str | None``... for error messages."""
    if typing.get_origin(annotation) is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def _is_float_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (list, tuple) and typing.get_args(annotation)[:1] == (float,)


def from_dict(cls: type[T], data: Any, section: str) -> T:
    """Build dataclass ``cls`` from ``data``, validating keys and types.

    Args:
        cls: a dataclass type; nested dataclass fields are built recursively.
        data: a mapping (e.g. parsed YAML).
        section: dotted name used in error messages (e.g. ``"train"``).

    Raises:
        ConfigError: naming the unknown key or the key whose value has the wrong type.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{section}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key '{section}.{unknown[0]}' (known keys: {', '.join(sorted(fields))})"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = from_dict(annotation, value, f"{section}.{name}")
            continue
        if not _type_matches(value, annotation):
            raise ConfigError(
                f"config key '{section}.{name}' has invalid value {value!r} "
                f"(expected {_type_name(annotation)})"
            )
        if annotation is float and isinstance(value, int):
            value = float(value)
        elif _is_float_list(annotation) and isinstance(value, (list, tuple)):
            value = [float(item) for item in value]
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid config section '{section}': {exc}") from exc


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as a plain dict (for JSON/YAML)."""
    return dataclasses.asdict(obj)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` with clear errors for missing or malformed files."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: '{file}'")
    try:
        data = parse_yaml(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file '{file}' is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else "parse error"
        raise ConfigError(f"config file '{file}' is not valid YAML: {first_line}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{file}' must hold a mapping at the top level")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML scalars) to a nested dict."""
    result = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override must look like key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError:
            value = raw
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[parts[-1]] = value
    return result


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``base`` recursively (mappings merge, everything else replaces)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged

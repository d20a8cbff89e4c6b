"""Dataclass configuration helpers: strict construction from dicts/YAML with clear errors.

Every config section is a dataclass; ``from_dict`` rejects unknown keys and values of the
wrong type, naming the offending key, so a typo in a YAML file fails loudly instead of being
silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from budgeted_attention.errors import ConfigError

T = TypeVar("T")


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
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
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
            value = yaml.safe_load(raw)
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

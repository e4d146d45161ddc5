"""Reading a built-in executor's JSON payload. Every mistake is a PermanentError naming the field:
retrying a bad payload cannot help, and the operator needs to know what to fix."""

from __future__ import annotations

import json
import math
from typing import Any

from scheduler.worker.errors import PermanentError


def bad(field: str, reason: str) -> PermanentError:
    return PermanentError(f"payload.{field}: {reason}" if field else f"payload: {reason}")


def json_object(payload: bytes, known: frozenset[str]) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad("", f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise bad("", f"must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - known)
    if unknown:  # a typo (`timeout` for `timeout_s`) would otherwise be ignored silently
        raise bad(unknown[0], f"unknown field (expected one of {', '.join(sorted(known))})")
    return data


def required_str(data: dict[str, Any], field: str) -> str:
    value = data.get(field)
    if not isinstance(value, str) or not value.strip():
        raise bad(field, "required, a non-empty string")
    return value


def timeout_s(data: dict[str, Any], field: str = "timeout_s") -> float | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise bad(field, f"{value!r} must be a positive number of seconds")
    return float(value)


def str_map(data: dict[str, Any], field: str) -> dict[str, str]:
    value = data.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(field, "must be an object of strings")
    for k, v in value.items():
        if not isinstance(v, str):
            raise bad(f"{field}.{k}", "must be a string")
    return dict(value)


def min_timeout(*limits: float | None) -> float | None:
    given = [t for t in limits if t is not None]
    return min(given) if given else None

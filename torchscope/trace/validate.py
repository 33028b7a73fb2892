"""Every number from a trace is checked here, at the loader boundary, so analyses, caches and renderers
never see one they cannot handle.

Header (`deviceProperties`, `distributedInfo`, anything else a tool put there): integers beyond int64
and non-finite floats are dropped wherever they are (they cannot be encoded by msgpack, msgspec or the
cache, and no meaningful header value is that large), and the fields torchscope reads are type-checked
(`computeMajor` a small non-negative integer, `rank` an int32, ...): a value of the wrong type is
dropped, as if absent. Event times: a timestamp beyond `MAX_ABS_TS_US` or a duration beyond
`MAX_DURATION_US` cannot come from a real capture; such events are dropped (timestamps) or get duration 0
(durations), with a warning, so sums, differences and percentages stay finite.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_ABS_TS_US = 1e18  # ~31,700 years in us (nanosecond epoch stamps, 1.7e18, are read as us and still fit)
MAX_DURATION_US = 1e15  # ~31 years: no profiled event lasts longer
MAX_HEADER_DEPTH = 64

# header path -> (type check, range) for the header fields that analyses read.
_SMALL_UINT = (0, 1 << 16)
_DEVICE_FIELDS: dict[str, tuple[int, int]] = {
    "computeMajor": _SMALL_UINT,
    "computeMinor": _SMALL_UINT,
    "totalGlobalMem": (0, INT64_MAX),
    "numSms": (0, 1 << 24),
}
_DISTRIBUTED_FIELDS: dict[str, tuple[int, int]] = {"rank": (0, 2**31 - 1), "world_size": (1, 2**31 - 1)}


def clean_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header with unencodable numbers removed and the fields torchscope reads type-checked."""
    cleaned: dict[str, Any] = _clean_value(header, 0)
    for key in ("deviceProperties", "computeProperties"):
        if isinstance(cleaned.get(key), list):
            cleaned[key] = [_checked_fields(p, _DEVICE_FIELDS) if isinstance(p, dict) else p for p in cleaned[key]]
    if isinstance(cleaned.get("distributedInfo"), dict):
        cleaned["distributedInfo"] = _checked_fields(cleaned["distributedInfo"], _DISTRIBUTED_FIELDS)
    return cleaned


def _clean_value(value: Any, depth: int) -> Any:
    """`value` without ints beyond int64, non-finite floats and nesting deeper than MAX_HEADER_DEPTH
    (a dropped list item becomes None, so positions keep their meaning)."""
    if isinstance(value, dict):
        if depth >= MAX_HEADER_DEPTH:
            return {}
        items = ((k, _clean_value(v, depth + 1)) for k, v in value.items() if _usable_number(v))
        return {k: v for k, v in items}
    if isinstance(value, list):
        if depth >= MAX_HEADER_DEPTH:
            return []
        return [_clean_value(v, depth + 1) if _usable_number(v) else None for v in value]
    return value


def _usable_number(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return INT64_MIN <= value <= INT64_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    return True


def _checked_fields(fields: dict[str, Any], declared: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """`fields` without the declared ones that are not integers in their range (floats with an integer
    value are accepted as that integer)."""
    checked = dict(fields)
    for key, (low, high) in declared.items():
        if key not in checked:
            continue
        value = checked[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            del checked[key]
        else:
            checked[key] = value
    return checked


def implausible_timestamps(ts_us: np.ndarray) -> np.ndarray:
    """Mask of timestamps that are NaN, infinite or beyond MAX_ABS_TS_US."""
    with np.errstate(invalid="ignore"):
        return ~(np.abs(ts_us) <= MAX_ABS_TS_US)


def implausible_durations(dur_us: np.ndarray) -> np.ndarray:
    """Mask of (non-negative, non-NaN) durations that are infinite or beyond MAX_DURATION_US."""
    with np.errstate(invalid="ignore"):
        return dur_us > MAX_DURATION_US

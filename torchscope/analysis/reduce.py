"""Combining per-span figures into run figures: weighted means and medians, and the generic merge of
measurement sections by the `Merge` each field declares (report/measurements.py)."""

from __future__ import annotations

import typing
from collections import Counter
from functools import lru_cache
from typing import Any, Sequence, TypeVar

import msgspec

from torchscope.analysis.registry import Part
from torchscope.report.measurements import Merge, Section

S = TypeVar("S", bound=Section)


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """Mean weighted by `weights`; the plain mean when the weights add up to zero."""
    total = sum(weights)
    if total:
        return sum(v * w for v, w in zip(values, weights)) / total
    return sum(values) / len(values) if values else 0.0


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at half the total weight (the mean of the two neighbours when it falls exactly
    between them, as the ordinary median does); the plain median when the weights add up to zero."""
    if not values:
        return 0.0
    if not sum(weights):
        weights = [1.0] * len(values)
    pairs = sorted(zip(values, weights))
    half = sum(w for _, w in pairs) / 2.0
    running = 0.0
    for i, (value, weight) in enumerate(pairs):
        running += weight
        if running > half:
            return value
        if running == half:
            return (value + pairs[i + 1][0]) / 2.0 if i + 1 < len(pairs) else value
    return pairs[-1][0]


@lru_cache(maxsize=None)
def merge_rules(section_type: type[Section]) -> dict[str, Merge]:
    """Each field's declared `Merge` (a field without one is a programming error)."""
    hints = typing.get_type_hints(section_type, include_extras=True)
    rules = {}
    for field in msgspec.structs.fields(section_type):
        found = [m for m in getattr(hints[field.name], "__metadata__", ()) if isinstance(m, Merge)]
        if not found:
            raise TypeError(f"{section_type.__name__}.{field.name} declares no Merge")
        rules[field.name] = found[0]
    return rules


def merge_sections(parts: Sequence[Part[S | None]], section_type: type[S]) -> S:
    """One section from the spans' sections, field by field as declared; spans whose section is None
    (it does not apply there) are left out. Weights are the spans' step counts."""
    present = [(p.value, float(p.key.steps)) for p in parts if p.value is not None]
    if not present:
        return section_type()
    sections = [s for s, _ in present]
    weights = [w for _, w in present]
    merged = {
        name: _merge_field(rule, [getattr(s, name) for s in sections], weights)
        for name, rule in merge_rules(section_type).items()
    }
    return section_type(**merged)


def _merge_field(rule: Merge, values: list[Any], weights: list[float]) -> Any:
    if rule is Merge.MEAN:
        return weighted_mean([float(v) for v in values], weights)
    if rule is Merge.MEDIAN:
        return weighted_median([float(v) for v in values], weights)
    if rule is Merge.SUM:
        return float(sum(values))
    if rule is Merge.KEYED_MEAN:
        return _keyed_mean(values, weights)
    if rule is Merge.UNION:
        seen: list[Any] = []
        for value in values:
            seen.extend(x for x in value if x not in seen)
        return seen
    return Counter(values).most_common(1)[0][0]  # Merge.MODE


def _keyed_mean(values: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
    """Per name, the step-weighted mean over all spans (a span without the name counts as zero)."""
    total = sum(weights) or 1.0
    out: dict[str, float] = {}
    for mapping, weight in zip(values, weights):
        for name, value in mapping.items():
            out[name] = out.get(name, 0.0) + float(value) * weight / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

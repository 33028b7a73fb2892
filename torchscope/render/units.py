"""How renderers write quantities, in one place."""

from __future__ import annotations


def duration(us: float) -> str:
    """Microseconds as people read them: `1.23 ms` from a millisecond up, else `850 us`."""
    return f"{us / 1000:,.2f} ms" if abs(us) >= 1000 else f"{us:,.0f} us"

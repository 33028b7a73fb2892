"""How renderers write quantities, in one place."""

from __future__ import annotations


def duration(us: float) -> str:
    """Microseconds as people read them: `1.23 ms` from a millisecond up, else `850 us`."""
    return f"{us / 1000:,.2f} ms" if abs(us) >= 1000 else f"{us:,.0f} us"


def size(nbytes: float) -> str:
    """Bytes as people read them: `4.0 MiB`, `1.2 GiB`, `512 B`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,.0f} B"


def share(fraction: float | None) -> str:
    """A share of the step as a percentage, `12.3 %`; "n/a" when there is none (never a made-up 0)."""
    return "n/a" if fraction is None else f"{100 * fraction:.1f} %"

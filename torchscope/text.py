"""Text that is safe to print: user-derived strings (file names, trace names, messages) with control
characters and undecodable bytes shown escaped, so a name can neither move the cursor, recolour the
terminal nor break a one-line message, and a non-UTF-8 file name never makes an encoder raise."""

from __future__ import annotations

import os

# C0 controls, DEL and C1 controls; `\n` too unless a caller keeps line breaks.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))}
_CONTROL_KEEP_NEWLINES = {c: e for c, e in _CONTROL.items() if c != 0x0A}


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` with control characters escaped (`\\x1b`) and lone surrogates (undecodable bytes of a file
    name, as `os.fsdecode` gives them) shown as `\\udcff`."""
    escaped = text.translate(_CONTROL_KEEP_NEWLINES if keep_newlines else _CONTROL)
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")


def path_text(path: str | os.PathLike[str]) -> str:
    """A path as text that always encodes as UTF-8: undecodable bytes of the name become `\\xff`."""
    raw = os.fsencode(os.fspath(path))
    return raw.decode("utf-8", "backslashreplace")


def one_line(text: str) -> str:
    """`text` on one printable line: whitespace runs become one space, control characters escaped."""
    return printable(" ".join(text.split()))

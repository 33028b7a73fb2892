"""One-line warnings on stderr: the only way capture code talks to the user.

Capture must never break the user's training, so problems are recorded (for the manifest) and
reported as one ``torchscope: warning: ...`` line instead of being raised.
"""

from __future__ import annotations

import logging
import sys

from torchscope.text import one_line

log = logging.getLogger("torchscope.capture")


def warn_line(message: str) -> None:
    """Print ``torchscope: warning: <message>`` as one line on stderr; never raises."""
    text = one_line(str(message))
    try:
        sys.stderr.write(f"torchscope: warning: {text}\n")
        sys.stderr.flush()
    except Exception:  # a closed or broken stderr must not break the run either
        pass


def describe(exc: BaseException) -> str:
    """A short one-line description of an exception: ``Type: message``."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}" if text else name

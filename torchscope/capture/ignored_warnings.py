"""Warnings of torch's about torchscope's own capture, ignored while the capture runs.

Some of torch's warnings describe what torchscope does on the user's behalf, and their advice would be
wrong for it: each is ignored by one `warnings.filters` entry added when the capture starts and removed
alone when it ends, so the user's own filters, added before or during the run, stay as they are."""

from __future__ import annotations

import warnings
from typing import Any, cast


class IgnoredWarning:
    """One `UserWarning` message (a regular expression, as `warnings.filterwarnings` takes it) ignored
    between `install` and `uninstall`."""

    def __init__(self, message: str) -> None:
        self.message = message
        self._entry: Any = None  # the entry install() put in warnings.filters

    def install(self) -> None:
        if self._entry is None:
            warnings.filterwarnings("ignore", message=self.message, category=UserWarning)
            self._entry = warnings.filters[0]

    def uninstall(self) -> None:
        filters = cast("list[Any]", warnings.filters)  # a list at run time (typeshed: a Sequence)
        if self._entry in filters:  # only our entry: the user's own filters stay as they are
            filters.remove(self._entry)
        self._entry = None

"""What the browser tests and benchmarks/dashboard.py share: Debian's Chromium and its flags, the samples'
folder, the hostile label and the views (a module of its own: `conftest` is a name every test folder has)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "data" / "traces"
CHROMIUM = "/usr/bin/chromium"
# Offline, quiet and headless: no first-run, sync, component or background network traffic.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
HOSTILE_LABEL = "</script><img src=x onerror=alert(1)>"
VIEWS = ("overview", "operators", "kernels", "timeline", "memory", "distributed")


@dataclass
class Page:
    """A page with everything it logged as an error (console errors, uncaught exceptions, dialogs)."""

    page: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


def screenshot(tab: Any, name: str) -> None:
    """Save `tab` as DIR/name.png when TORCHSCOPE_SCREENSHOTS=DIR is set (the docs' screenshots)."""
    folder = os.environ.get("TORCHSCOPE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(Path(folder) / f"{name}.png"))

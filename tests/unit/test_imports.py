"""Importing the analysis entry point loads only what every analysis needs.

Modules needed only to write caches (tempfile, which pulls in shutil, random, bz2 and lzma), to read npz entries
(zipfile), to write manifests (socket), to key caches
(hashlib maps OpenSSL) or to start pools (multiprocessing) are imported on use: each costs milliseconds
and megabytes at every start, and a 50 MB trace is analysed in under half a second."""

from __future__ import annotations

import subprocess
import sys

ON_USE_ONLY = ("tempfile", "hashlib", "multiprocessing", "concurrent.futures", "numpy.ma", "statistics", "zipfile", "socket",
               "json", "shutil")


def test_the_analysis_entry_point_imports_no_on_use_module() -> None:
    # Only what importing torchscope adds counts: an interpreter's site hooks may load some of these first.
    # `torchscope.analyze` loads the entry point on first use, wherever the package keeps it.
    code = ("import sys\nbefore = set(sys.modules)\nimport torchscope, torchscope.cli\ntorchscope.analyze\n"
            f"print(','.join(m for m in {ON_USE_ONLY!r} if m in sys.modules and m not in before))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"imported at start: {result.stdout.strip()}"

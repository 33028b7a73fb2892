"""Test folders are not packages, so pytest imports each test module by its file name: two files with
one name (tests/unit/test_x.py and tests/integration/test_x.py) stop the collection of the whole suite
with "import file mismatch". This names the clash instead."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_names_are_unique_across_folders() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if ".mypy_cache" not in p.parts)
    assert names["test_module_names.py"] == 1
    clashes = {name: sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob(name)) for name, n in names.items() if n > 1}
    assert not clashes, f"rename one of each: {clashes}"

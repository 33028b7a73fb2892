"""No dataclass is defined on the analysis import path: values are msgspec Structs (docs/architecture.md).

A frozen dataclass costs ~1 ms to define at import (a Struct ~0.03 ms); 37 of them once added ~45 ms to
every `torchscope analyze`."""

from __future__ import annotations

import subprocess
import sys


def test_the_analysis_entry_point_defines_no_dataclass() -> None:
    code = (
        "import dataclasses, sys\nimport torchscope, torchscope.cli\ntorchscope.analyze\n"
        "from torchscope.pipeline.analyze import analyze\n"
        "found = sorted(f'{name}.{attr}' for name, module in list(sys.modules.items())\n"
        "               if name.split('.')[0] == 'torchscope' and module is not None\n"
        "               for attr, value in vars(module).items()\n"
        "               if isinstance(value, type) and value.__module__ == name and dataclasses.is_dataclass(value))\n"
        "print(','.join(found))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"dataclasses on the analysis import path: {result.stdout.strip()}"

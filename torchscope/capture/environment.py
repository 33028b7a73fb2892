"""What the manifest records about the process's machine: CPUs, ranks per node, threads, cuDNN flags.

Rules size their advice by it (how many DataLoader workers the CPUs allow, whether cuDNN autotunes), so it
is read at the end of the capture, when the script has set its threads and flags.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def capture_environment() -> dict[str, Any]:
    """CPUs and threading of this process (never raises; torch's part only if the script imported torch)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    env: dict[str, Any] = {
        "cpu_count": cpus,
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    torch_module = sys.modules.get("torch")
    if torch_module is not None:
        try:
            env["torch_num_threads"] = int(torch_module.get_num_threads())
            env["cudnn_benchmark"] = bool(torch_module.backends.cudnn.benchmark)
            env["cuda_devices"] = int(torch_module.cuda.device_count()) if torch_module.cuda.is_available() else 0
        except Exception:  # an exotic build must not cost the manifest
            pass
    return env

"""What the manifest records about the process's machine: CPUs, ranks per node, threads, cuDNN flags,
accelerators, the DataLoaders' settings, CPU contention and the capture's step clock.

Rules size their advice by it (how many DataLoader workers the CPUs allow, whether cuDNN autotunes,
whether ``pin_memory`` can help), so it is read at the end of the capture, when the script has set its
threads and flags. ``dataloaders`` and ``contention`` come from :mod:`torchscope.capture.machine`,
``step_times`` from :mod:`torchscope.capture.overhead`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from torchscope.capture.cpu_peak import measure_cpu_peak


def capture_environment(
    dataloaders: list[dict[str, Any]] | None = None,
    timing: dict[str, Any] | None = None,
    cpu_peak: bool = False,
    anomaly_seen: bool = False,
) -> dict[str, Any]:
    """CPUs and threading of this process, plus the DataLoaders iterated and the step clock's ``timing``
    (its ``contention`` kept apart) when given (never raises; torch's part only if the script imported torch).
    ``cpu_peak``: on a machine without an accelerator, measure the CPU's matmul and copy rates
    (:mod:`torchscope.capture.cpu_peak`) for the roofline. ``anomaly_seen``: autograd's anomaly detection
    was on at a step boundary (a ``detect_anomaly()`` block may have ended before the capture does)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cpus = len(allowed)
    env: dict[str, Any] = {
        "cpu_count": cpus,
        "physical_cores": physical_cores(allowed),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        # A debugging setting that makes every kernel launch synchronous (CUDA reads it at initialisation).
        "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING", "").strip() == "1",
    }
    torch_module = sys.modules.get("torch")
    if torch_module is not None:
        try:
            env["torch_num_threads"] = int(torch_module.get_num_threads())
            env["cudnn_benchmark"] = bool(torch_module.backends.cudnn.benchmark)
            env["cuda_devices"] = int(torch_module.cuda.device_count()) if torch_module.cuda.is_available() else 0
            env["accelerator"] = _accelerator(torch_module)
            env["anomaly_mode"] = anomaly_seen or anomaly_mode_enabled(torch_module)
            env["default_dtype"] = str(torch_module.get_default_dtype())
        except Exception:  # an exotic build must not cost the manifest
            pass
        if cpu_peak and env.get("accelerator", "unknown") is None:
            peak = measure_cpu_peak(torch_module)
            if peak is not None:
                env["cpu_peak"] = peak
    if dataloaders:
        env["dataloaders"] = [dict(loader) for loader in dataloaders]
    if timing:
        timing = dict(timing)
        contention = timing.pop("contention", None)
        if contention:
            env["contention"] = contention
        env["step_times"] = timing
    return env


def anomaly_mode_enabled(torch_module: Any) -> bool:
    """Whether autograd's anomaly detection is on now (never raises)."""
    try:
        return bool(torch_module.is_anomaly_enabled())
    except Exception:
        return False


def _accelerator(torch_module: Any) -> str | None:
    """The accelerator torch would use ("cuda", "mps", "xpu"...), None on a CPU-only machine."""
    current = getattr(torch_module, "accelerator", None)
    if current is not None and hasattr(current, "is_available"):
        if not current.is_available():
            return None
        device = current.current_accelerator()
        return str(device.type) if device is not None else None
    return "cuda" if torch_module.cuda.is_available() else None


def physical_cores(cpus: list[int]) -> int | None:
    """The cores (not hardware threads) the `cpus` belong to, from the kernel's topology (Linux sysfs);
    None where it cannot be read. torch's default intra-op thread count is the physical cores, so a run
    on fewer threads than hardware threads is not necessarily short of threads."""
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()))
        except OSError:
            return None
    return len(cores) or None

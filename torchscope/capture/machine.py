"""What the machine was doing while the capture recorded: CPU contention, and the DataLoaders' settings.

Advice has to fit the machine it runs on: more DataLoader workers only help when there are cores for
them, and a verdict taken while other processes ate the CPUs describes the contention as much as the
training. So the capture records, Linux ``/proc`` only (elsewhere the figures are simply absent):

* :class:`CpuSampler`: CPU time of the CPUs this process may run on (``/proc/stat`` per-CPU lines for
  ``os.sched_getaffinity``) against this process tree's own CPU time (``/proc/<pid>/stat`` of the process,
  its reaped children and its live descendants: DataLoader workers are our work, not contention), the
  load average, and the process's CPU time over the wall time. Sampled when recording starts and ends.
* :class:`LoaderRegistry`: each ``DataLoader`` the script iterates, with ``num_workers``, ``pin_memory``,
  ``batch_size``, ``persistent_workers``, ``prefetch_factor`` and the dataset's ``__getitem__``.

Never raises: a figure that cannot be read is left out.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from torchscope.capture.patching import Patch

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (iowait and idle are not busy)
MAX_LOADERS = 8  # distinct DataLoaders recorded (train/val/test; a loop that makes one per epoch repeats)


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def busy_ticks(cpus: list[int], stat_text: str) -> Optional[int]:
    """Busy clock ticks (user, nice, system, irq, softirq, steal) of ``cpus`` in a ``/proc/stat`` text;
    None when a CPU's line is missing."""
    wanted = {f"cpu{c}" for c in cpus}
    total, seen = 0, 0
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:]]
            total += sum(values[i] for i in _BUSY_FIELDS if i < len(values))
            seen += 1
    return total if seen == len(wanted) else None


def process_ticks(stat_text: str, with_children: bool = True) -> int:
    """utime + stime (+ cutime + cstime: reaped children) of one ``/proc/<pid>/stat`` text."""
    fields = stat_text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    # fields[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
    ticks = int(fields[11]) + int(fields[12])
    return ticks + (int(fields[13]) + int(fields[14]) if with_children else 0)


def _descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (``/proc/<pid>/task/*/children``, recursively)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 4096:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in children:
                found.append(int(child))
                todo.append(int(child))
    return found


def tree_ticks(pid: int) -> Optional[int]:
    """CPU ticks of process ``pid``, its reaped children and its live descendants."""
    try:
        total = process_ticks(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return None
    for child in _descendants(pid):
        try:
            total += process_ticks(Path(f"/proc/{child}/stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # ended in between: its time is in its parent's cutime once reaped
    return total


# The share of other processes is stated only when the window's capacity (wall time x CPUs) is at least
# ten times what the tick counters can be off by: a 2 ms window read one stray 10 ms tick as "other
# processes used 100 % of the CPUs", and a 60 ms window on 2 CPUs reads each stray tick as 8 %. The
# sampler so extends a shorter window to the first step boundary after it is long enough (CpuSampler.poll).
MAX_TICK_ERROR = 0.1


def tick_error_s(cpus: int, ticks_per_s: int) -> float:
    """How far the other processes' CPU time can be off: a tick of each CPU's busy counter and one of
    this process tree's, each read at a random point within its tick."""
    return (cpus + 1) / ticks_per_s


class CpuSample:
    """One reading of the clocks (any figure may be None where /proc is missing)."""

    def __init__(self, pid: int, cpus: list[int]) -> None:
        self.wall = time.monotonic()
        self.process_cpu = time.process_time()  # this process only, all threads
        self.own = tree_ticks(pid)
        try:
            self.busy = busy_ticks(cpus, Path("/proc/stat").read_text())
        except OSError:
            self.busy = None


class CpuSampler:
    """CPU contention between :meth:`begin` and :meth:`end` (see the module docstring)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._cpus = allowed_cpus()
        self._first: Optional[CpuSample] = None
        self._last: Optional[CpuSample] = None
        self._ending = False  # end() was called on a window too short to resolve: poll() ends it later
        # The shortest window whose capacity (wall x CPUs) is ten times the tick counters' error.
        self._shortest_s = tick_error_s(len(self._cpus), _clock_ticks()) / (MAX_TICK_ERROR * max(len(self._cpus), 1))

    def begin(self) -> None:
        """Start (again) measuring; never raises."""
        self._ending = False
        try:
            self._first, self._last = CpuSample(self._pid, self._cpus), None
        except Exception:
            self._first = None

    def end(self) -> None:
        """The window to measure has ended: stop now if it is long enough for the tick counters to resolve
        other processes' share (see :data:`MAX_TICK_ERROR`), else at the first :meth:`poll` that finds it
        so (a few fast recorded steps last tens of milliseconds). Never raises."""
        self._ending = self._first is not None and self._last is None
        self.poll()

    def poll(self) -> None:
        """Stop measuring if :meth:`end` was called and the window is now long enough: one clock read
        otherwise, so that it can run at every step boundary."""
        first = self._first
        if not self._ending or first is None or self._last is not None:
            return
        if time.monotonic() - first.wall < self._shortest_s:
            return
        self.finish()

    def finish(self) -> None:
        """Stop measuring, whatever the window's length (the run is over); never raises."""
        if self._first is None or self._last is not None:
            return
        self._ending = False
        try:
            self._last = CpuSample(self._pid, self._cpus)
        except Exception:
            self._last = None

    def summary(self) -> dict[str, Any]:
        """The manifest's ``contention``: empty when nothing was measured."""
        first, last = self._first, self._last
        if first is None:
            return {}
        if last is None:
            self.finish()
            last = self._last
        if last is None or last.wall <= first.wall:
            return {}
        return contention_figures(first, last, len(self._cpus), _clock_ticks(), _load_average())


def contention_figures(
    first: CpuSample, last: CpuSample, cpus: int, ticks_per_s: int, load: Optional[float]
) -> dict[str, Any]:
    """Contention over two samples: CPU-seconds used on our CPUs by other processes, as a share of
    those CPUs' capacity, and this process's CPU time over the wall time."""
    wall = last.wall - first.wall
    out: dict[str, Any] = {
        "wall_s": round(wall, 4),
        "cpus": cpus,
        "process_cpu_s": round(last.process_cpu - first.process_cpu, 4),
        "process_cpu_per_wall": round((last.process_cpu - first.process_cpu) / wall, 3),
    }
    if load is not None:
        out["load_average_1m"] = load
    if first.busy is not None and last.busy is not None and first.own is not None and last.own is not None:
        busy_s = (last.busy - first.busy) / ticks_per_s
        own_s = (last.own - first.own) / ticks_per_s
        # Tick counters are coarse (10 ms) and our own time may run on CPUs outside the set: never below 0.
        other_s = max(busy_s - own_s, 0.0)
        out.update(busy_cpu_s=round(busy_s, 3), own_cpu_s=round(own_s, 3), other_cpu_s=round(other_s, 3))
        if tick_error_s(cpus, ticks_per_s) <= MAX_TICK_ERROR * wall * cpus:
            out["other_share"] = round(min(other_s / (wall * cpus), 1.0), 4)
    return out


def _load_average() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


# -- DataLoader settings -------------------------------------------------------------------------------------


def loader_settings(loader: Any) -> dict[str, Any]:
    """The settings of one ``DataLoader`` that decide how fast it feeds the loop (never raises)."""
    settings: dict[str, Any] = {"class": type(loader).__name__}
    for name in ("num_workers", "pin_memory", "batch_size", "persistent_workers", "prefetch_factor", "drop_last"):
        value = getattr(loader, name, None)
        if value is None or isinstance(value, (bool, int)):
            settings[name] = value
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        settings["dataset"] = type(dataset).__qualname__
        getitem = getattr(type(dataset), "__getitem__", None)
        code = getattr(getitem, "__code__", None)
        if code is not None:
            settings["getitem"] = f"{code.co_filename}:{code.co_firstlineno}"
    return settings


class LoaderRegistry:
    """Records the settings of each DataLoader iterated while installed (``DataLoader.__iter__`` wrapped;
    the wrapper only reads attributes and calls the original)."""

    def __init__(self) -> None:
        self.loaders: list[dict[str, Any]] = []
        self._seen: dict[int, tuple[Any, dict[str, Any]]] = {}  # id -> (weak reference, entry)
        self._lock = threading.Lock()
        self._patch: Optional[Patch] = None

    def install(self) -> None:
        """Wrap ``torch.utils.data.DataLoader.__iter__`` (a no-op when torch's DataLoader is missing)."""
        if self._patch is not None:
            return
        try:
            from torch.utils.data import DataLoader
        except Exception:
            return
        if DataLoader.__dict__.get("__iter__") is None:
            return
        self._patch = Patch(DataLoader, "__iter__", self._wrap)
        self._patch.install()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        registry = self

        def __iter__(loader: Any) -> Any:
            if registry._patch is not None:  # uninstalled but held by a later patch: pass through
                registry.note(loader)
            return original(loader)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        return __iter__

    def uninstall(self) -> None:
        """Take the ``__iter__`` wrapper off."""
        if self._patch is not None:
            self._patch.uninstall()
        self._patch = None

    def note(self, loader: Any) -> None:
        """Record ``loader`` (its settings when first seen; ``iterations`` counts each ``iter()``)."""
        try:
            with self._lock:
                ref, entry = self._seen.get(id(loader), (None, None))
                if entry is None or ref is None or ref() is not loader:  # a freed loader's id can be reused
                    if len(self.loaders) >= MAX_LOADERS:
                        return
                    entry = loader_settings(loader)
                    entry["iterations"] = 0
                    self._seen[id(loader)] = (weakref.ref(loader), entry)
                    self.loaders.append(entry)
                entry["iterations"] += 1
        except Exception:  # recording must never break the training loop
            pass

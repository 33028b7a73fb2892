"""Reading PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot()` pickles) as untrusted input.

A snapshot is a pickled dict of plain Python values (`segments`: list of dicts with `blocks`; and
`device_traces`: a list per device of allocator actions; frames as dicts of filename/line/name), so its
pickle needs no class at all. Unpickling calls `find_class` for every global a pickle names (that is how
a hostile pickle reaches `os.system` or `builtins.eval`); `SnapshotUnpickler` refuses every one of them
except the few the format may use, so loading runs no code. The file goes through the same guarded opener
as traces (a regular file, bounded in size).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from torchscope.errors import TraceFormatError
from torchscope.trace.read import max_trace_bytes, open_trace

# Globals a snapshot may name. The format is plain dicts/lists/tuples/ints/strs (pickle opcodes, no
# globals); OrderedDict is accepted for writers that use one. Anything else is refused.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({("collections", "OrderedDict")})


class SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain values: `find_class` refuses every global not allowed."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} (a memory snapshot holds only plain values)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id (a memory snapshot has none)")


def load_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot dict of `path`; TraceFormatError (exit 2, one line) on anything else."""
    limit = max_trace_bytes()
    with open_trace(path, limit) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise TraceFormatError(path, "file is too large for a memory snapshot")
    try:
        snapshot = SnapshotUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(path, f"not a memory snapshot: {exc}") from None
    except Exception as exc:  # truncated or garbage pickles raise many types (EOFError, ValueError, ...)
        raise TraceFormatError(path, f"not a memory snapshot pickle ({type(exc).__name__})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise TraceFormatError(path, "not a memory snapshot: expected a dict with a 'segments' list")
    return snapshot

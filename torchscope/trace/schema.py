"""The one place that declares which Kineto event fields and `args` become table columns.

Events are decoded into a small struct whose `args` stays raw JSON. `args` are then decoded only for
the event kinds that use them, each kind group into a struct holding just its columns (see
`ARG_GROUPS`), so a cpu_op never pays for kernel fields and unknown keys are skipped by msgspec.
Sentinel defaults (-1, NaN, empty) stand for "absent" so columns are built without per-value checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from torchscope.trace.kinds import Kind

_RAW_EMPTY = msgspec.Raw(b"")
_RAW_NO_ARGS = msgspec.Raw(b"{}")  # lets args of many events be joined into one JSON array as they are
# Integer args become int64/int32 columns: a value outside the column's range is invalid (and falls back
# to the default), so filling a column can never overflow.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class Event(msgspec.Struct, gc=False):
    """One Chrome-trace event as Kineto writes it; `args` is decoded later, per kind."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    ts: float = math.nan
    dur: float = math.nan
    id: Union[int, str, None] = None
    args: msgspec.Raw = _RAW_NO_ARGS


# column -> (JSON key in `args`, type, default). Raw-typed fields keep JSON text (shapes, grid, block).
ARG_FIELDS: dict[str, tuple[str, Any, Any]] = {
    "external_id": ("External id", Int64, -1),
    "external_id_lower": ("external id", Int64, -1),  # device events in PyTorch <= 1.10
    "correlation": ("correlation", Int64, -1),
    "input_dims": ("Input Dims", msgspec.Raw, _RAW_EMPTY),
    "input_type": ("Input type", msgspec.Raw, _RAW_EMPTY),
    "call_stack": ("Call stack", str, ""),
    "stream": ("stream", Int32, -1),
    "device": ("device", Int32, -1),
    "nbytes": ("bytes", Int64, -1),
    "bandwidth_gbps": ("memory bandwidth (GB/s)", float, math.nan),
    "grid": ("grid", msgspec.Raw, _RAW_EMPTY),
    "block": ("block", msgspec.Raw, _RAW_EMPTY),
    "registers_per_thread": ("registers per thread", Int32, -1),
    "blocks_per_sm": ("blocks per SM", float, math.nan),
    "occupancy_pct": ("est. achieved occupancy %", float, math.nan),
    "mem_bytes": ("Bytes", Int64, 0),
    "total_allocated": ("Total Allocated", Int64, -1),
    "total_reserved": ("Total Reserved", Int64, -1),
    "device_type": ("Device Type", Int32, -1),
    "device_id": ("Device Id", Int32, -1),
    "addr": ("Addr", Int64, -1),
    "label": ("name", str, ""),
}

_OP = ("external_id", "input_dims", "input_type", "call_stack")
_DEVICE = ("external_id", "external_id_lower", "correlation", "stream", "device", "nbytes",
           "bandwidth_gbps", "grid", "block", "registers_per_thread", "blocks_per_sm", "occupancy_pct")
_RUNTIME = ("external_id", "external_id_lower", "correlation", "device", "stream")
_MEMORY = ("mem_bytes", "total_allocated", "total_reserved", "device_type", "device_id", "addr")


@dataclass(frozen=True)
class ArgGroup:
    """Event kinds whose `args` are decoded into one struct type holding `columns`."""

    kinds: tuple[Kind, ...]
    columns: tuple[str, ...]
    decoder: msgspec.json.Decoder  # decodes a JSON array of args objects


def _group(name: str, kinds: tuple[Kind, ...], columns: tuple[str, ...]) -> ArgGroup:
    fields = [
        (column, ARG_FIELDS[column][1], msgspec.field(default=ARG_FIELDS[column][2], name=ARG_FIELDS[column][0]))
        for column in columns
    ]
    struct = msgspec.defstruct(name, fields, gc=False, frozen=True)
    return ArgGroup(kinds, columns, msgspec.json.Decoder(list[struct]))  # type: ignore[valid-type]


ARG_GROUPS: tuple[ArgGroup, ...] = (
    _group("OpArgs", (Kind.CPU_OP, Kind.USER_ANNOTATION), _OP),
    _group("DeviceArgs", (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_USER_ANNOTATION), _DEVICE),
    _group("RuntimeArgs", (Kind.RUNTIME, Kind.DRIVER, Kind.CUDA_SYNC), _RUNTIME),
    _group("MemoryArgs", (Kind.MEMORY,), _MEMORY),
    _group("MetadataArgs", (Kind.METADATA,), ("label",)),
)

EVENT_LIST_DECODER = msgspec.json.Decoder(list[Event])
EVENT_DECODER = msgspec.json.Decoder(Event)
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
TOP_LEVEL_DECODER = msgspec.json.Decoder(Union[dict[str, msgspec.Raw], list[msgspec.Raw]])

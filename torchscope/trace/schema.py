"""The one place that declares which Kineto event fields and `args` become table columns.

Events are decoded in one pass into small typed structs: the event's own fields, and `args` into one
struct that declares every args key torchscope reads (`ARG_FIELDS`); msgspec skips every other key
without allocating anything, and an event without those keys shares one frozen default `Args`. Which
event kinds a column is read from is declared by `ARG_GROUPS`, so a stray key on another kind of event
never reaches a column. Sentinel defaults (-1, NaN, empty) stand for "absent" so columns are built
without per-value checks.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Union

import msgspec

from torchscope.trace.kinds import Kind

_RAW_EMPTY = msgspec.Raw(b"")
# Integer args become int64/int32 columns: a value outside the column's range is invalid (and falls back
# to the default), so filling a column can never overflow.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


# column -> (JSON key in `args`, type, default). Raw-typed fields keep JSON text (shapes, grid, block).
ARG_FIELDS: dict[str, tuple[str, Any, Any]] = {
    "external_id": ("External id", Int64, -1),
    "external_id_lower": ("external id", Int64, -1),  # device events in PyTorch <= 1.10
    "correlation": ("correlation", Int64, -1),
    "input_dims": ("Input Dims", msgspec.Raw, _RAW_EMPTY),
    "input_type": ("Input type", msgspec.Raw, _RAW_EMPTY),
    # Scalar arguments as text, e.g. a convolution's stride and padding (PyTorch 2.x with record_shapes).
    "concrete_inputs": ("Concrete Inputs", msgspec.Raw, _RAW_EMPTY),
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
    # Collectives (`record_param_comms` ops, and NCCL kernels in newer traces): torch/csrc/profiler/util.h.
    "comm_name": ("Collective name", str, ""),
    "pg_name": ("Process Group Name", str, ""),
    "group_size": ("Group size", Int32, -1),
    "in_nelems": ("In msg nelems", Int64, -1),
    "out_nelems": ("Out msg nelems", Int64, -1),
    "comm_dtype": ("dtype", str, ""),
    "seq": ("Seq", Int64, -1),
}

_OP = ("external_id", "input_dims", "input_type", "concrete_inputs", "call_stack")
_DEVICE = ("external_id", "external_id_lower", "correlation", "stream", "device", "nbytes",
           "bandwidth_gbps", "grid", "block", "registers_per_thread", "blocks_per_sm", "occupancy_pct")
_RUNTIME = ("external_id", "external_id_lower", "correlation", "device", "stream")
_COMM = ("comm_name", "pg_name", "group_size", "in_nelems", "out_nelems", "comm_dtype", "seq")
_MEMORY = ("mem_bytes", "total_allocated", "total_reserved", "device_type", "device_id", "addr")


Args = msgspec.defstruct(
    "Args",
    [(column, kind, msgspec.field(default=default, name=key)) for column, (key, kind, default) in ARG_FIELDS.items()],
    gc=False,
    frozen=True,  # one shared default instance for events without args
)
NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One Chrome-trace event as Kineto writes it, with the `args` torchscope reads."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    ts: float = math.nan
    dur: float = math.nan
    id: Union[int, str, None] = None
    args: Args = NO_ARGS  # type: ignore[valid-type]  # a class made by defstruct


class ArgGroup(msgspec.Struct, frozen=True):
    """Event kinds whose `args` fill `columns` (other kinds keep the columns' defaults)."""

    kinds: tuple[Kind, ...]
    columns: tuple[str, ...]


ARG_GROUPS: tuple[ArgGroup, ...] = (
    ArgGroup((Kind.CPU_OP, Kind.USER_ANNOTATION), _OP),
    ArgGroup((Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_USER_ANNOTATION), _DEVICE),
    ArgGroup((Kind.RUNTIME, Kind.DRIVER, Kind.CUDA_SYNC), _RUNTIME),
    ArgGroup((Kind.MEMORY,), _MEMORY),
    ArgGroup((Kind.METADATA,), ("label",)),
    ArgGroup((Kind.CPU_OP, Kind.KERNEL), _COMM),
)

EVENT_LIST_DECODER = msgspec.json.Decoder(list[Event])
EVENT_DECODER = msgspec.json.Decoder(Event)
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
RAW_OBJECT_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
TOP_LEVEL_DECODER = msgspec.json.Decoder(Union[dict[str, msgspec.Raw], list[msgspec.Raw]])

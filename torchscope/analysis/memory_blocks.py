"""Allocator events of one device as columns: blocks paired with their frees by address, and who
allocated each block (the CPU op the user called, and the user's Python line).

Kineto writes one `[memory]` instant per allocation (`Bytes` > 0) and per free (`Bytes` < 0) with the
block's `Addr` and, since PyTorch 1.10, the device's running `Total Allocated`/`Total Reserved`. An address
is reused once freed, so sorting by (address, time) puts each allocation right before its own free: a
block is an allocation whose next event at the same address is a free. A free with no allocation before
it released a block allocated before the capture; an allocation with no free outlives the trace.

An allocation whose next event at its address is another allocation was freed without the trace seeing
it: the profiler records a free only on a thread it follows, so a tensor whose last reference drops on
another thread leaves no free (an FSDP2 run on gloo lost a few of its collectives' 1 MiB buffers so each
step). Such a block is counted freed at that next allocation
(`Blocks.unrecorded`), and c10's CPU allocator, whose `Total Allocated` counts only the events it
reported, never took it off its total (`without_unrecorded_frees`). Blocks never freed in the trace but
perhaps freed unseen (`possibly_freed_unseen`) are no evidence of a leak either.

Instants are not part of the host call tree (they have no duration), so the op enclosing one is found by
a sorted search per thread (the last host event starting at or before it) and a walk up the tree until
an ancestor covers it, all events of one tree level at a time.
"""

from __future__ import annotations

import re
from typing import Callable

import msgspec
import numpy as np

from torchscope.analysis.frames import is_library_code, is_module_call, is_user_frame, readable
from torchscope.analysis.markers import is_comm_op_name
from torchscope.analysis.nesting import HostTree
from torchscope.analysis.nesting import tree_order
from torchscope.analysis.source_lines import frame_at_call
from torchscope.arrays import distinct, group_ids
from torchscope.trace.kinds import Kind
from torchscope.trace.sparse import SparseColumn
from torchscope.trace.tables import EventTable

_FRAME = re.compile(r"^.*\(\d+\): .+$")


class DeviceMemory(msgspec.Struct, frozen=True):
    """One device's `[memory]` events in time order (`rows` index the event table)."""

    rows: np.ndarray
    ts_us: np.ndarray
    nbytes: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray | None  # None: no `Total Reserved` in the trace, or only zeros (the CPU)
    addr: np.ndarray

    @property
    def allocated_before(self) -> np.ndarray:
        """The allocated total just before each event (the one after it, less its own bytes)."""
        return self.allocated - self.nbytes

    def has_addresses(self) -> bool:
        return bool(self.addr.size) and bool((self.addr >= 0).all())


class MemoryEvents(msgspec.Struct, frozen=True):
    """All `[memory]` events of a table in time order (`rows` index the table), their columns read once."""

    rows: np.ndarray
    ts_us: np.ndarray
    nbytes: np.ndarray
    total_allocated: np.ndarray
    total_reserved: np.ndarray
    addr: np.ndarray
    device_type: np.ndarray
    device_id: np.ndarray


def memory_events(events: EventTable) -> MemoryEvents:
    """The `[memory]` events in time order (ties in table order)."""
    mem = events.kind_rows(Kind.MEMORY)
    order = np.argsort(events.ts_us[mem], kind="stable")
    rows = mem[order]

    def read(name: str) -> np.ndarray:
        column = getattr(events, name)
        if isinstance(column, SparseColumn) and column.rows.size == mem.size and np.array_equal(column.rows, mem):
            return column.values[order]  # carried by every `[memory]` event: no need to expand the column
        return np.asarray(column[rows])

    columns = ("mem_bytes", "total_allocated", "total_reserved", "addr", "device_type", "device_id")
    return MemoryEvents(rows, events.ts_us[rows], *(read(name) for name in columns))


def device_memory(memory: MemoryEvents, at: np.ndarray) -> DeviceMemory:
    """The events at positions `at` (ascending) of `memory`, one device's, with the allocated total
    rebuilt where the trace predates `Total Allocated` (relative to the start of the capture, never below
    zero)."""
    nbytes = memory.nbytes[at]
    allocated = memory.total_allocated[at]
    if (allocated < 0).any():
        allocated = np.cumsum(nbytes)
        allocated = allocated - min(int(allocated.min()), 0)
    reserved = memory.total_reserved[at]
    # The CPU allocator reserves nothing ahead (its `Total Reserved` stays 0): no reserved series there.
    has_reserved = bool((reserved > 0).any())
    return DeviceMemory(memory.rows[at], memory.ts_us[at], nbytes, allocated, reserved if has_reserved else None, memory.addr[at])


class Blocks(msgspec.Struct, frozen=True):
    """Blocks allocated inside the trace: position (in `DeviceMemory` order) of each allocation and of
    its free (-1: never freed in the trace); `orphan_frees` counts frees of blocks allocated before it;
    `unrecorded`, per block, whether the trace lacks its free (its `free` is then the next allocation at
    its address, by which it was gone)."""

    alloc: np.ndarray
    free: np.ndarray
    orphan_frees: int
    unrecorded: np.ndarray

    def alive_at(self, position: int) -> np.ndarray:
        """Which blocks are allocated at or before `position` and not yet freed after it."""
        return (self.alloc <= position) & ((self.free > position) | (self.free < 0))


def pair_blocks(memory: DeviceMemory) -> Blocks:
    """Allocations paired with their frees by address (see the module docstring); none without
    addresses (traces before PyTorch 1.10), where the peak stays unattributed."""
    n = memory.nbytes.size
    position = np.arange(n)
    if not memory.has_addresses():  # nothing can be paired: no block is known
        return Blocks(position[:0], position[:0], 0, np.zeros(0, dtype=bool))
    order = np.argsort(memory.addr, kind="stable")  # by (address, position): ties keep time order
    addr, sign = memory.addr[order], np.sign(memory.nbytes[order])
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = addr[1:] == addr[:-1]
    is_alloc = sign > 0
    paired = is_alloc & same_next & np.r_[sign[1:] < 0, False]
    unrecorded = is_alloc & same_next & np.r_[is_alloc[1:], False]  # allocated again while still held
    freed_by = np.full(n, -1)
    freed_by[paired | unrecorded] = order[np.flatnonzero(paired | unrecorded) + 1]
    preceded = np.r_[False, paired[:-1]]  # a free right after its own allocation
    orphan = int(((sign < 0) & ~preceded).sum())
    alloc_sorted = np.flatnonzero(is_alloc)
    alloc, free = order[alloc_sorted], freed_by[alloc_sorted]
    back = np.argsort(alloc, kind="stable")
    return Blocks(alloc[back], free[back], orphan, unrecorded[alloc_sorted][back])


def counts_recorded_events_only(memory: DeviceMemory) -> bool:
    """Whether the allocated total moves only by the recorded events (each event's total is the one
    before plus its own bytes), as c10's CPU allocator counts; CUDA's caching allocator reports its own
    count, which also drops for frees the trace misses, so its totals jump there."""
    return bool(np.array_equal(memory.allocated_before[1:], memory.allocated[:-1]))


def without_unrecorded_frees(memory: DeviceMemory, blocks: Blocks) -> tuple[DeviceMemory, np.ndarray]:
    """`memory` with the allocated total less each block whose free the trace lacks, from the allocation
    that shows it gone on, and those frees' bytes per event position (zeros where none); only where the
    total counts recorded events only (elsewhere it already dropped, and nothing changes)."""
    gone = np.zeros(memory.nbytes.size, dtype=memory.allocated.dtype)
    if not blocks.unrecorded.any() or not counts_recorded_events_only(memory):
        return memory, gone
    np.add.at(gone, blocks.free[blocks.unrecorded], memory.nbytes[blocks.alloc[blocks.unrecorded]])
    return msgspec.structs.replace(memory, allocated=memory.allocated - np.cumsum(gone)), gone


def possibly_freed_unseen(memory: DeviceMemory, blocks: Blocks, collective: np.ndarray) -> np.ndarray:
    """Per block: never freed in the trace, yet maybe freed where the profiler does not record it: of a
    size whose free the trace lacked for another block (the same buffer, each step), or allocated inside
    a collective (`collective`: per block), whose backend may drop the last reference on its own thread
    (gloo's reduce-scatter clones its input; an FSDP2 run lost some of both kinds' frees each step)."""
    sizes = memory.nbytes[blocks.alloc]
    return (blocks.free < 0) & (np.isin(sizes, sizes[blocks.unrecorded]) | collective)


def without_blocks(memory: DeviceMemory, blocks: Blocks, taken: np.ndarray) -> np.ndarray:
    """The allocated total before each event and after the last (as `allocated_before`, one longer) less
    the blocks `taken` (per block), from their allocation on: as if they had never been allocated."""
    off = np.zeros(memory.nbytes.size, dtype=np.float64)
    off[blocks.alloc[taken]] = memory.nbytes[blocks.alloc[taken]]
    total = np.cumsum(off)
    return np.r_[memory.allocated_before - (total - off), memory.allocated[-1:] - total[-1:]]


def allocator_events(memory: MemoryEvents, at: np.ndarray) -> np.ndarray:
    """The positions of `at` (one device's events) that the device's allocator counts: the CPU device also
    carries shared-memory blocks (tensors received from DataLoader workers), reported with `Total
    Allocated` 0, which would read as the total dropping to 0 and back. Left out: every event at the
    address of an allocation reported with total 0 (none of a counting allocator's is), then the frees
    reported with total 0 that do not take the total before them to 0 (those of such blocks allocated
    before the trace)."""
    other = (memory.total_allocated[at] == 0) & (memory.nbytes[at] > 0)
    if other.any():
        at = at[~np.isin(memory.addr[at], memory.addr[at][other])]
    total, nbytes = memory.total_allocated[at], memory.nbytes[at]
    before = np.r_[-1, total[:-1]]
    stray = (total == 0) & (nbytes < 0) & (before != -nbytes)
    return at[~stray] if stray.any() else at


def is_collective_buffer_range(name: str) -> bool:
    """A range whose allocations a collective's backend may release on its own thread: the collective ops
    (`c10d::`, `nccl:`, `gloo:`), and FSDP2's all-gather and reduce-scatter ranges and ops (torch's
    `_fsdp_param_group.py` records `FSDP::all_gather (i)`, `FSDP::post_backward_reduce (i)`; `fsdp::` ops)."""
    return is_comm_op_name(name) or name.startswith(("FSDP::all_gather", "FSDP::post_backward_reduce", "fsdp::"))


def under_ranges(events: EventTable, tree: HostTree, rows: np.ndarray, predicate: Callable[[str], bool]) -> np.ndarray:
    """Per row (a host event, or -1): whether it or one of its ancestors is named by `predicate`; one
    step up the tree at a time for the rows still walking."""
    found = np.zeros(rows.size, dtype=bool)
    named = events.name_mask(predicate)
    walking = np.flatnonzero(rows >= 0)
    current = rows[walking]
    while walking.size:
        found[walking] |= named[current]
        current = tree.parent[current]
        keep = (current >= 0) & ~found[walking]
        walking, current = walking[keep], current[keep]
    return found


def enclosing_host_event(events: EventTable, tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """For each instant event in `rows`, the innermost CPU op on its thread that covers its time (-1:
    none). Allocations happen inside ops (`aten::empty` and the like); searching ops only, not every
    host event (Python calls are most of them with stacks on), keeps the sort small, and the walk up
    the tree from the op reaches the Python frames."""
    result = np.full(rows.size, -1, dtype=np.int64)
    host = events.kind_rows(Kind.CPU_OP)
    host = host[tree.depth[host] >= 0]
    if host.size == 0 or rows.size == 0:
        return result
    keys = _thread_key(events, np.r_[host, rows])
    host_key, row_key = keys[: host.size], keys[host.size :]
    order = tree_order(host_key, events.ts_us[host], events.dur_us[host])  # lexsort((-dur, ts, thread))
    host, host_key = host[order], host_key[order]
    host_ts = events.ts_us[host]
    row_ts = events.ts_us[rows]
    for key in distinct(row_key).tolist():  # one sorted search per thread
        lo, hi = np.searchsorted(host_key, key, "left"), np.searchsorted(host_key, key, "right")
        mine = np.flatnonzero(row_key == key)
        last = lo + np.searchsorted(host_ts[lo:hi], row_ts[mine], side="right") - 1
        result[mine] = np.where(last >= lo, host[np.maximum(last, 0)], -1)
    walking = np.flatnonzero(result >= 0)
    while walking.size:  # up the tree until the candidate is an op that still runs at the instant
        at = result[walking]
        ended = (events.ts_us[at] + events.dur_us[at] < row_ts[walking]) | (events.kind[at] != Kind.CPU_OP)
        walking = walking[ended]  # the others have their answer
        result[walking] = tree.parent[at[ended]]
        walking = walking[result[walking] >= 0]
    return result


def _thread_key(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """(pid, tid) as one int64 per row, equal for the same thread however it is written: older traces
    give memory events an integer tid and ops the same tid as a string (two different interned ids)."""
    return (_same_text(events, events.pid[rows]) << 32) | _same_text(events, events.tid[rows])


def _same_text(events: EventTable, ids: np.ndarray) -> np.ndarray:
    in_use = distinct(ids)
    first: dict[str, int] = {}
    same = [first.setdefault(events.strings[i], i) for i in in_use.tolist()]
    if same == in_use.tolist():  # every id its own text (the usual case): no lookup to go through
        return ids.astype(np.int64)
    lookup = np.zeros(int(in_use.max(initial=0)) + 1, dtype=np.int64)
    lookup[in_use] = same
    return lookup[ids]


class Owners(msgspec.Struct, frozen=True):
    """Per start event: the outermost CPU op below the user's frame (-1: none), the user's frame (-1:
    none) and the call that frame made (a module, else the outermost Python call below it; -1: none)."""

    op: np.ndarray
    frame: np.ndarray
    callee: np.ndarray


def owners(events: EventTable, tree: HostTree, start: np.ndarray, t_us: np.ndarray) -> Owners:
    """One walk up the call tree from each `start` event (running at `t_us`), stopping at the innermost
    user-code frame: the op the user called (`aten::ones`, not the `aten::empty` inside it) is the
    outermost op below that frame. Each level moves only the walks still going."""
    role = _roles(events)
    ts, dur, parent_of = events.ts_us, events.dur_us, tree.parent
    n = start.size
    op, frame = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    below, called_module = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    walking = np.flatnonzero(start >= 0)
    current = start[walking]
    while walking.size:
        kind, begin, t = role[current], ts[current], t_us[walking]
        # Whether the event runs at t (ancestors are checked too: a trace whose events overlap without
        # nesting can give an event a parent that ended before it).
        covers = (begin <= t) & (t <= begin + dur[current])
        hit = covers & ((kind & _USER) > 0)
        frame[walking[hit]] = current[hit]
        going = covers & ~hit
        for bit, last in ((_OP, op), (_PYTHON, below), (_MODULE, called_module)):  # the outermost so far
            seen = going & ((kind & bit) > 0)
            last[walking[seen]] = current[seen]
        parent = parent_of[current]
        keep = ~hit & (parent >= 0)
        walking, current = walking[keep], parent[keep]
    # The call the frame made: the module it called, else the outermost Python call below it.
    callee = np.where(frame >= 0, np.where(called_module >= 0, called_module, below), -1)
    return Owners(op, frame, callee)


# Bits of `_roles`.
_OP, _USER, _MODULE, _PYTHON = 1, 2, 4, 8


def _roles(events: EventTable) -> np.ndarray:
    """Per event, bits: an operator, a user-code Python frame, an `nn.Module: X` call, a Python call.
    Full-table name masks of named predicates: each predicate runs once per name, and cheaper than a
    mask over some rows, which sorts their names."""
    python = events.kind_mask(Kind.PYTHON_FUNCTION)
    op = events.kind_mask(Kind.CPU_OP) & events.name_mask(_is_operator_name)
    user, module = python & events.name_mask(is_user_frame), python & events.name_mask(is_module_call)
    return _bit(op, _OP) | _bit(python, _PYTHON) | _bit(user, _USER) | _bit(module, _MODULE)


def _bit(mask: np.ndarray, bit: int) -> np.ndarray:
    return mask.view(np.int8) * np.int8(bit)


def _is_operator_name(name: str) -> bool:
    """Older traces write record_function ranges (ProfilerStep#5, Optimizer.step#SGD.step,
    enumerate(DataLoader)#...) as ops too; no operator name holds a '#'."""
    return "#" not in name


def user_call_site(events: EventTable, found: Owners, roots: tuple[str, ...] = ()) -> tuple[np.ndarray, list[str]]:
    """The user's frame and the call it made, as (code per event, readable name per code, code 0 = ""):
    `train_step (train.py:42) > torch.ones`. From the Python-function events of `with_stack=True` (their
    line is the function's first line: PyTorch's tracer records calls, not lines, so the call made names
    the statement; where the user's source is found under `roots` or at the frame's absolute path and
    one statement of that function makes the call, its line: analysis/source_lines.py), else from the
    op's `Call stack` argument (older traces, which record lines)."""
    frame, callee, op = found.frame, found.callee, found.op
    # A pair of string ids per event: (frame, call made) names, else (0, the op's call stack); (0, 0): nothing.
    def name(rows: np.ndarray) -> np.ndarray:
        return events.name[np.maximum(rows, 0)].astype(np.int64)

    stack = events.call_stack[np.maximum(op, 0)].astype(np.int64)
    first = np.where(frame >= 0, name(frame), 0)
    second = np.where(frame >= 0, np.where(callee >= 0, name(callee), 0), -np.where(op >= 0, stack, 0))
    # Distinct pairs from codes over the string ids (small ints: grouped through a table, not sorted);
    # a pair's code is its rank among the pairs, as np.unique of the pairs would number them.
    firsts, first_code = group_ids(first)
    seconds, second_code = group_ids(second + len(events.strings))  # call stacks negative
    pairs, inverse = group_ids(first_code * seconds.size + second_code)
    first_ids, second_ids = firsts[pairs // seconds.size].tolist(), (seconds[pairs % seconds.size] - len(events.strings)).tolist()
    library = _LibraryLines()
    text = [_site_text(events.strings, a, b, roots, library) for a, b in zip(first_ids, second_ids)]
    names = [""] + sorted({t for t in text if t})
    index = {name: i for i, name in enumerate(names)}
    code_of = np.array([index[t] for t in text], dtype=np.int64)
    return code_of[inverse.reshape(-1)], names


def _callee_text(name: str) -> str:
    """The call the user's line made: a built-in (`torch.ones`), a module (`nn.Module: Linear_0`), a
    function of theirs with its place, or a library function by its name only (`backward`)."""
    if _FRAME.match(name) and is_library_code(name):
        return name.rsplit(": ", 1)[-1]
    return readable(name)


class _LibraryLines(dict[str, bool]):
    """`is_library_code` per `Call stack` line, judged once: the stacks of one trace share most of their
    lines (torch's own frames, the training loop's), and each judgement is a few regular expressions."""

    def __missing__(self, line: str) -> bool:
        self[line] = found = is_library_code(line)
        return found


def _site_text(strings: list[str], frame: int, second: int, roots: tuple[str, ...] = (), library: dict[str, bool] | None = None) -> str:
    if frame > 0 and second > 0:
        return f"{readable(frame_at_call(strings[frame], strings[second], roots))} > {_callee_text(strings[second])}"
    if frame > 0:
        return readable(strings[frame])
    library = _LibraryLines() if library is None else library
    for line in strings[-second].split(";") if second < 0 else ():
        if line.strip() and not library[line]:
            return readable(line.strip())
    return ""

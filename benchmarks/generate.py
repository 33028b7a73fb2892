"""Write realistic synthetic Kineto traces of a target size, for the benchmarks.

The traces look like what PyTorch 2.x's profiler writes for a GPT-style model trained with
`record_shapes=True, with_stack=True, profile_memory=True` under DDP/NCCL:

- per step a `ProfilerStep#N` user_annotation; data loading (`enumerate(DataLoader)#...`), a host-to-device
  copy, several micro-batches (gradient accumulation) of forward + backward through a 32-block model, an
  all-reduce per gradient bucket on the last micro-batch, an AdamW step of `_foreach_*` ops, and a
  `loss.item()` that synchronises with the device;
- nested `cpu_op` events with `Input Dims`/`Input type`/`Input Strides`/`Concrete Inputs`, `External id`,
  `Record function id`, `Sequence number` (no `Call stack`: PyTorch 2.x writes stacks as python_function);
- `python_function` events from `with_stack` (`train.py(61): train_step`, `torch/nn/modules/module.py(1747):
  _call_impl`, ...), with `Python id`/`Python parent id`;
- `cuda_runtime` `cudaLaunchKernel`/`cudaMemcpyAsync`/`cudaStreamSynchronize` with `correlation`, and the
  `kernel`/`gpu_memcpy` events they start, with Kineto's kernel args (grid, block, registers, shared memory,
  blocks/warps per SM, est. achieved occupancy), timed by a small simulation of two device streams;
- `ac2g` flows (ph s/f) from launch to kernel, `fwdbwd` flows from a forward op to its backward function;
- `[memory]` instant events (Addr, Bytes, Total Allocated, Total Reserved, Device Type, Device Id);
- process/thread metadata, the `Spans`/`Traces` bookkeeping events, and a header with `deviceProperties`,
  `distributedInfo` (rank, world_size, pg_config), `baseTimeNanoseconds` and `displayTimeUnit`.

Output is deterministic for a seed and rank, and streamed: events are formatted as strings one micro-batch
at a time and written, so generation memory stays small whatever the file size.

    python benchmarks/generate.py --case 500mb            # -> benchmarks/data/500mb/
    python benchmarks/generate.py --size-mb 120 --ranks 4 --out /tmp/traces
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

GENERATOR_VERSION = 1
DATA_DIR = Path(__file__).resolve().parent / "data"
MB = 1_000_000


@dataclass(frozen=True)
class Case:
    """A benchmark input: `ranks` files of about `size_mb` MB each, at least `steps` steps each."""

    name: str
    size_mb: int
    ranks: int
    steps: int


CASES: dict[str, Case] = {
    "50mb": Case("50mb", 50, 1, 5),
    "500mb": Case("500mb", 500, 1, 8),
    "2gb": Case("2gb", 2000, 1, 10),
    "ranks8": Case("ranks8", 50, 8, 5),
    "ranks64": Case("ranks64", 50, 64, 5),
}

# ----------------------------------------------------------------------------------------------------------
# The model: kernels and operators (names and args as Kineto records them on an A100/H100 with bf16).

HIDDEN, SEQ, FFN, HEADS, LAYERS, VOCAB = 4096, 2048, 16384, 32, 32, 50304
BF16 = 2

# kernel: (name, grid, block, registers per thread, shared memory, blocks per SM, warps per SM, occupancy %, base us)
_GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel"
_GEMM_NN = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_stage3_warpsize2x4x1_tensor16x8x16_kernel"
_GEMM_NT = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x32_stage3_warpsize4x2x1_tensor16x8x16_kernel"
_ELEM = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
         "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)")
_GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
         "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl("
         "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()"
         "() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)")
_GELU_BWD = _GELU.replace("GeluCUDAKernelImpl", "GeluBackwardCUDAKernelImpl").replace("Array<char*, 2>", "Array<char*, 3>")
_LN = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
       "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
_LN_BWD = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>("
           "c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
           "c10::BFloat16*, int)")
_FLASH = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
          "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, "
          "true, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)")
_FLASH_BWD = _FLASH.replace("flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel").replace("Flash_fwd", "Flash_bwd")
_REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<"
           "c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)"
           "::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4> >(at::native::ReduceOp<c10::BFloat16, "
           "at::native::func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::"
           "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4>)")
_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
            "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
_NLL = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
        "float*, float const*, long const*, float const*, bool, long, long, long, long)")
_FOREACH = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
            "TensorListMetadata<{n}>, at::native::(anonymous namespace)::{op}Functor<c10::BFloat16, {n}, 1, 0>, "
            "std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<{n}>, "
            "at::native::(anonymous namespace)::{op}Functor<c10::BFloat16, {n}, 1, 0>, std::multiplies<float>, float)")
_NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

K_GEMM = (_GEMM, "[32, 16, 1]", "[128, 1, 1]", 232, 98304, 0.474074, 1.896296, 4, 610.0)
K_GEMM_FC = (_GEMM_NN, "[128, 16, 1]", "[256, 1, 1]", 238, 147456, 1.896296, 15.17037, 12, 2350.0)
K_GEMM_BWD = (_GEMM_NT, "[16, 32, 1]", "[256, 1, 1]", 254, 131072, 0.474074, 3.792593, 6, 640.0)
K_ELEM = (_ELEM, "[65536, 1, 1]", "[128, 1, 1]", 26, 0, 606.814815, 2427.259259, 96, 92.0)
K_GELU = (_GELU, "[262144, 1, 1]", "[128, 1, 1]", 30, 0, 2427.259259, 9709.037037, 94, 330.0)
K_GELU_BWD = (_GELU_BWD, "[262144, 1, 1]", "[128, 1, 1]", 32, 0, 2427.259259, 9709.037037, 93, 410.0)
K_LN = (_LN, "[2048, 1, 1]", "[32, 4, 1]", 40, 0, 18.962963, 75.851852, 72, 44.0)
K_LN_BWD = (_LN_BWD, "[2048, 1, 1]", "[128, 1, 1]", 48, 0, 18.962963, 75.851852, 70, 71.0)
K_FLASH = (_FLASH, "[16, 32, 1]", "[128, 1, 1]", 255, 49152, 4.740741, 18.962963, 24, 1180.0)
K_FLASH_BWD = (_FLASH_BWD, "[16, 32, 1]", "[256, 1, 1]", 255, 98304, 4.740741, 37.925926, 23, 2900.0)
K_REDUCE = (_REDUCE, "[16, 32, 1]", "[32, 16, 1]", 32, 16, 4.740741, 75.851852, 60, 38.0)
K_SOFTMAX = (_SOFTMAX, "[2048, 1, 1]", "[1024, 1, 1]", 36, 4096, 18.962963, 606.814815, 88, 260.0)
K_NLL = (_NLL, "[1, 1, 1]", "[32, 1, 1]", 28, 1024, 0.009259, 0.009259, 1, 24.0)
K_NCCL = (_NCCL, "[8, 1, 1]", "[640, 1, 1]", 96, 24832, 0.074074, 1.481481, 2, 2400.0)


def _foreach(op: str, n: int) -> tuple:
    return (_FOREACH.format(op=op, n=n), "[320, 1, 1]", "[512, 1, 1]", 48, 0, 2.962963, 47.407407, 60, 55.0)


# An operator: (name, Input Dims, Input type, Input Strides, Concrete Inputs, kernels, children, cpu us, grad_fn,
# bytes allocated). Dims/types/strides/concrete are preformatted JSON text.
Op = tuple


def op(name: str, dims: str = "[]", types: str = "[]", strides: str = "[]", concrete: str = "[]",
       kernels: Sequence[tuple] = (), children: Sequence[Op] = (), cpu_us: float = 6.0, grad_fn: str = "",
       alloc: int = 0) -> Op:
    return (name, dims, types, strides, concrete, tuple(kernels), tuple(children), cpu_us, grad_fn, alloc)


_X = f"[1, {SEQ}, {HIDDEN}]"
_XS = f"[{SEQ * HIDDEN}, {HIDDEN}, 1]"


def _as_strided(dims: str) -> Op:
    return op("aten::as_strided", f"[{dims}, [], [], []]", '["c10::BFloat16", "ScalarList", "ScalarList", ""]',
              "[[], [], [], []]", '["", "", "", ""]', cpu_us=2.0)


def _linear(out_features: int, in_features: int, gemm: tuple) -> Op:
    w = f"[{out_features}, {in_features}]"
    t = op("aten::t", f"[{w}]", '["c10::BFloat16"]', f"[[{in_features}, 1]]", '[""]', cpu_us=3.0,
           children=[op("aten::transpose", f"[{w}, [], []]", '["c10::BFloat16", "Scalar", "Scalar"]',
                        f"[[{in_features}, 1], [], []]", '["", "0", "1"]', cpu_us=3.0,
                        children=[_as_strided(w)])])
    addmm = op("aten::addmm", f"[[{out_features}], [{SEQ}, {in_features}], [{in_features}, {out_features}], [], []]",
               '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]',
               f"[[1], [{in_features}, 1], [1, {in_features}], [], []]", '["", "", "", "1", "1"]',
               kernels=[gemm], cpu_us=14.0, grad_fn="AddmmBackward0", alloc=SEQ * out_features * BF16)
    view = op("aten::view", f"[[{SEQ}, {out_features}], []]", '["c10::BFloat16", "ScalarList"]',
              f"[[{out_features}, 1], []]", '["", ""]', cpu_us=2.5)
    return op("aten::linear", f"[{_X}, {w}, [{out_features}]]", '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]',
              f"[{_XS}, [{in_features}, 1], [1]]", '["", "", ""]', children=[t, addmm, view], cpu_us=5.0)


def _layer_norm() -> Op:
    native = op("aten::native_layer_norm", f"[{_X}, [], [{HIDDEN}], [{HIDDEN}], []]",
                '["c10::BFloat16", "ScalarList", "c10::BFloat16", "c10::BFloat16", "Double"]',
                f"[{_XS}, [], [1], [1], []]", '["", "", "", "", "1e-05"]', kernels=[K_LN], cpu_us=9.0,
                grad_fn="NativeLayerNormBackward0", alloc=SEQ * HIDDEN * BF16)
    return op("aten::layer_norm", f"[{_X}, [], [{HIDDEN}], [{HIDDEN}], [], []]",
              '["c10::BFloat16", "ScalarList", "c10::BFloat16", "c10::BFloat16", "Double", "Bool"]',
              f"[{_XS}, [], [1], [1], [], []]", '["", "", "", "", "1e-05", "True"]', children=[native], cpu_us=4.0)


def _add() -> Op:
    return op("aten::add", f"[{_X}, {_X}, []]", '["c10::BFloat16", "c10::BFloat16", "Scalar"]',
              f"[{_XS}, {_XS}, []]", '["", "", "1"]', kernels=[K_ELEM], cpu_us=8.0, grad_fn="AddBackward0",
              alloc=SEQ * HIDDEN * BF16)


def _attention() -> Op:
    q = f"[1, {HEADS}, {SEQ}, {HIDDEN // HEADS}]"
    flash = op("aten::_scaled_dot_product_flash_attention", f"[{q}, {q}, {q}, [], [], [], []]",
               '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Double", "Bool", "Bool", ""]',
               "[[], [], [], [], [], [], []]", '["", "", "", "0.", "True", "False", ""]',
               kernels=[K_FLASH], cpu_us=22.0, grad_fn="ScaledDotProductFlashAttentionBackward0",
               alloc=SEQ * HIDDEN * BF16)
    return op("aten::scaled_dot_product_attention", f"[{q}, {q}, {q}, [], [], [], [], []]",
              '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "Double", "Bool", "", "Bool"]',
              "[[], [], [], [], [], [], [], []]", '["", "", "", "", "0.", "True", "", "False"]',
              children=[flash], cpu_us=7.0)


def _split() -> Op:
    qkv = f"[1, {SEQ}, {3 * HIDDEN}]"
    narrow = op("aten::narrow", f"[{qkv}, [], [], []]", '["c10::BFloat16", "Scalar", "Scalar", "Scalar"]',
                "[[], [], [], []]", '["", "2", "0", "4096"]', cpu_us=3.0,
                children=[op("aten::slice", f"[{qkv}, [], [], [], []]", '["c10::BFloat16", "", "", "", ""]',
                             "[[], [], [], [], []]", '["", "", "", "", ""]', cpu_us=3.0, children=[_as_strided(qkv)])])
    return op("aten::split", f"[{qkv}, [], []]", '["c10::BFloat16", "Scalar", "Scalar"]', "[[], [], []]",
              '["", "4096", "2"]', children=[narrow, narrow, narrow], cpu_us=4.0)


# A module call: (python stack entries, operators). The python stack is what `with_stack` records around it.
_MODULE_CALL = ("torch/nn/modules/module.py(1736): _wrapped_call_impl", "torch/nn/modules/module.py(1747): _call_impl")
BLOCK: tuple[tuple[str, str, tuple[Op, ...]], ...] = (
    ("LayerNorm", "torch/nn/modules/normalization.py(217): forward", (_layer_norm(),)),
    ("Linear", "torch/nn/modules/linear.py(125): forward", (_linear(3 * HIDDEN, HIDDEN, K_GEMM),)),
    ("CausalSelfAttention", "model.py(74): forward", (_split(), _attention())),
    ("Linear", "torch/nn/modules/linear.py(125): forward", (_linear(HIDDEN, HIDDEN, K_GEMM),)),
    ("Residual", "model.py(101): forward", (_add(),)),
    ("LayerNorm", "torch/nn/modules/normalization.py(217): forward", (_layer_norm(),)),
    ("Linear", "torch/nn/modules/linear.py(125): forward", (_linear(FFN, HIDDEN, K_GEMM_FC),)),
    ("GELU", "torch/nn/modules/activation.py(734): forward",
     (op("aten::gelu", f"[[1, {SEQ}, {FFN}], []]", '["c10::BFloat16", "String"]', "[[], []]", '["", "none"]',
         kernels=[K_GELU], cpu_us=7.0, grad_fn="GeluBackward0", alloc=SEQ * FFN * BF16),)),
    ("Linear", "torch/nn/modules/linear.py(125): forward", (_linear(HIDDEN, FFN, K_GEMM_FC),)),
    ("Residual", "model.py(101): forward", (_add(),)),
)

_MM = op("aten::mm", f"[[{SEQ}, {HIDDEN}], [{HIDDEN}, {HIDDEN}]]", '["c10::BFloat16", "c10::BFloat16"]',
         f"[[{HIDDEN}, 1], [1, {HIDDEN}]]", '["", ""]', kernels=[K_GEMM_BWD], cpu_us=12.0, alloc=HIDDEN * HIDDEN * BF16)
BACKWARD: dict[str, tuple[Op, ...]] = {
    "AddmmBackward0": (op("aten::t", cpu_us=3.0), _MM, _MM,
                       op("aten::sum", f"[[{SEQ}, {HIDDEN}], [], [], []]", '["c10::BFloat16", "ScalarList", "Bool", ""]',
                          "[[], [], [], []]", '["", "", "True", ""]', kernels=[K_REDUCE], cpu_us=9.0)),
    "NativeLayerNormBackward0": (op("aten::native_layer_norm_backward", kernels=[K_LN_BWD, K_REDUCE], cpu_us=14.0),),
    "AddBackward0": (),
    "GeluBackward0": (op("aten::gelu_backward", kernels=[K_GELU_BWD], cpu_us=8.0),),
    "ScaledDotProductFlashAttentionBackward0": (op("aten::_scaled_dot_product_flash_attention_backward",
                                                   kernels=[K_FLASH_BWD], cpu_us=25.0),),
}
ACCUMULATE = op("torch::autograd::AccumulateGrad", cpu_us=4.0,
                children=[op("aten::add_", f"[[{HIDDEN}, {HIDDEN}], [{HIDDEN}, {HIDDEN}], []]",
                             '["c10::BFloat16", "c10::BFloat16", "Scalar"]', f"[[{HIDDEN}, 1], [{HIDDEN}, 1], []]",
                             '["", "", "1"]', kernels=[K_ELEM], cpu_us=7.0)])


def device_properties(count: int = 8) -> list[dict]:
    return [{"id": i, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85089730560, "computeMajor": 8,
             "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
             "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 108,
             "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 166912,
             "sharedMemPerMultiprocessor": 167936} for i in range(count)]


# ----------------------------------------------------------------------------------------------------------
# The simulation: a host clock per thread, a clock per device stream, ids as Kineto assigns them.


class TraceSim:
    """Simulates one rank's training steps and emits Kineto events as JSON text."""

    def __init__(self, rank: int, world_size: int, seed: int, emit: Callable[[list], None],
                 layers: int = LAYERS) -> None:
        self.layers = layers
        self.rng = random.Random(seed * 1_000_003 + rank)
        self.rank, self.world_size = rank, world_size
        self.pid = 2_910_000 + rank * 17
        self.main_tid, self.bwd_tid = self.pid, self.pid + 9_503
        self.emit = emit
        self.out: list = []
        self.cpu = 5_000_000_000.0 + rank * 3.7  # microseconds
        self.gpu = {7: self.cpu, 20: self.cpu}
        self.external = self.correlation = self.record = self.ev_idx = self.py_id = 0
        self.sequence = self.flow = 0
        self.allocated, self.reserved, self.next_addr = 18 << 30, 22 << 30, 0x7F3A_0000_0000
        self.live: list[tuple[int, int]] = []
        self.py_stack: list[int] = [0]
        self.fwd_flows: list[tuple[str, float, int]] = []  # (grad_fn, forward op ts, flow id)
        # rank-specific character: one slow data loader, one slower GPU (clock/thermal), to give analyses something.
        self.gpu_speed = 1.0 + (0.06 if world_size > 1 and rank == world_size - 1 else 0.0)
        self.loader_stall = rank == 1 or world_size == 1

    # -- primitives --------------------------------------------------------------------------------------
    def jitter(self, base: float, spread: float = 0.08) -> float:
        return base * (1.0 + spread * (2.0 * self.rng.random() - 1.0))

    def x_event(self, cat: str, name: str, ts: float, dur: float, tid: int, args: str) -> str:
        return (f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid}, "tid": {tid}, '
                f'"ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{{args}}}}}')

    def python(self, name: str, body: Callable[[], None], tid: int | None = None) -> None:
        """A python_function event around `body` (with_stack), written after the events inside it."""
        tid = self.main_tid if tid is None else tid
        self.py_id += 1
        my_id, parent = self.py_id, self.py_stack[-1]
        self.py_stack.append(my_id)
        start = self.cpu
        self.cpu += self.jitter(1.2)
        body()
        self.cpu += self.jitter(0.8)
        self.py_stack.pop()
        self.ev_idx += 1
        self.out.append(self.x_event("python_function", name, start, self.cpu - start, tid,
                                      f'"Python parent id": {parent}, "Python id": {my_id}, "Ev Idx": {self.ev_idx}'))

    def annotation(self, name: str, body: Callable[[], None], cat: str = "user_annotation",
                   tid: int | None = None) -> None:
        """A record_function range around `body`, written after the events inside it (so the writer can flush)."""
        tid = self.main_tid if tid is None else tid
        self.external += 1
        self.record += 1
        external, record = self.external, self.record
        start = self.cpu
        self.cpu += self.jitter(2.0)
        body()
        self.cpu += self.jitter(1.0)
        self.ev_idx += 1
        self.out.append(self.x_event(cat, name, start, self.cpu - start, tid,
                                     f'"External id": {external}, "Record function id": {record}, "Ev Idx": {self.ev_idx}'))

    def memory(self, nbytes: int, tid: int) -> None:
        if nbytes > 0:
            addr = self.next_addr
            self.next_addr += (nbytes + 511) & ~511
            self.live.append((addr, nbytes))
            self.allocated += nbytes
            if self.allocated > self.reserved:
                self.reserved = self.allocated + (2 << 30)
        else:
            if not self.live:
                return
            addr, size = self.live.pop(0)
            nbytes = -size
            self.allocated -= size
        self.ev_idx += 1
        self.out.append(
            f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": {self.pid}, "tid": {tid}, '
            f'"ts": {self.cpu:.3f}, "args": {{"Total Reserved": {self.reserved}, "Total Allocated": {self.allocated}, '
            f'"Bytes": {nbytes}, "Addr": {addr}, "Device Id": 0, "Device Type": 1, "Ev Idx": {self.ev_idx}}}}}')

    def launch(self, kernel: tuple, external: int, tid: int, stream: int = 7, after: float = 0.0) -> None:
        """cudaLaunchKernel on the host, the kernel on `stream`, and the ac2g flow between them."""
        name, grid, block, regs, smem, bps, wps, occ, base_us = kernel
        self.correlation += 1
        corr = self.correlation
        ts = self.cpu
        dur = self.jitter(5.5, 0.4)
        self.cpu += dur
        self.out.append(self.x_event("cuda_runtime", "cudaLaunchKernel", ts, dur, tid,
                                     f'"External id": {external}, "cbid": 211, "correlation": {corr}'))
        self.out.append(f'{{"ph": "s", "id": {corr}, "pid": {self.pid}, "tid": {tid}, "ts": {ts:.3f}, '
                        f'"cat": "ac2g", "name": "ac2g"}}')
        start = max(self.gpu[stream], ts + 4.0, after)
        kdur = self.jitter(base_us * self.gpu_speed, 0.05)
        self.gpu[stream] = start + kdur + 1.2
        self.out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream}, "ts": {start:.3f}, '
            f'"dur": {kdur:.3f}, "args": {{"External id": {external}, "queued": 0, "device": 0, "context": 1, '
            f'"stream": {stream}, "correlation": {corr}, "registers per thread": {regs}, "shared memory": {smem}, '
            f'"blocks per SM": {bps}, "warps per SM": {wps}, "grid": {grid}, "block": {block}, '
            f'"est. achieved occupancy %": {occ}}}}}')
        self.out.append(f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {start:.3f}, '
                        f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}')

    def memcpy(self, kind: str, nbytes: int, external: int, tid: int) -> None:
        self.correlation += 1
        corr = self.correlation
        ts = self.cpu
        dur = self.jitter(9.0, 0.3)
        self.cpu += dur
        self.out.append(self.x_event("cuda_runtime", "cudaMemcpyAsync", ts, dur, tid,
                                     f'"External id": {external}, "cbid": 41, "correlation": {corr}'))
        self.out.append(f'{{"ph": "s", "id": {corr}, "pid": {self.pid}, "tid": {tid}, "ts": {ts:.3f}, '
                        f'"cat": "ac2g", "name": "ac2g"}}')
        bandwidth = self.jitter(22.5 if kind == "HtoD" else 18.0, 0.1)
        start = max(self.gpu[7], ts + 5.0)
        cdur = nbytes / (bandwidth * 1e3)
        self.gpu[7] = start + cdur + 1.0
        label = "Memcpy HtoD (Pinned -> Device)" if kind == "HtoD" else "Memcpy DtoH (Device -> Pinned)"
        self.out.append(
            f'{{"ph": "X", "cat": "gpu_memcpy", "name": "{label}", "pid": 0, "tid": 7, "ts": {start:.3f}, '
            f'"dur": {cdur:.3f}, "args": {{"External id": {external}, "device": 0, "context": 1, "stream": 7, '
            f'"correlation": {corr}, "bytes": {nbytes}, "memory bandwidth (GB/s)": {bandwidth!r}}}}}')
        self.out.append(f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {start:.3f}, '
                        f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}')

    def sync(self, tid: int) -> None:
        self.correlation += 1
        ts = self.cpu
        done = max(self.gpu.values())
        dur = max(done - ts, 0.0) + self.jitter(6.0, 0.3)
        self.cpu += dur
        self.out.append(self.x_event("cuda_runtime", "cudaStreamSynchronize", ts, dur, tid,
                                     f'"External id": {self.external}, "cbid": 131, "correlation": {self.correlation}'))

    def cpu_op(self, spec: Op, tid: int, forward: bool = True) -> None:
        name, dims, types, strides, concrete, kernels, children, cpu_us, grad_fn, alloc = spec
        slot = len(self.out)
        self.out.append("")
        self.external += 1
        self.record += 1
        external, record = self.external, self.record
        start = self.cpu
        self.cpu += self.jitter(cpu_us * 0.5)
        if alloc:
            self.memory(alloc, tid)
        for child in children:
            self.cpu_op(child, tid, forward)
        for kernel in kernels:
            self.launch(kernel, external, tid)
        self.cpu += self.jitter(cpu_us * 0.5)
        self.ev_idx += 1
        seq = ""
        if grad_fn and forward:
            self.sequence += 1
            self.flow += 1
            self.fwd_flows.append((grad_fn, start, self.flow))
            self.out.append(f'{{"ph": "s", "id": {self.flow}, "pid": {self.pid}, "tid": {tid}, "ts": {start:.3f}, '
                            f'"cat": "fwdbwd", "name": "fwdbwd"}}')
            seq = f', "Sequence number": {self.sequence}, "Fwd thread id": 0'
        self.out[slot] = self.x_event(
            "cpu_op", name, start, self.cpu - start, tid,
            f'"External id": {external}, "Record function id": {record}, "Concrete Inputs": {concrete}, '
            f'"Input type": {types}, "Input Strides": {strides}, "Input Dims": {dims}, "Ev Idx": {self.ev_idx}{seq}')

    # -- model phases --------------------------------------------------------------------------------------
    def forward(self) -> None:
        tid = self.main_tid
        for layer in range(self.layers):
            def block(layer: int = layer) -> None:
                for module, where, ops in BLOCK:
                    def call(where: str = where, ops: tuple = ops) -> None:
                        def inner() -> None:
                            for spec in ops:
                                self.cpu_op(spec, tid)
                        self.python(where, inner)
                    self.python(_MODULE_CALL[0], lambda call=call, module=module: self.python(
                        _MODULE_CALL[1], lambda: self.python(f"nn.Module: {module}_{layer}", call)))
            self.python(_MODULE_CALL[0], lambda block=block: self.python(
                _MODULE_CALL[1], lambda: self.python(f"nn.Module: Block_{layer}", lambda: self.python(
                    "model.py(112): forward", block))))

    def loss(self) -> None:
        def body() -> None:
            self.cpu_op(op("aten::log_softmax", f"[[{SEQ}, {VOCAB}], [], []]", '["float", "Scalar", ""]',
                           "[[], [], []]", '["", "1", ""]', kernels=[K_SOFTMAX], cpu_us=10.0,
                           grad_fn="LogSoftmaxBackward0", alloc=SEQ * VOCAB * 4), self.main_tid)
            self.cpu_op(op("aten::nll_loss_nd", f"[[{SEQ}, {VOCAB}], [{SEQ}], [], [], []]",
                           '["float", "long int", "", "Scalar", "Scalar"]', "[[], [], [], [], []]",
                           '["", "", "", "1", "-100"]', kernels=[K_NLL], cpu_us=12.0, grad_fn="NllLossBackward0"),
                        self.main_tid)
        self.python("torch/nn/functional.py(3479): cross_entropy", body)

    def backward(self, allreduce: bool) -> None:
        """Autograd runs on its own thread while the main thread waits in `backward()`."""
        main_start = self.cpu
        tid = self.bwd_tid
        self.cpu += self.jitter(15.0)
        flows, self.fwd_flows = self.fwd_flows[::-1], []
        grads = 0
        for grad_fn, _fwd_ts, flow in flows:
            evaluate = op(f"autograd::engine::evaluate_function: {grad_fn}", cpu_us=4.0,
                          children=[op(grad_fn, cpu_us=5.0, children=BACKWARD.get(grad_fn, ()))])
            self.out.append(f'{{"ph": "f", "id": {flow}, "pid": {self.pid}, "tid": {tid}, "ts": {self.cpu:.3f}, '
                            f'"cat": "fwdbwd", "name": "fwdbwd", "bp": "e"}}')
            self.cpu_op(evaluate, tid, forward=False)
            self.memory(-1, tid)
            if grad_fn == "AddmmBackward0":
                self.cpu_op(op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", cpu_us=3.0,
                               children=[ACCUMULATE]), tid, forward=False)
                grads += 1
                if allreduce and grads % 8 == 0:
                    self.allreduce(tid)
        while self.live:  # activations and temporaries are gone once the pass is over
            self.memory(-1, tid)
        # The main thread's view: one python_function covering the whole backward pass.
        end = self.cpu
        self.py_id += 1
        self.ev_idx += 1
        self.out.append(self.x_event("python_function", "torch/_tensor.py(626): backward", main_start, end - main_start,
                                     self.main_tid, f'"Python parent id": {self.py_stack[-1]}, "Python id": {self.py_id}, '
                                     f'"Ev Idx": {self.ev_idx}'))
        self.cpu = end + self.jitter(3.0)

    def allreduce(self, tid: int) -> None:
        nelems = 8 * HIDDEN * HIDDEN
        comms = op("record_param_comms", cpu_us=10.0)

        def body() -> None:
            slot = len(self.out)
            self.cpu_op(comms, tid, forward=False)
            # record_param_comms carries the collective's description.
            self.out[slot] = self.out[slot].replace(
                '"Ev Idx"', f'"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": {nelems}, '
                f'"Out msg nelems": {nelems}, "Group size": {self.world_size}, "Process Group Name": "0", "Ev Idx"', 1)
            base = K_NCCL[:-1] + (K_NCCL[-1] * (1.0 + 0.15 * max(self.world_size.bit_length() - 1, 0)),)
            self.launch(base, self.external, tid, stream=20, after=self.gpu[7])
        self.annotation("nccl:all_reduce", body, tid=tid)

    def optimizer(self) -> None:
        def body() -> None:
            for foreach in ("mul_", "add_", "addcmul_", "lerp_", "sqrt", "div_", "addcdiv_"):
                n = 4 if foreach in ("addcmul_", "addcdiv_") else 2
                functor = {"mul_": "BinaryOpScalar", "add_": "BinaryOpList", "addcmul_": "PointwiseOpScalar",
                           "lerp_": "TernaryOp", "sqrt": "UnaryOp", "div_": "BinaryOpScalar",
                           "addcdiv_": "PointwiseOpScalarList"}[foreach]
                spec = op(f"aten::_foreach_{foreach}", "[[], []]", '["TensorList", "Scalar"]', "[[], []]",
                          '["", "0.9"]', kernels=[_foreach(functor, n)] * max(1, self.layers * 4 // 8), cpu_us=40.0)
                self.cpu_op(spec, self.main_tid)
        self.python("torch/optim/optimizer.py(487): wrapper",
                    lambda: self.annotation("Optimizer.step#AdamW.step", body))

    def data(self, stall: bool) -> None:
        def body() -> None:
            self.cpu += self.rng.uniform(25_000.0, 45_000.0) if stall else self.jitter(350.0, 0.3)
            for name in ("aten::stack", "aten::cat"):
                self.cpu_op(op(name, "[[], []]", '["TensorList", "Scalar"]', "[[], []]", '["", "0"]', cpu_us=35.0),
                            self.main_tid)
        self.python("torch/utils/data/dataloader.py(708): __next__", lambda: self.annotation(
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", body))
        nbytes = SEQ * 8 * 2

        def copy() -> None:
            self.external += 1
            self.memory(nbytes, self.main_tid)
            self.memcpy("HtoD", nbytes, self.external, self.main_tid)
        self.cpu_op(op("aten::to", cpu_us=4.0, children=[op("aten::_to_copy", cpu_us=4.0, children=[
            op("aten::copy_", "[[1, 2048], [1, 2048], []]", '["long int", "long int", "Bool"]', "[[2048, 1], [2048, 1], []]",
               '["", "", "True"]', cpu_us=5.0)])]), self.main_tid)
        copy()

    def step(self, number: int, microbatches: int) -> None:
        def body() -> None:
            def train_step() -> None:
                for mb in range(microbatches):
                    self.data(stall=self.loader_stall and mb == 0 and number % 3 == 1)
                    self.python("model.py(140): forward", self.forward)
                    self.loss()
                    self.flush()
                    self.backward(allreduce=self.world_size > 1 and mb == microbatches - 1)
                    self.flush()
                self.optimizer()
                self.python("torch/optim/optimizer.py(950): zero_grad",
                            lambda: self.annotation("Optimizer.zero_grad#AdamW.zero_grad", lambda: None))
                # loss.item(): copies the loss to the host and waits for the device.
                ext = self.external + 1

                def item() -> None:
                    self.memcpy("DtoH", 4, ext, self.main_tid)
                    self.sync(self.main_tid)
                self.cpu_op(op("aten::item", cpu_us=3.0, children=[op("aten::_local_scalar_dense", cpu_us=3.0)]),
                            self.main_tid)
                item()
            self.python("train.py(61): train_step", train_step)
        self.annotation(f"ProfilerStep#{number}", body)
        self.flush()

    def flush(self) -> None:
        if self.out:
            self.emit(self.out)
            self.out = []


def metadata_events(sim: TraceSim, end_ts: float) -> list[str]:
    pid, start = sim.pid, 5_000_000_000.0
    out = []

    def meta(name: str, p: object, t: object, args: str) -> None:
        out.append(f'{{"name": "{name}", "ph": "M", "ts": {start:.3f}, "pid": {p}, "tid": {t}, "args": {{{args}}}}}')
    meta("process_name", pid, 0, '"name": "python3.11"')
    meta("process_labels", pid, 0, '"labels": "CPU"')
    meta("process_sort_index", pid, 0, '"sort_index": 0')
    for tid, label in ((sim.main_tid, f"thread {sim.main_tid} (python3.11)"), (sim.bwd_tid, f"thread {sim.bwd_tid} (pt_autograd_0)")):
        meta("thread_name", pid, tid, f'"name": "{label}"')
        meta("thread_sort_index", pid, tid, f'"sort_index": {tid}')
    meta("process_name", 0, 0, '"name": "python3.11"')
    meta("process_labels", 0, 0, '"labels": "GPU 0"')
    meta("process_sort_index", 0, 0, '"sort_index": 16777216')
    for stream in (7, 20):
        meta("thread_name", 0, stream, f'"name": "stream {stream} "')
        meta("thread_sort_index", 0, stream, f'"sort_index": {stream}')
    out.append(f'{{"ph": "X", "cat": "Trace", "ts": {start:.3f}, "dur": {end_ts - start:.3f}, "pid": "Spans", '
               f'"tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {{"Op count": 0}}}}')
    out.append(f'{{"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", '
               f'"tid": "Trace PyTorch Profiler", "ts": {start:.3f}}}')
    out.append(f'{{"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": {end_ts:.3f}}}')
    return out


def header(rank: int, world_size: int) -> dict:
    return {
        "schemaVersion": 1,
        "deviceProperties": device_properties(),
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": world_size, "ranks": list(range(world_size))}],
                            "nccl_version": "2.21.5"},
        "record_shapes": 1,
        "profile_memory": 1,
        "with_stack": 1,
        "trace_id": f"{0x5EED0000 + rank:016X}",
    }


def simulate(rank: int, world_size: int, steps: int, microbatches: int, seed: int,
             emit: Callable[[list], None], layers: int = LAYERS) -> TraceSim:
    sim = TraceSim(rank, world_size, seed, emit, layers)
    for number in range(steps):
        sim.step(number + 1, microbatches)
    return sim


def _count_bytes(rank: int, world_size: int, steps: int, microbatches: int, seed: int, layers: int) -> int:
    total = 0

    def emit(chunk: list) -> None:
        nonlocal total
        total += sum(map(len, chunk)) + 2 * len(chunk)
    simulate(rank, world_size, steps, microbatches, seed, emit, layers)
    return total


def plan(size_bytes: int, world_size: int, min_steps: int, seed: int) -> tuple[int, int, int]:
    """(steps, micro-batches per step, model layers) that bring one file closest to `size_bytes`, with at
    least `min_steps` steps (a linear size model fitted on small probes). Layers shrink only for files too
    small to hold `min_steps` steps of one micro-batch of the full model."""
    one = _count_bytes(0, world_size, 1, 1, seed, LAYERS)
    two = _count_bytes(0, world_size, 1, 2, seed, LAYERS)
    per_mb, fixed = two - one, 2 * one - two
    if min_steps * one > 1.2 * size_bytes:
        small = _count_bytes(0, world_size, 1, 1, seed, 1)
        per_layer = (one - small) / (LAYERS - 1)
        layers = max(1, min(LAYERS, round((size_bytes / min_steps - small) / per_layer) + 1))
        return min_steps, 1, layers
    best: tuple[float, int, int] | None = None
    for steps in range(min_steps, 2 * min_steps + 1):
        mb = max(1, round((size_bytes / steps - fixed) / per_mb))
        error = abs(steps * (fixed + mb * per_mb) - size_bytes)
        if best is None or error < best[0]:
            best = (error, steps, mb)
    assert best is not None
    return best[1], best[2], LAYERS


def write_trace(path: Path, rank: int, world_size: int, steps: int, microbatches: int, seed: int,
                layers: int = LAYERS) -> int:
    """Stream one rank's trace to `path` (written to a temporary name, then renamed). Returns its size."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", buffering=8 << 20) as handle:
        head = json.dumps(header(rank, world_size))
        handle.write(head[:-1] + ', "traceEvents": [\n')
        first = True

        def emit(chunk: list) -> None:
            nonlocal first
            text = ",\n".join(chunk)
            handle.write(text if first else ",\n" + text)
            first = False
        sim = simulate(rank, world_size, steps, microbatches, seed, emit, layers)
        end_ts = max(sim.cpu, *sim.gpu.values()) + 10.0
        emit(metadata_events(sim, end_ts))
        handle.write('\n], "traceName": "%s", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}\n'
                     % f"/tmp/rank{rank}.pt.trace.json")
    os.replace(tmp, path)
    return path.stat().st_size


def trace_name(rank: int) -> str:
    return f"rank{rank}.1700000000000.pt.trace.json"


def _write_one(args: tuple) -> int:
    return write_trace(*args)


def generate(out_dir: Path, size_mb: int, ranks: int, steps: int, seed: int = 0, jobs: int = 2,
             force: bool = False, quiet: bool = False) -> list[Path]:
    """Generate (or reuse, when the parameters match) a trace set in `out_dir`. Returns the trace paths."""
    params = {"generator": GENERATOR_VERSION, "size_mb": size_mb, "ranks": ranks, "steps": steps, "seed": seed}
    stamp = out_dir / ".generated.json"
    paths = [out_dir / trace_name(r) for r in range(ranks)]
    if not force and stamp.is_file() and all(p.is_file() for p in paths):
        try:
            if json.loads(stamp.read_text()).get("params") == params:
                return paths
        except (OSError, ValueError):
            pass
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.json*"):
        stale.unlink()
    started = time.perf_counter()
    steps, microbatches, layers = plan(size_mb * MB, ranks, steps, seed)
    tasks = [(p, r, ranks, steps, microbatches, seed, layers) for r, p in enumerate(paths)]
    if jobs > 1 and ranks > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, ranks)) as pool:
            sizes = list(pool.map(_write_one, tasks))
    else:
        sizes = [_write_one(t) for t in tasks]
    elapsed = time.perf_counter() - started
    stamp.write_text(json.dumps({"params": params, "steps": steps, "microbatches": microbatches, "layers": layers, "bytes": sizes,
                                 "seconds": round(elapsed, 2)}, indent=1))
    if not quiet:
        print(f"generated {out_dir}: {ranks} file(s), {sum(sizes) / MB:,.0f} MB, {steps} steps x {microbatches} "
              f"micro-batches x {layers} layers, in {elapsed:.1f} s", file=sys.stderr)
    return paths


def generate_case(name: str, data_dir: Path = DATA_DIR, force: bool = False, jobs: int = 2) -> list[Path]:
    case = CASES[name]
    return generate(data_dir / case.name, case.size_mb, case.ranks, case.steps, jobs=jobs, force=force)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="a preset (repeatable)")
    parser.add_argument("--size-mb", type=int, help="custom: approximate size of each file in MB")
    parser.add_argument("--ranks", type=int, default=1, help="custom: number of rank files")
    parser.add_argument("--steps", type=int, default=5, help="custom: at least this many profiled steps per file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="custom: output directory")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where presets go")
    parser.add_argument("--jobs", type=int, default=2, help="processes for rank sets")
    parser.add_argument("--force", action="store_true", help="regenerate even when up to date")
    args = parser.parse_args(argv)
    if args.size_mb:
        if not args.out:
            parser.error("--size-mb needs --out")
        generate(args.out, args.size_mb, args.ranks, args.steps, args.seed, args.jobs, args.force)
    for name in args.case or []:
        case = CASES[name]
        generate(args.data_dir / case.name, case.size_mb, case.ranks, case.steps, args.seed, args.jobs, args.force)
    if not args.size_mb and not args.case:
        parser.error("give --case NAME or --size-mb N --out DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())

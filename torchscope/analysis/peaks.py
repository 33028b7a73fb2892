"""Peak dense math throughput of common GPUs, by the name the trace's `deviceProperties` gives.

Figures in TFLOP/s, without sparsity, from the vendors' datasheets (status U: recalled from the
datasheets, not re-read here): NVIDIA V100 SXM2 (FP32 15.7, FP16 tensor 125), T4 (8.1, 65), A10 (31.2,
125), A100 (FP32 19.5, TF32 156, BF16/FP16 312), L4 (30.3, 121), H100 SXM and H200 (FP32 67, TF32 494.7,
BF16 989.4), H100 PCIe (51.2, 378, 756); AMD MI250 (FP32 45.3, FP16 362.1), MI250X (47.9, 383). A
datasheet peak is a ceiling no real kernel reaches: 60-80 % of it is good for a large GEMM.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class Peak(NamedTuple):
    fp32_tflops: float
    tensor_tflops: float  # the fastest dense tensor-core rate (FP16/BF16)


# Longest names first, so "H100 PCIe" is matched before "H100".
GPU_PEAKS: tuple[tuple[str, Peak], ...] = (
    ("H100 PCIe", Peak(51.2, 756.0)),
    ("MI250X", Peak(47.9, 383.0)),
    ("MI250", Peak(45.3, 362.1)),
    ("H100", Peak(67.0, 989.4)),
    ("H200", Peak(67.0, 989.4)),
    ("A100", Peak(19.5, 312.0)),
    ("V100", Peak(15.7, 125.0)),
    ("A10", Peak(31.2, 125.0)),
    ("L4", Peak(30.3, 121.0)),
    ("T4", Peak(8.1, 65.0)),
)


def gpu_peak(device_name: str) -> Optional[Peak]:
    """The peak of a GPU by its reported name (e.g. "Tesla V100-DGXS-32GB"); None when not in the table."""
    for key, peak in GPU_PEAKS:
        if key.lower() in device_name.lower():
            return peak
    return None

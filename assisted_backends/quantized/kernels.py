"""PyTorch's CPU weight-only kernels: what this build has, what they compute, what they accept.

Two ATen ops, both y = x Wᵀ with W [N, K] held in few bits (x [M, K], y [M, N]):

``aten._weight_int8pack_mm(x, q, s)``
    q int8 [N, K], s [N] (one scale per output row), x, s and y of one dtype.
    Computes y[m, n] = Σ_k x[m, k] · fp32(q[n, k] · s[n]) in fp32 and rounds y to x's dtype.
    The product q · s is exact in fp32 for bf16 scales (8 + 8 significant bits).
    K must be a multiple of 16: the vector loop steps 16 (AVX-512) or 8 (AVX2) columns at a time
    and reads past the row otherwise (garbage or a crash), so `int8_supported` refuses such widths.
    Its loads of x and q are aligned loads: both must start on a 32-byte boundary (`aligned`);
    a misaligned tensor read from a file crashed the process here (general protection fault).

``aten._weight_int4pack_mm_for_cpu(x, packed, g, sz)``
    packed: the codes q ∈ [0, 15] of W [N, K] in the layout ``_convert_weight_to_int4pack_for_cpu``
    makes from int32 codes [N, K] (uint8 [N, K/2]; the byte order depends on the CPU capability
    the op dispatches to, see `int4_layout`). sz [K/g, N, 2] holds, per group of g columns and row,
    a scale s and a zero z, in x's dtype. g ∈ {32, 64, 128, 256}; N a multiple of 16; g divides K.
    Dequantization (verified numerically by `check_int4_formula`):

        w[n, k] = (q[n, k] − 8) · s[k // g, n] + z[k // g, n]      (one fp32 fused multiply-add)

    then y[m, n] = Σ_k x[m, k] · w[n, k] in fp32, rounded to x's dtype. With bf16 or fp32 scales
    (q − 8) · s is exact in fp32 (4 + 8 or 4 + 24 bits would not be: for fp32 scales the product can
    round; `dequantize_int4` evaluates the fma in float64 and rounds once, which matches).

Activation dtypes: both ops accept bf16, fp16 and fp32 (x, scales and output share it). Only bf16
has vectorised AVX-512/AVX2 micro-kernels; fp16 and fp32 fall to a scalar loop that measured 15-30x
slower here (576x1536, 1 thread). bf16 is the compute dtype for speed; fp32 is the exact reference
(fp32 scales carry fp16/fp32 block scales without rounding).

Batch invariance: both ops tile M by 4 rows and give each row its own fp32 accumulators and its own
k order, so row m of an M-row call should equal that row computed alone. `batch_invariance` measures
it; tests/quantized/test_quantized_kernels.py asserts it for M = 1..16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_ROW_MULTIPLE = 16  # the int4 packer and kernel need N % 16 == 0
INT8_COLUMN_MULTIPLE = 16  # the int8 kernel reads 16 columns per step (AVX-512)
FAST_DTYPE = torch.bfloat16
EXACT_DTYPE = torch.float32


@dataclass(frozen=True)
class KernelAvailability:
    """Which weight-only ops this torch build registers, with the capability ATen dispatches to."""

    int8pack_mm: bool
    int4pack_mm: bool
    int4pack_convert: bool
    cpu_capability: str
    torch_version: str

    @property
    def int4(self) -> bool:
        return self.int4pack_mm and self.int4pack_convert

    def missing(self, scheme: str) -> str:
        """'' when `scheme` ("int8" | "int4") can run, else the reason in one sentence."""
        if scheme == "int8" and not self.int8pack_mm:
            return f"torch {self.torch_version} has no aten._weight_int8pack_mm (needs torch >= 2.4)"
        if scheme == "int4" and not self.int4:
            return (
                f"torch {self.torch_version} has no aten._weight_int4pack_mm_for_cpu / "
                "_convert_weight_to_int4pack_for_cpu (needs torch >= 2.5)"
            )
        return ""


def available() -> KernelAvailability:
    """Probe the op registry (no kernel runs)."""
    ops = torch.ops.aten
    return KernelAvailability(
        int8pack_mm=hasattr(ops, "_weight_int8pack_mm"),
        int4pack_mm=hasattr(ops, "_weight_int4pack_mm_for_cpu"),
        int4pack_convert=hasattr(ops, "_convert_weight_to_int4pack_for_cpu"),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch_version=torch.__version__,
    )


def int8_supported(in_features: int) -> bool:
    """The int8 kernel reads whole 16-column vectors: K must be a positive multiple of 16."""
    return in_features > 0 and in_features % INT8_COLUMN_MULTIPLE == 0


def int4_supported(out_features: int, in_features: int, group_size: int) -> bool:
    """N % 16 == 0, g ∈ {32, 64, 128, 256} and g | K."""
    return (
        out_features > 0
        and out_features % INT4_ROW_MULTIPLE == 0
        and group_size in INT4_GROUP_SIZES
        and in_features > 0
        and in_features % group_size == 0
    )


def aligned(tensor: torch.Tensor, alignment: int = 64) -> torch.Tensor:
    """`tensor` itself if contiguous and its data `alignment`-byte aligned, else an aligned copy.

    The int8 kernel reads weights and activations with aligned vector loads (16 / 32 bytes) and
    faults on anything else; tensors from a file (safetensors, memmap) can sit at any offset.
    """
    if tensor.is_contiguous() and tensor.data_ptr() % alignment == 0:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def int8_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """y [M, N] = x [M, K] · (codes [N, K] int8 · scales [N])ᵀ, in x's dtype (scales share it)."""
    return torch.ops.aten._weight_int8pack_mm(x, codes, scales)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, scale_zeros: torch.Tensor) -> torch.Tensor:
    """y [M, N] = x [M, K] · Wᵀ with W = (q − 8)·s + z group-wise; scale_zeros [K/g, N, 2] in x's dtype."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scale_zeros)


def pack_int4_codes(codes: torch.Tensor, rows_per_chunk: int = 8192) -> torch.Tensor:
    """Codes [N, K] in [0, 15] (any integer dtype) -> the int4 kernel's packed uint8 [N, K/2].

    The packer wants int32 [N, K] (4 bytes a code); converting in chunks of rows (a multiple of the
    64-row blocks the layout is made of) bounds that temporary. Chunks concatenate along N because
    every row block's bytes are contiguous (N-major blocks, see `int4_layout`).
    """
    n = codes.shape[0]
    assert rows_per_chunk % 64 == 0
    if n <= rows_per_chunk:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    parts = [
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[start : start + rows_per_chunk].to(torch.int32), 1)
        for start in range(0, n, rows_per_chunk)
    ]
    return torch.cat(parts, dim=0)


def scale_zeros_tensor(scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-row group scales and zeros [N, G] (already in `dtype`'s values) -> the kernel's [G, N, 2]."""
    return torch.stack([scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The kernel's fp32 weights: fp32((q − 8)·s + z) rounded once (fma). codes [R, K]; scales, zeros [R, K/g]."""
    s = scales.double().repeat_interleave(group_size, dim=-1)
    z = zeros.double().repeat_interleave(group_size, dim=-1)
    return ((codes.double() - 8.0) * s + z).float()


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The kernel's fp32 weights: codes [R, K] int8 times scales [R] (exact for bf16 scales)."""
    return (codes.double() * scales.double()[:, None]).float()


def check_int4_formula(dtype: torch.dtype = torch.float32, seed: int = 0) -> float:
    """Largest |kernel − reference| / max|reference| for w = (q − 8)·s + z on a random 64x128 weight.

    With fp32 activations the kernel's sum over k is exact here (x = identity picks single weights),
    so the return value is 0.0 exactly when the formula above is the kernel's.
    """
    generator = torch.Generator().manual_seed(seed)
    n, k, group = 64, 128, 32
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32)
    scales = (torch.rand(n, k // group, generator=generator) + 0.1).to(dtype)
    zeros = torch.randn(n, k // group, generator=generator).to(dtype)
    packed = pack_int4_codes(codes)
    extracted = int4_mm(torch.eye(k, dtype=dtype), packed, group, scale_zeros_tensor(scales, zeros, dtype)).t()
    reference = dequantize_int4(codes, scales.float(), zeros.float(), group).to(dtype)
    return ((extracted.float() - reference.float()).abs().max() / reference.float().abs().max()).item()


def batch_invariance(fn, x: torch.Tensor, max_rows: int = 16) -> dict[int, bool]:
    """For M = 1..max_rows: does every row of fn(x[:M]) equal fn(x[m:m+1]) bit for bit?

    `fn` maps [M, K] -> [M, N]; x has at least max_rows rows. NaNs compare equal to themselves.
    """
    alone = torch.cat([fn(x[m : m + 1].contiguous()) for m in range(max_rows)])
    return {rows: same_bits(fn(x[:rows].contiguous()), alone[:rows]) for rows in range(1, max_rows + 1)}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors of one floating dtype (NaN == NaN, -0 != +0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int)))

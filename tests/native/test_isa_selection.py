"""Which kernel path runs on which CPU: each instruction set checked on its own flags, never a ladder.

The flag sets are those /proc/cpuinfo reports on the CPUs the package meets; the Python rule (`paths_for`) and
the C++ one (`block_cpu_paths`, what `block_linear` obeys) are both asked, and must agree with the table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from assisted_backends.native import extension

BASE = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
AMX = {"amx_tile", "amx_int8", "amx_bf16"}
#: CPU kind -> (its ISA flags, the paths it runs, the path chosen when none is forced)
CPUS = {
    "Sandy Bridge (AVX only)": ({"sse4_2", "avx"}, ["scalar"], "scalar"),
    "Zen 3 (AVX2 only)": (BASE, ["scalar", "avx2"], "avx2"),
    "Skylake-X (AVX-512 without VNNI)": (BASE | AVX512, ["scalar", "avx2"], "avx2"),
    "Cascade Lake (AVX-512 VNNI, no AVX-VNNI)": (BASE | AVX512 | {"avx512_vnni"},
                                                 ["scalar", "avx2", "avx512vnni", "amxmodel"], "avx512vnni"),
    "Ice Lake server": (BASE | AVX512 | {"avx512_vnni", "avx512_vbmi", "gfni"},
                        ["scalar", "avx2", "avx512vnni", "amxmodel"], "avx512vnni"),
    "Zen 4 (AVX-512 VNNI, no AVX-VNNI)": (BASE | AVX512 | {"avx512_vnni", "avx512_bf16"},
                                          ["scalar", "avx2", "avx512vnni", "amxmodel"], "avx512vnni"),
    "Alder Lake (AVX-VNNI, no AVX-512)": (BASE | {"avx_vnni"}, ["scalar", "avx2", "avxvnni"], "avxvnni"),
    "Zen 5 (both VNNI)": (BASE | AVX512 | {"avx512_vnni", "avx_vnni", "avx512_bf16"},
                          ["scalar", "avx2", "avxvnni", "avx512vnni", "amxmodel"], "avx512vnni"),
    "Sapphire Rapids (AMX, both VNNI)": (BASE | AVX512 | AMX | {"avx512_vnni", "avx_vnni", "avx512_bf16"},
                                         ["scalar", "avx2", "avxvnni", "avx512vnni", "amx", "amxmodel"], "avx512vnni"),
    "Granite Rapids (AMX, both VNNI)": (BASE | AVX512 | AMX | {"amx_fp16", "avx512_vnni", "avx_vnni"},
                                        ["scalar", "avx2", "avxvnni", "avx512vnni", "amx", "amxmodel"], "avx512vnni"),
    "AMX tiles without AVX-512 VNNI (no such CPU: the AMX path needs the AVX-512 tile)": (
        BASE | AMX | {"avx_vnni"}, ["scalar", "avx2", "avxvnni"], "avxvnni"),
    "AVX2 without F16C (no vector path)": ({"avx", "avx2", "fma"}, ["scalar"], "scalar"),
}  # fmt: skip
needs_kernels = pytest.mark.skipif(not extension.available(), reason=extension.status().reason or "no kernels")


@pytest.mark.parametrize("cpu", CPUS)
def test_python_picks_each_path_on_its_own_flags(cpu):
    flags, paths, best = CPUS[cpu]
    assert extension.paths_for(flags) == paths
    assert extension.best_for(flags) == best


@needs_kernels
@pytest.mark.parametrize("cpu", CPUS)
def test_the_cpp_side_agrees(cpu):
    flags, paths, _ = CPUS[cpu]
    mask = int(torch.ops.assisted_backends.block_cpu_paths(extension.feature_mask(flags)))
    assert [name for bit, name in enumerate(extension.ISA_NAMES) if mask >> bit & 1] == paths


@needs_kernels
def test_cpuid_agrees_with_proc_cpuinfo_here():
    flags = extension._cpu_flags()
    assert extension.runnable_isas() == extension.paths_for(flags)
    assert extension.status().isa == extension.best_for(flags)
    features = int(torch.ops.assisted_backends.block_cpu_features())
    assert features == extension.feature_mask(flags & set(extension.FEATURES))


def _missing_paths() -> list[str]:
    return [name for name in extension.ISA_NAMES if name not in extension.runnable_isas()]


@needs_kernels
def test_a_path_this_cpu_lacks_is_an_error_in_the_op():
    from assisted_backends.quantized import blocks

    missing = _missing_paths()
    if not missing:
        pytest.skip("this CPU runs every path")
    weight = blocks.from_float(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)), 4)
    x = torch.randn(2, 64)
    for name in missing:
        with pytest.raises(RuntimeError, match=f"does not run the {name} path"):
            weight.matmul(x, extension.ISA_NAMES.index(name))


@needs_kernels
def test_forcing_a_path_this_cpu_lacks_is_a_one_line_error_not_a_crash(tmp_path):
    missing = _missing_paths()
    if not missing:
        pytest.skip("this CPU runs every path")
    script = textwrap.dedent(
        """
        import torch
        from assisted_backends.quantized import blocks
        weight = blocks.from_float(torch.randn(32, 64), 4)
        print(weight.matmul(torch.randn(2, 64)).shape)
        """
    )
    env = {**os.environ, extension.ISA_VARIABLE: missing[-1]}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # not 132 (SIGILL)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and f"does not run the {missing[-1]} path" in last

"""Every .cu file of labkit.cuda compiles with plain nvcc, for Hopper and an older GPU.

Plain CUDA compiles in seconds, so this runs anywhere nvcc is installed, GPU or not.
(The torch binding is compiled by `labkit.cuda.build()` on a GPU machine, not here: it takes minutes.)
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from labkit import cuda
from labkit.kernels.cluster import rtc

NVCC = shutil.which("nvcc")
# Hopper (H100/H200) and Turing (T4, the oldest GPU nvcc 13 still targets).
TARGETS = ["arch=compute_90,code=sm_90", "arch=compute_75,code=sm_75"]

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA compiler) is not on PATH")


@needs_nvcc
@pytest.mark.parametrize("source", cuda.KERNEL_FILES)
def test_cu_file_compiles(source, tmp_path):
    gencode = [flag for target in TARGETS for flag in ("-gencode", target)]
    obj = tmp_path / "k.o"
    cmd = [NVCC, "-c", "-O3", "-std=c++17", "--Werror", "all-warnings", *gencode,
           "-I", str(cuda.SOURCE_DIR), str(cuda.SOURCE_DIR / source), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{done.stderr}{done.stdout}"
    cuobjdump = Path(NVCC).resolve().parent / "cuobjdump"
    if cuobjdump.exists():  # the object holds machine code for both GPUs
        listing = subprocess.run([str(cuobjdump), "--list-elf", str(obj)], capture_output=True, text=True).stdout
        assert "sm_90" in listing and "sm_75" in listing, listing


RTC_BUILDS = [("softmax_cluster.cu", {"CLUSTER": 2, "THREADS": 512, "VECS": 8, "SVECS": 0}),
              ("softmax_cluster.cu", {"CLUSTER": 16, "THREADS": 256, "VECS": 8, "SVECS": 0}),
              ("softmax_cluster.cu", {"CLUSTER": 1, "THREADS": 512, "VECS": 8, "SVECS": 8}),
              ("softmax_cluster.cu", {"CLUSTER": 16, "THREADS": 512, "VECS": 8, "SVECS": 8}),
              ("layer_norm_bwd_cluster.cu", {"CLUSTER": 4, "THREADS": 256, "VECS": 4, "STAGES": 4}),
              ("layer_norm_bwd_cluster.cu", {"CLUSTER": 16, "THREADS": 512, "VECS": 2, "STAGES": 4})]


@needs_nvcc
@pytest.mark.parametrize("elem", [0, 1, 2], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("source, defines", RTC_BUILDS, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{n}" for k, n in v.items()))
def test_cluster_kernels_compile_for_hopper(source, defines, elem, tmp_path):
    """The run-time (NVRTC) kernels, with defines labkit's kernels pass, compile for Hopper without warnings
    or register spills (they keep their chunks of rows in registers, and rows in flight in shared memory);
    softmax's within the registers that let two of its largest blocks share an SM."""
    cmd = [NVCC, "-c", "-O3", "-std=c++17", "--Werror", "all-warnings", "-gencode", TARGETS[0], "-Xptxas", "-v",
           "-I", str(rtc.SOURCE_DIR), f"-DELEM={elem}", *(f"-D{k}={v}" for k, v in defines.items()),
           str(rtc.SOURCE_DIR / source), "-o", str(tmp_path / "k.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{done.stderr}{done.stdout}"
    assert "0 bytes spill stores" in done.stdout + done.stderr, done.stdout + done.stderr
    if source == "softmax_cluster.cu":  # 64 registers a thread: two blocks of 512 threads fit an SM's 65536
        used = [int(n) for n in re.findall(r"Used (\d+) registers", done.stdout + done.stderr)]
        assert used and max(used) <= 64, used


@needs_nvcc
def test_a_broken_kernel_fails_to_compile(tmp_path):
    """The check above can fail: a kernel calling an undeclared function does not compile."""
    bad = tmp_path / "bad.cu"
    bad.write_text(cuda.sources("vector_add.cu").replace("x[i] + y[i]", "x[i] + no_such_function(y[i])"))
    cmd = [NVCC, "-c", "-gencode", TARGETS[0], "-I", str(cuda.SOURCE_DIR), str(bad), "-o",
           str(tmp_path / "bad.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "no_such_function" in done.stderr


def test_every_launcher_is_declared_defined_and_bound():
    """Each launcher in the header is defined in a .cu file, and the binding calls it."""
    header = cuda.sources(cuda.HEADER)
    kernels = "".join(cuda.sources(f) for f in cuda.KERNEL_FILES)
    binding = cuda.sources(cuda.BINDING)
    launchers = set(re.findall(r"cudaError_t (launch_\w+)\(", header))
    assert launchers >= {"launch_vector_add", "launch_matmul_naive", "launch_matmul_tiled", "launch_block_sum"}
    for name in launchers:
        assert f"cudaError_t {name}(" in kernels, f"{name} is declared but not defined"
        assert f"labkit::{name}(" in binding, f"{name} is not called from binding.cpp"
    for name in ("vector_add", "matmul_naive", "matmul_tiled", "block_sum"):
        assert f'm.def("{name}"' in binding


def test_each_launch_is_checked():
    """Every kernel launch (<<<...>>>) is followed by a cudaGetLastError() check."""
    for f in cuda.KERNEL_FILES:
        text = cuda.sources(f)
        assert text.count("<<<") >= 1
        assert text.count("cudaGetLastError()") == text.count("<<<"), f


def test_reduction_uses_warp_shuffles_and_shared_memory():
    text = cuda.sources("reduce.cu")
    assert "__shfl_down_sync" in text and "__shared__" in text
    assert "__shared__" in cuda.sources("matmul.cu") and "__syncthreads()" in cuda.sources("matmul.cu")



# ---------------------------------------------------------------- notebook 06's experiment kernels
# experiments.cu is not part of the extension `build()` makes: notebook 06 binds it with load_inline.
EXPERIMENTS = cuda.SOURCE_DIR / "experiments.cu"


@needs_nvcc
def test_experiment_kernels_compile_without_spills(tmp_path):
    """experiments.cu compiles for sm_90 and sm_75; ptxas reports registers and no spills on sm_90."""
    gencode = [flag for target in TARGETS for flag in ("-gencode", target)]
    cmd = [NVCC, "-c", "-O3", "-std=c++17", "--Werror", "all-warnings", "-Xptxas", "-v", *gencode,
           "-I", str(cuda.SOURCE_DIR), str(EXPERIMENTS), "-o", str(tmp_path / "e.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{done.stderr}{done.stdout}"
    report = done.stderr + done.stdout
    sm90 = report.split("for 'sm_75'")[0]
    for kernel in ("scale_coalesced_kernel", "scale_uncoalesced_kernel", "transpose_naive_kernel",
                   "transpose_shared_kernel", "copy_kernel", "copy4_kernel", "matmul_regtile_kernel"):
        assert kernel in report, f"ptxas compiled no {kernel}"
    used = [int(r) for r in re.findall(r"Used (\d+) registers", sm90)]
    assert used and max(used) <= 255, used
    assert not re.search(r"[1-9]\d* bytes spill (stores|loads)", sm90), "a kernel spills registers on sm_90"


def test_experiment_launchers_are_declared_and_checked():
    """Each launcher in experiments.cuh is defined in experiments.cu and returns cudaGetLastError()."""
    header = (cuda.SOURCE_DIR / "experiments.cuh").read_text()
    text = EXPERIMENTS.read_text()
    launchers = set(re.findall(r"cudaError_t (launch_\w+)\(", header))
    assert launchers == {"launch_scale", "launch_transpose", "launch_copy", "launch_matmul_regtile"}
    for name in launchers:
        body = text.split(f"cudaError_t {name}(")[1].split("\n}\n")[0]
        assert "<<<" in body and body.rstrip().endswith("return cudaGetLastError();"), name
    assert "[kTile + PAD]" in text and "transpose_shared_kernel<1>" in text  # the padding fix exists

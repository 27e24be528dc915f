"""Build of tilecomm's C++ extension (torch.utils.cpp_extension).

The engine (csrc/common, kernels, transport, exec, algorithms) includes no torch
headers; only csrc/backend does. The CUDA parts (csrc/cuda/*.cu, and the glue
csrc/backend/cuda_*.cpp) are compiled only when the installed torch has CUDA
and nvcc is found; they are then built for sm_90a plus compute_90 PTX (which
the driver compiles for other GPUs), unless TORCH_CUDA_ARCH_LIST names the
architectures. The NVSHMEM parts (csrc/cuda/nvshmem.cu's calls into the host
library, which is loaded at run time, never linked) are compiled when the
NVSHMEM headers are found: those of the nvidia-nvshmem-cu13 wheel, or
$NVSHMEM_HOME/include. A short summary says what was built and why.
"""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def cuda_only(path):
    return path.startswith(os.path.join("csrc", "cuda") + os.sep) or os.path.basename(path).startswith("cuda_")


all_cpp = sources("csrc/**/*.cc") + sources("csrc/**/*.cpp")
cpu_sources = [p for p in all_cpp if not cuda_only(p)]
cuda_sources = [p for p in all_cpp if cuda_only(p)] + sources("csrc/**/*.cu")

if torch.version.cuda is None:
    why_not = f"torch {torch.__version__} has no CUDA"
elif CUDA_HOME is None:
    why_not = f"torch {torch.__version__} has CUDA {torch.version.cuda}, but no CUDA toolkit (nvcc) was found"
else:
    why_not = None
has_cuda = why_not is None


def nvshmem_include():
    """The NVSHMEM headers' folder, or None."""
    roots = [os.environ["NVSHMEM_HOME"]] if os.environ.get("NVSHMEM_HOME") else []
    try:
        import nvidia.nvshmem

        roots += list(nvidia.nvshmem.__path__)
    except ImportError:
        pass
    for root in roots:
        if os.path.isfile(os.path.join(root, "include", "nvshmem.h")):
            return os.path.join(root, "include")
    return None


nvshmem_inc = nvshmem_include() if has_cuda else None

print("tilecomm build summary:")
print(f"  CPU engine + c10d backend: {len(cpu_sources)} files")
if has_cuda:
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
    archs = f"TORCH_CUDA_ARCH_LIST={arch_list}" if arch_list else "sm_90a + compute_90 PTX"
    print(
        f"  CUDA parts: {len(cuda_sources)} files (torch {torch.__version__} has CUDA {torch.version.cuda}; "
        f"nvcc from {CUDA_HOME}; {archs}): CUDA tensors, cuda_ipc transport, direct all_reduce kernels"
    )
else:
    print(f"  CUDA parts: not built ({why_not}); CUDA tensors are refused with a ValueError")
if nvshmem_inc:
    print(f"  NVSHMEM parts: built (headers from {nvshmem_inc}; libnvshmem_host is loaded at run time)")
elif has_cuda:
    print("  NVSHMEM parts: not built (no NVSHMEM headers: install nvidia-nvshmem-cu13 or set NVSHMEM_HOME)")
else:
    print("  NVSHMEM parts: not built (they need the CUDA parts)")

cxx_flags = ["-O3", "-fvisibility=hidden"]
if has_cuda:
    nvcc_flags = ["-O3", "-std=c++17", "-DTILECOMM_WITH_CUDA"]
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        # NOTE: with an arch flag given here, torch adds none of its own.
        nvcc_flags += ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]
    if nvshmem_inc:
        nvcc_flags += ["-DTILECOMM_WITH_NVSHMEM", f"-I{nvshmem_inc}"]
    ext = CUDAExtension(
        name="tilecomm._C",
        sources=cpu_sources + cuda_sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx_flags + ["-DTILECOMM_WITH_CUDA"], "nvcc": nvcc_flags},
        # NOTE: the process's libstdc++ first. Some CUDA images' compilers link libstdc++ statically
        # into the extension; its private iostream code then meets torch's locale and crashes.
        extra_link_args=["-l:libstdc++.so.6", "-ldl"],  # dlopen: NVSHMEM is loaded at run time
    )
else:
    ext = CppExtension(
        name="tilecomm._C",
        sources=cpu_sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args=cxx_flags,
    )

setup(
    packages=find_packages("python"),
    package_dir={"": "python"},
    package_data={"tilecomm": ["profiles/*.json", "executor_corrections.json"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
)

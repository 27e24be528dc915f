"""Build of tilecomm's C++ extension (torch.utils.cpp_extension).

The engine (csrc/common, kernels, transport, exec, algorithms) includes no torch
headers; only csrc/backend does. CUDA sources are compiled only when the
installed torch has CUDA; a short summary says what was built and why.
"""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


cpu_sources = sources("csrc/**/*.cc") + sources("csrc/**/*.cpp")
cuda_sources = sources("csrc/**/*.cu")
has_cuda = torch.version.cuda is not None and bool(cuda_sources)

print("tilecomm build summary:")
print(f"  CPU engine + c10d backend: {len(cpu_sources)} files")
if has_cuda:
    print(f"  CUDA parts: {len(cuda_sources)} files (torch {torch.__version__} has CUDA {torch.version.cuda})")
elif torch.version.cuda is None:
    print(f"  CUDA parts: not built (torch {torch.__version__} has no CUDA)")
else:
    print("  CUDA parts: not built (no CUDA sources in this version)")
print("  NVSHMEM parts: not built (not part of this version)")

ext = CppExtension(
    name="tilecomm._C",
    sources=cpu_sources,
    include_dirs=[os.path.join(ROOT, "csrc")],
    extra_compile_args=["-O3", "-fvisibility=hidden"],
)

setup(
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
)

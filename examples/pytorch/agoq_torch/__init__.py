"""agoq for PyTorch: quantized saved activations, fused ops, 8-bit gradients and all-reduce,
8-bit AdamW, and the activation planner, on the CPU executor of the agoq headers.

The C++ part (csrc/) is compiled on first import with torch.utils.cpp_extension.load into
$AGOQ_TORCH_BUILD_DIR (default: <repo>/build/pytorch) and reused while its sources and the agoq
headers are unchanged. docs/pytorch.md documents the API and its conventions.
"""

import os as _os
import pathlib as _pathlib
import sys as _sys

import torch as _torch

_HERE = _pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]
_MIN_TORCH = (1, 13)


def _check_torch():
    """Raises ImportError with a clear message when this torch lacks what the extension needs."""
    version = tuple(int(p) for p in _torch.__version__.split("+")[0].split(".")[:2])
    if version < _MIN_TORCH:
        raise ImportError(
            f"agoq_torch needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]} (found {_torch.__version__})")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        raise ImportError("agoq_torch needs torch.distributed with the gloo backend, which this "
                          f"torch {_torch.__version__} was built without")
    from torch.utils import cpp_extension  # noqa: F401  (ImportError names what is missing)


def _cuda_include_dirs():
    """The CUDA toolkit's include folders: agoq's element types come from cuda_bf16.h and
    cuda_fp16.h, its views from CCCL (libcu++'s mdspan); nothing here needs a GPU."""
    root = _pathlib.Path(_os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    dirs = [root / "include", root / "include" / "cccl"]
    if not (root / "include" / "cuda_bf16.h").exists():
        raise ImportError(f"agoq_torch: the CUDA toolkit headers were not found under {root} "
                          "(set CUDA_HOME)")
    return [str(d) for d in dirs if d.exists()]


# The translation units: each compiles two of csrc/'s files (a unity build, as CMake's
# UNITY_BUILD), since torch's and agoq's headers take most of a unit's compile time; two units
# keep two cores busy. Every csrc/*.cpp must be in one.
_UNITS = (("tensors.cpp", "module.cpp"), ("collectives.cpp", "planning.cpp"))


def _unit_sources(build):
    """Writes build/unit_<i>.cpp (only where its text changes, so that ninja rebuilds nothing
    else) and returns their paths."""
    files = sorted(p.name for p in (_HERE / "csrc").glob("*.cpp"))
    grouped = sorted(name for unit in _UNITS for name in unit)
    if files != grouped:
        raise ImportError(f"agoq_torch: csrc/ holds {files}, the units name {grouped}")
    sources = []
    for i, unit in enumerate(_UNITS):
        text = "".join(f'#include "{_HERE / "csrc" / name}"\n' for name in unit)
        path = build / f"unit_{i}.cpp"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        sources.append(str(path))
    return sources


def _load():
    _check_torch()
    from torch.utils import cpp_extension
    build = _pathlib.Path(_os.environ.get("AGOQ_TORCH_BUILD_DIR", _REPO / "build" / "pytorch"))
    build.mkdir(parents=True, exist_ok=True)
    sources = _unit_sources(build)
    verbose = _os.environ.get("AGOQ_TORCH_VERBOSE", "") not in ("", "0")
    if not verbose and not (build / "agoq_torch_C.so").exists():
        print("agoq_torch: building the extension if needed (about a minute the first time)",
              file=_sys.stderr, flush=True)
    # ninja tracks the included headers (agoq's and csrc/common.hpp): editing one rebuilds.
    # -fopenmp: torch's at::parallel_for, which runs agoq's threads on torch's intra-op pool
    # (csrc/common.hpp), is inline OpenMP code under torch's OpenMP backend, so it must be
    # compiled as OpenMP here (without it the loop runs on one thread).
    return cpp_extension.load(
        name="agoq_torch_C",
        sources=sources,
        extra_cflags=["-std=c++20", "-O3", "-march=native", "-Wall", "-Wextra", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(_REPO / "include")] + _cuda_include_dirs(),
        build_directory=str(build),
        verbose=verbose,
        with_cuda=False,
    )


_C = _load()

__all__ = [name for name in dir(_C) if not name.startswith("_")]
globals().update({name: getattr(_C, name) for name in __all__})
__version__ = _C.version

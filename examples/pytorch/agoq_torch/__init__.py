"""agoq for PyTorch: quantized saved activations, fused ops, 8-bit gradients and all-reduce,
8-bit AdamW, and the activation planner, on the CPU executor of the agoq headers; the saved-tensor
calls, the fused ops and measure also on GPU tensors, and the gradient buffer, the 8-bit
collectives and AdamW in GPU memory (device_module().GradientBuffer, .ProcessGroupCommunicator,
.AdamW8bit), through agoq's CUDA executor.

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
        _write_if_changed(path, text)
        sources.append(str(path))
    return sources


def _build_dir():
    return _pathlib.Path(_os.environ.get("AGOQ_TORCH_BUILD_DIR", _REPO / "build" / "pytorch"))


def _write_if_changed(path, text):
    """Writes text to path unless it already holds it (so that ninja rebuilds nothing else)."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _load():
    _check_torch()
    from torch.utils import cpp_extension
    build = _build_dir()
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

# The calls that also take GPU tensors, each with the name of its first argument: a call whose
# first tensor is on a GPU, or whose communicator is the device module's, goes to the device
# module (csrc/device.cuh, the CUDA executor on torch's current stream), any other to the CPU
# module.
_DEVICE_CALLS = {
    "compress": "x", "decompress": "buffer", "fake_quantize": "x", "rmsnorm_forward": "x",
    "rmsnorm_forward_plain": "x", "rmsnorm_backward": "dy", "swiglu_forward": "gate",
    "swiglu_forward_plain": "gate", "swiglu_backward": "dout", "gelu_forward": "x",
    "gelu_forward_plain": "x", "gelu_backward": "dy", "residual_add": "a", "measure": "x",
    "compress_measured": "x", "rmsnorm_forward_measured": "x", "swiglu_forward_measured": "gate",
    "gelu_forward_measured": "x", "residual_add_measured": "a",
    "all_reduce_8bit": "comm", "reduce_scatter_8bit": "comm",
}
_DEVICE_UNITS = ("device.cu", "device_forward.cu", "device_backward.cu", "device_gradients.cu")
_device = None


# AGOQ_TORCH_DEVICE=emulated (read at import): the device module is built for agoq's CUDA
# emulator (tests/emulator), whose device tensors are CPU tensors over its memory
# (device_module().to_device); how tests/test_device.py runs on a machine without a GPU.
_EMULATED = _os.environ.get("AGOQ_TORCH_DEVICE", "") == "emulated"


def device_module():
    """The device module, built on first use: with nvcc where torch has CUDA (into
    <build dir>/cuda, a few minutes the first time), or for the CUDA emulator under
    AGOQ_TORCH_DEVICE=emulated (into <build dir>/emulated)."""
    global _device
    if _device is not None:
        return _device
    from torch.utils import cpp_extension
    emulated = _EMULATED
    if not emulated and _torch.version.cuda is None:
        raise RuntimeError("agoq_torch: this torch has no CUDA, so GPU tensors cannot be given "
                           f"(torch {_torch.__version__})")
    build = _build_dir() / ("emulated" if emulated else "cuda")
    build.mkdir(parents=True, exist_ok=True)
    verbose = _os.environ.get("AGOQ_TORCH_VERBOSE", "") not in ("", "0")
    if not verbose and not (build / "agoq_torch_device.so").exists():
        print("agoq_torch: building the device module if needed (a few minutes the first time)",
              file=_sys.stderr, flush=True)
    includes = [str(_REPO / "include")] + _cuda_include_dirs()
    # Four translation units (csrc/device.cuh), which ninja compiles in parallel.
    sources = [_HERE / "csrc" / name for name in _DEVICE_UNITS]
    if emulated:
        emulator = _REPO / "tests" / "emulator"
        units = []
        # As CMake's agoq_add_emulated_test: the emulator first, then the device source, at -O1
        # without contraction (docs/testing.md, "The emulated device tier").
        for source in sources:
            unit = build / f"{source.stem}_emulated.cpp"
            _write_if_changed(unit, f'#include "{emulator / "cuda_emulator.hpp"}"\n'
                                    f'#include "{source}"\n')
            units.append(str(unit))
        _device = cpp_extension.load(
            name="agoq_torch_device",
            sources=units + [str(emulator / "cuda_emulator.cpp")],
            extra_cflags=["-std=c++20", "-O1", "-ffp-contract=off", "-Wall", "-Wextra",
                          "-Wno-unknown-pragmas"],
            extra_ldflags=["-lboost_context"],
            extra_include_paths=includes + [str(emulator)],
            build_directory=str(build), verbose=verbose, with_cuda=False)
    else:
        # torch's extensions build with CUDA's half and bfloat16 operators and conversions turned
        # off; agoq's headers use them, as any CUDA C++ does by default.
        _device = cpp_extension.load(
            name="agoq_torch_device",
            sources=[str(source) for source in sources],
            extra_cuda_cflags=["-std=c++20", "-O3", "-U__CUDA_NO_HALF_OPERATORS__",
                               "-U__CUDA_NO_HALF_CONVERSIONS__",
                               "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                               "-U__CUDA_NO_HALF2_OPERATORS__"],
            extra_include_paths=includes,
            build_directory=str(build), verbose=verbose, with_cuda=True)
    return _device


def _module_of(t):
    """The module that runs a call whose first argument is t: a tensor, or the collectives'
    communicator (the device module's ProcessGroupCommunicator moves GPU memory)."""
    if isinstance(t, _torch.Tensor):
        if t.is_cuda or (_EMULATED and device_module().holds(t)):
            return device_module()
    elif _device is not None and isinstance(t, _device.ProcessGroupCommunicator):
        return _device
    return _C


def _dispatching(name, first):
    def call(*args, **kwargs):
        t = args[0] if args else kwargs.get(first)
        return getattr(_module_of(t), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(_C, name).__doc__
    return call


def nonfinite_seen():
    """NaN/Inf values the quantizing calls of this process have met since the last reset, on the
    CPU and (once a GPU tensor was given; reading them synchronizes) on every device."""
    return _C.nonfinite_seen() + (_device.nonfinite_seen() if _device is not None else 0)


def reset_nonfinite():
    """Sets nonfinite_seen() to 0."""
    _C.reset_nonfinite()
    if _device is not None:
        _device.reset_nonfinite()


__all__ = [name for name in dir(_C) if not name.startswith("_")] + ["device_module"]
globals().update({name: getattr(_C, name) for name in dir(_C)
                  if not name.startswith("_") and name not in globals()})
globals().update({name: _dispatching(name, first) for name, first in _DEVICE_CALLS.items()})
__version__ = _C.version

from .saved import (  # noqa: E402  (they use the calls defined above)
    HF_GEMMA2_MODULES, HF_GEMMA3_MODULES, HF_GPT2_MODULES, HF_LLAMA_MODULES, HF_QWEN3_MODULES,
    QuantizedSaves, rules_from_plan,
    statistics_for_plan)

__all__ += ["QuantizedSaves", "rules_from_plan", "statistics_for_plan", "HF_LLAMA_MODULES",
            "HF_QWEN3_MODULES", "HF_GEMMA2_MODULES", "HF_GEMMA3_MODULES", "HF_GPT2_MODULES"]

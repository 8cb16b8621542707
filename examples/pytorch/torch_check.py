"""Clear messages instead of tracebacks when torch, or a torch feature the examples need, is
missing.

The examples need torch >= 1.13 with torch.distributed and its gloo backend (Debian 12's
python3-torch or a PyPI wheel) and, for anything quantized, the agoq_torch extension, which
builds itself with torch.utils.cpp_extension on its first import (a C++20 compiler and the
Python headers, Debian's g++ and python3-dev).
"""

from __future__ import annotations

import os
import sys

#: The oldest torch these examples are tested with (Debian 12's python3-torch).
MINIMUM = (1, 13)

_INSTALL = ("install Debian's python3-torch (scripts/install_deps.sh does) or a PyPI wheel "
            "(pip install torch), and run with a python that can import it, e.g. /usr/bin/python3 "
            "(scripts/torch_python.sh finds one)")


def fail(message: str) -> None:
    """Prints ``agoq: <message>`` to stderr and exits with status 2."""
    print(f"agoq: {message}", file=sys.stderr)
    sys.exit(2)


def require_torch():
    """Returns the torch module, or exits with a message saying what is missing and what to do."""
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not importable by {sys.executable} ({e}); {_INSTALL}")
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < MINIMUM:
        fail(f"torch {torch.__version__} is older than {'.'.join(map(str, MINIMUM))}; {_INSTALL}")
    import torch.distributed as dist

    if not dist.is_available():
        fail(f"this torch ({torch.__version__}) was built without torch.distributed, which the "
             f"data-parallel runs need; {_INSTALL}")
    if not dist.is_gloo_available():
        fail(f"this torch ({torch.__version__}) has torch.distributed without the gloo backend, "
             f"which the CPU data-parallel runs need; {_INSTALL}")
    return torch


def require_agoq():
    """Imports (building on first use) the agoq_torch extension, or exits with a clear message."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        import agoq_torch
    except ImportError as e:
        fail(f"the agoq_torch extension could not be imported ({e}); it lives in {here}/agoq_torch "
             "and builds with torch.utils.cpp_extension, which needs g++ and python3-dev")
    except (RuntimeError, OSError) as e:
        fail(f"building the agoq_torch extension failed: {e}\n(see docs/pytorch.md; the build "
             "folder is build/pytorch or $AGOQ_TORCH_BUILD_DIR)")
    return agoq_torch

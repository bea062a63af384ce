"""Server processes that end with the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its parent ``parent`` dies
    (``kill -9`` included), so no worker goes on serving a port unsupervised. Linux
    only (elsewhere nothing happens)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)

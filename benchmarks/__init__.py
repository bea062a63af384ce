"""Benchmark commands: `python -m benchmarks.<name>`; each prints its figures."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence


def run_threads(targets: Sequence[Callable[[], object]]) -> float:
    """Start one thread per target at once, wait for all, return the wall time in seconds."""
    pool = [threading.Thread(target=target) for target in targets]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return time.perf_counter() - started

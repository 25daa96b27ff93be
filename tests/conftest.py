import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Tests are timing-free but should not oversubscribe the 2-core CI machine. Two intra-op threads
# help on an idle machine and are ruinous on a busy one (a tiny digits run: 0.7 s with one thread,
# 54 s with two at load 4), so take one thread when the cores are already in use.
_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > _cpus - 1
torch.set_num_threads(1 if _busy else min(2, _cpus))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA

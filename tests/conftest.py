import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# `fednorm reproduce` refuses a working tree with uncommitted changes to the package (issue 37.6);
# the suite runs its tiny suites from whatever tree it tests. tests/test_reproduce.py tests the refusal.
os.environ.setdefault("FEDNORM_ALLOW_DIRTY", "1")

# Tests are timing-free but should not oversubscribe the 2-core CI machine. Two intra-op threads
# help on an idle machine and are ruinous on a busy one (a tiny digits run: 0.7 s with one thread,
# 54 s with two at load 4), so take one thread when the cores are already in use.
# Under pytest-xdist (the README's command runs one worker per core) each worker takes its share.
_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
_busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > _cpus - 1
torch.set_num_threads(1 if _busy else max(1, min(2, _cpus // _workers)))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked slow (tens of seconds to minutes: Flower daemons, torch.distributed
    launches) run first, so that pytest-xdist's workers are not left with one each at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

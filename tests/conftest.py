import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _torch_threads():
    # Two cores in CI: keep torch from oversubscribing while tests run.
    import torch

    torch.set_num_threads(1)
    yield

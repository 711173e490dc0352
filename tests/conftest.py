import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(1234)

"""Every core op case in ``op_cases.CASES`` against numpy, on every backend."""
import pytest

from helpers import check
from op_cases import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_case(case, device):
    check(case, device)

"""The seeded faults of tests/kernels/emulator/faults.py still name text that stands once in its
kernel file (a list that no longer applies proves nothing). Running them is
``python tests/kernels/emulator/faults.py`` (CI does, .ci/run): each must make its kernel's CPU
tests fail."""
import os

import pytest

from emulator import faults


@pytest.mark.parametrize("kernel", sorted(faults.FAULTS))
def test_every_seeded_fault_applies_to_its_kernel_file(kernel):
    path = os.path.join(faults.ROOT, "cygemm", "kernels", f"{kernel}.cu")
    if not os.path.isfile(path):
        pytest.skip(f"the kernel's source {path} is not in this tree (an installed wheel)")
    source = open(path).read()
    tests, listed = faults.FAULTS[kernel]
    assert os.path.isfile(os.path.join(faults.ROOT, tests))
    for what, text, fault, *known in listed:
        assert source.count(text) == 1, what
        assert fault != text and source.replace(text, fault) != source, what

"""A worker pinned to one accelerator must see exactly one (Aurora's tile ids under a FLAT hierarchy)."""

from __future__ import annotations

import pytest

from apps.dataset.device import check_one_device
from core.errors import PipelineError


def test_a_pinned_worker_seeing_one_device_passes() -> None:
    check_one_device("xpu", 1, {"ZE_AFFINITY_MASK": "5.1", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"})
    check_one_device("cuda", 1, {"CUDA_VISIBLE_DEVICES": "3"})
    check_one_device("cuda", 4, {})  # not pinned: a login node or a laptop sees what it has
    check_one_device("cuda", 2, {"CUDA_VISIBLE_DEVICES": "0,1"})  # pinned to two on purpose


def test_a_tile_id_under_a_flat_hierarchy_is_named() -> None:
    with pytest.raises(PipelineError) as error:
        check_one_device("xpu", 12, {"ZE_AFFINITY_MASK": "5.1", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"})
    message = str(error.value)
    assert "'5.1'" in message and "sees 12 xpu devices" in message and "COMPOSITE" in message


def test_a_cuda_worker_seeing_several_devices_fails() -> None:
    with pytest.raises(PipelineError, match=r"pinned to accelerator '2' .* sees 4 cuda devices"):
        check_one_device("cuda", 4, {"CUDA_VISIBLE_DEVICES": "2"})

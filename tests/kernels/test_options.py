"""KernelOptions checks each field where it is made (a KernelOptions, a dict through as_kernel_options,
a `kernel_options` block, a call's kernel_options=), so a bad triton launch setting is a ValueError
naming the field, the setting and the value on any backend and without triton installed: BLOCK_E
and num_warps not powers of two passed the check before and failed inside Triton ("arange's range
must be a power of 2") or not at all (num_warps in the interpreter)."""

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.functional import check_arguments
from sparseattn.kernels import KernelOptions, as_kernel_options, kernel_options
from sparseattn.kernels.options import MAX_NUM_WARPS, check_triton_settings

BAD = [  # (field, settings, what the message names)
    ("triton_forward", {"BLOCK_E": 3}, r"triton_forward\['BLOCK_E'\] must be a power of two .*got 3"),
    ("triton_forward", {"BLOCK_E": 24}, r"triton_forward\['BLOCK_E'\] must be a power of two .*got 24"),
    ("triton_backward", {"BLOCK_E": 24}, r"triton_backward\['BLOCK_E'\] must be a power of two .*got 24"),
    ("triton_forward", {"BLOCK_E": 0}, r"\['BLOCK_E'\] must be a power of two .*got 0"),
    ("triton_forward", {"BLOCK_E": True}, r"\['BLOCK_E'\] must be a power of two .*got True"),
    ("triton_forward", {"BLOCK_E": "4"}, r"\['BLOCK_E'\] must be a power of two .*got '4'"),
    ("triton_forward", {"num_warps": 3}, r"triton_forward\['num_warps'\] must be a power of two from 1 to 32, got 3"),
    ("triton_backward", {"num_warps": 6}, r"triton_backward\['num_warps'\] must be a power of two from 1 to 32, got 6"),
    ("triton_forward", {"num_warps": 64}, r"\['num_warps'\] must be a power of two from 1 to 32, got 64"),
    ("triton_forward", {"num_stages": 0}, r"\['num_stages'\] must be an int >= 1 or None, got 0"),
    ("triton_backward", {"num_stages": 1.5}, r"\['num_stages'\] must be an int >= 1 or None, got 1.5"),
    ("triton_forward", {"layout": "rows"}, r"triton_forward\['layout'\] must be one of \('tile', 'lanes', 'heads'\)"),
    ("triton_backward", {"layout": "lanes"}, r"triton_backward\['layout'\] must be one of \('tile', 'heads'\), got"),
    ("triton_forward", {"BLOCK_H": 2}, r"triton_forward has unknown names \['BLOCK_H'\]; valid names are"),
]


@pytest.mark.parametrize("field, settings, named", BAD, ids=[f"{f}-{s}" for f, s, _ in BAD])
def test_bad_triton_setting_is_named_wherever_options_are_made(field, settings, named):
    with pytest.raises(ValueError, match=named):
        KernelOptions(**{field: settings})
    with pytest.raises(ValueError, match=named):
        as_kernel_options({field: settings})
    with pytest.raises(ValueError, match=named):
        with kernel_options(**{field: settings}):
            pass
    q = torch.zeros(4, 1, 2)
    g = graphs.window(4, 1)
    with pytest.raises(ValueError, match=named):  # on any backend, before attending
        edge_attention(q, q, q, g, backend="csr", kernel_options={field: settings})
    with pytest.raises(ValueError, match=named):  # and in the checks sparseattn.distributed runs first
        check_arguments(q, q, q, g, kernel_options={field: settings})


def test_good_triton_settings_pass_as_given():
    for warps in (1, 2, 4, 8, 16, MAX_NUM_WARPS):
        settings = {"layout": "heads", "BLOCK_E": warps * 2, "num_warps": warps, "num_stages": None}
        options = KernelOptions(triton_forward=settings, triton_backward=dict(settings, num_stages=3))
        assert options.triton_forward == settings and options.triton_backward["num_stages"] == 3
    assert check_triton_settings("triton_forward", {}) == {}


def test_settings_that_are_not_a_mapping():
    with pytest.raises(
        TypeError, match="kernel_options triton_backward must be a mapping of launch settings, got list"
    ):
        KernelOptions(triton_backward=[("BLOCK_E", 4)])

"""Launch settings of the triton backend's kernels, from the dims (D, Dv, heads, mean degree) and a
call's own settings (`KernelOptions.triton_forward` / `triton_backward`: layout, BLOCK_E, num_warps,
num_stages), which override the choice made here. Plain functions of their arguments: no module
state, so tests and benchmarks ask them directly.

Forward layouts, measured against each other on an H100 (`forward_settings` picks; benchmarks/results/):
  tile:  one program per (destination, head); each edge tile is reduced in the loop, v gathered after the
         score (three dependent memory round trips per tile); the loop is not explicitly pipelined.
  lanes: one program per (destination, head); k and v gathered together, one accumulator per edge slot
         (no reduction inside the loop, lanes combined once at the end), loop pipelined with num_stages.
  heads: one program per destination for all heads: (BLOCK_E, H, D) tiles read whole H * D source rows
         and the index once instead of H times; k and v gathered together, pipelined with num_stages.
Backward layouts (`backward_settings` picks):
  tile:  one program per (node, head) in each kernel, 8-edge tiles (`backward_tiles`), the loop not
         explicitly pipelined; taken for head sets narrower than 512 elements (H * D).
  heads: one program per node for all heads, as the forward's heads layout: (BLOCK_E, H, D) tiles
         read whole H * D rows of the gathered nodes and the index once instead of H times, loop
         pipelined with num_stages; the default. H100, bf16, H=8, D=64, 1M-node random graph of
         in-degree 16, fwd+bwd ms (`bench_triton_gpu --sweep-backward`, benchmarks/results/): heads
         with 2 edges, 2 warps, 2 stages 50.7; heads 4 edges, 4 warps 58.7; the best tile setting 74.6.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional

import triton
import triton.language as tl

from ..options import TRITON_BACKWARD_LAYOUTS, TRITON_SETTINGS, check_triton_settings
from ..triton_common import padded_dims

LAYOUTS = {  # the names are options.TRITON_LAYOUTS, in that order
    "tile": dict(all_heads=False, LANES=False, V_EARLY=False),
    "lanes": dict(all_heads=False, LANES=True, V_EARLY=True),
    "heads": dict(all_heads=True, LANES=False, V_EARLY=True),
}
DEFAULT_LAYOUT = "heads"
BACKWARD_LAYOUTS = TRITON_BACKWARD_LAYOUTS
DEFAULT_BACKWARD_LAYOUT = "heads"
SETTINGS = TRITON_SETTINGS  # what a call may set, forward and backward
MAX_TENSOR_NUMEL = getattr(tl, "TRITON_MAX_TENSOR_NUMEL", 1 << 20)  # Triton's largest tensor (a tile)

Settings = Optional[Mapping[str, Any]]


def check_forward(settings: Settings) -> Dict[str, Any]:
    """settings as a dict, or a ValueError naming the bad name or value (`options.check_triton_settings`)."""
    return check_triton_settings("triton_forward", settings or {})


def check_backward(settings: Settings) -> Dict[str, Any]:
    """settings as a dict, or a ValueError naming the bad name or value (`options.check_triton_settings`)."""
    return check_triton_settings("triton_backward", settings or {})


def _fits(cfg: dict, given: Dict[str, Any], which: str, heads: int) -> dict:
    """cfg, unless a given BLOCK_E makes its largest tile, (BLOCK_E, BLOCK_H, max(BLOCK_D, BLOCK_DV)),
    larger than Triton's largest tensor: then a ValueError naming the setting, the value and the
    largest BLOCK_E that fits."""
    per_edge = cfg["BLOCK_H"] * max(cfg["BLOCK_D"], cfg["BLOCK_DV"])
    if "BLOCK_E" in given and cfg["BLOCK_E"] * per_edge > MAX_TENSOR_NUMEL:
        raise ValueError(
            f"kernel_options {which}['BLOCK_E'] = {cfg['BLOCK_E']} makes tiles of {cfg['BLOCK_E'] * per_edge} "
            f"elements ({cfg['BLOCK_H']} of {heads} heads of {max(cfg['BLOCK_D'], cfg['BLOCK_DV'])} padded dims per "
            f"edge), over Triton's largest tensor ({MAX_TENSOR_NUMEL}): use at most "
            f"{MAX_TENSOR_NUMEL // per_edge}"
        )
    return cfg


def tiles(d: int, dv: int, mean_degree: float) -> dict:
    """Tile sizes of the tile and lanes forward layouts (`padded_dims`); an edge tile covers the mean
    degree (16 to 64 edges) but at most ~2048 elements per gathered tile, so registers do not spill."""
    block_d, block_dv = padded_dims(d, dv)
    widest = max(block_d, block_dv)
    block_e = min(triton.next_power_of_2(max(16, math.ceil(mean_degree))), 64, max(16, 2048 // widest))
    return dict(BLOCK_E=block_e, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4 if block_e * widest >= 2048 else 2)


def backward_tiles(d: int, dv: int) -> dict:
    """Tile sizes of the backward kernels' tile layout: 8 edges per tile and one warp per 512
    elements of a gathered tile (1 to 4). Measured on an H100 (bf16, H=8, D=64; benchmarks/results/):
    8 edges with 1 warp took fwd+bwd from 85 to 65 ms on a 1M-node random graph, 31 to 11 ms on
    window r=8, and 15 to 7 ms on complete 512-token blocks against `tiles`' 16-64 edges with 2-4
    warps."""
    block_d, block_dv = padded_dims(d, dv)
    warps = max(1, min(4, 8 * max(block_d, block_dv) // 512))
    return dict(BLOCK_E=8, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=warps)


def heads_tiles(d: int, dv: int, heads: int, elements: int = 2048) -> dict:
    """BLOCK_H (all heads, padded to a power of two) and BLOCK_E of a layout with all heads in one
    program: an edge tile of BLOCK_E * BLOCK_H * max(BLOCK_D, BLOCK_DV) near `elements`, BLOCK_E
    from 1 to 16."""
    block_d, block_dv = padded_dims(d, dv)
    block_h = triton.next_power_of_2(max(heads, 1))
    per_edge = block_h * max(block_d, block_dv)
    return dict(BLOCK_H=block_h, BLOCK_E=min(16, 1 << max(0, (elements // per_edge).bit_length() - 1)))


def _per_edge(d: int, dv: int, heads: int) -> int:
    """Elements of one edge's gathered rows over all heads, padded."""
    return triton.next_power_of_2(max(heads, 1)) * max(padded_dims(d, dv))


def _overridden(cfg: dict, settings: Dict[str, Any]) -> dict:
    """cfg with a call's settings in force (its num_stages is the kernels' NUM_STAGES; its layout
    was read already)."""
    cfg.update({("NUM_STAGES" if k == "num_stages" else k): v for k, v in settings.items() if k != "layout"})
    return cfg


# float32 forward, D and Dv <= 64, unless settings say otherwise: H200, random graph of 2^20 nodes and
# in-degree 16, H=8 D=64, exact mode, fwd ms: 21.0 lanes E8 w2 s1, 26.8 tile E16 w2, 42.1 with the
# bfloat16 choice (heads); 39 settings swept (benchmarks/results/bench_triton_gpu_*_sweep-float32.*)
FLOAT32_FORWARD = dict(layout="lanes", BLOCK_E=8, num_warps=2, num_stages=1)


def forward_settings(
    d: int, dv: int, heads: int, mean_degree: float, settings: Settings = None, float32: bool = False
) -> dict:
    """Launch settings of the forward kernel: the layout's flags, BLOCK_H heads per program, tile
    sizes, num_warps, and NUM_STAGES for the edge loop (None: Triton's default, no explicit
    pipelining); `settings` (checked) override them. tile and lanes use `tiles`; heads keeps
    BLOCK_E * BLOCK_H * max(BLOCK_D, BLOCK_DV) near 2048 elements (BLOCK_E from 1 to 16) with 4
    warps. Unless a layout is given, head sets narrower than 512 elements (H * D) take tile instead.
    Forward ms on an H100, bf16, a 65K-node random graph of in-degree 16, heads / tile: H=4 D=64
    1.12 / 0.77; H=32 D=64 3.32 / 4.22; H=8 D=256 3.47 / 8.98; H=16 D=256 6.40 / 17.3 (and H=8 D=64
    on 1M nodes 13.2 / 18.3, `benchmarks/results/`). float32 inputs (`float32`) with D, Dv <= 64
    start from FLOAT32_FORWARD: their rows are twice as wide, and the bfloat16 choice ran 2x slower."""
    given = check_forward(settings)
    if float32 and max(d, dv) <= 64 and "layout" not in given:
        given = {**FLOAT32_FORWARD, **given}
    cfg = tiles(d, dv, mean_degree)
    all_heads = triton.next_power_of_2(max(heads, 1))
    per_edge = all_heads * max(cfg["BLOCK_D"], cfg["BLOCK_DV"])  # elements of one edge's rows, all heads
    layout = given.get("layout", DEFAULT_LAYOUT)
    if "layout" not in given and layout == "heads" and per_edge < 512:
        layout = "tile"
    flags = dict(LAYOUTS[layout])
    if flags.pop("all_heads"):
        cfg.update(heads_tiles(d, dv, heads), num_warps=4)
    else:
        cfg.update(BLOCK_H=1)
    cfg.update(NUM_STAGES=None if layout == "tile" else 2, **flags)
    return _fits(_overridden(cfg, given), given, "triton_forward", heads)


def backward_settings(d: int, dv: int, heads: int, settings: Settings = None) -> dict:
    """Launch settings of the two backward kernels, `settings` (checked) in force: BLOCK_H, BLOCK_E,
    BLOCK_D, BLOCK_DV, NUM_STAGES (None: no explicit pipelining) and num_warps. tile:
    `backward_tiles`; heads: `heads_tiles` of ~1024 elements, one warp per 512 of them (1 to 4), 2
    stages. Unless a layout is given, head sets narrower than 512 elements take tile."""
    given = check_backward(settings)
    cfg = backward_tiles(d, dv)
    layout = given.get("layout", DEFAULT_BACKWARD_LAYOUT)
    if "layout" not in given and _per_edge(d, dv, heads) < 512:
        layout = "tile"
    if layout == "heads":
        cfg.update(heads_tiles(d, dv, heads, elements=1024), NUM_STAGES=2)
        cfg.update(num_warps=max(1, min(4, cfg["BLOCK_E"] * _per_edge(d, dv, heads) // 512)))
    else:
        cfg.update(BLOCK_H=1, NUM_STAGES=None)
    return _fits(_overridden(cfg, given), given, "triton_backward", heads)


def forward_ints(settings: Settings) -> List[int]:
    """Checked forward settings as an op's int list: the layout's position in LAYOUTS, BLOCK_E,
    num_warps, num_stages; -1 where not given, -2 for num_stages=None."""
    given = check_forward(settings)
    layout = given.get("layout")
    ints = [-1 if layout is None else list(LAYOUTS).index(layout)]
    return ints + [-1 if k not in given else -2 if given[k] is None else given[k] for k in SETTINGS[1:]]


def forward_from_ints(ints: List[int]) -> Dict[str, Any]:
    """`forward_ints`' inverse."""
    given: Dict[str, Any] = {} if ints[0] < 0 else {"layout": list(LAYOUTS)[ints[0]]}
    given.update({k: None if i == -2 else i for k, i in zip(SETTINGS[1:], ints[1:]) if i != -1})
    return given


LAUNCH = ("BLOCK_H", "BLOCK_E", "NUM_STAGES", "num_warps")  # the backward settings the forward op carries


def launch_ints(cfg: Mapping[str, Any]) -> List[int]:
    """The backward's settings that do not follow from the dims, as an op's int list (0 for NUM_STAGES=None)."""
    return [cfg[k] or 0 for k in LAUNCH]


def launch_settings(launch: List[int], d: int, dv: int) -> dict:
    """`launch_ints`' inverse, with BLOCK_D and BLOCK_DV for head dims d, dv."""
    cfg: dict = dict(zip(LAUNCH, launch))
    cfg["NUM_STAGES"] = cfg["NUM_STAGES"] or None
    cfg["BLOCK_D"], cfg["BLOCK_DV"] = padded_dims(d, dv)
    return cfg


__all__ = [
    "LAYOUTS",
    "BACKWARD_LAYOUTS",
    "DEFAULT_LAYOUT",
    "DEFAULT_BACKWARD_LAYOUT",
    "SETTINGS",
    "check_forward",
    "check_backward",
    "forward_settings",
    "backward_settings",
    "forward_ints",
    "forward_from_ints",
    "launch_ints",
    "launch_settings",
]

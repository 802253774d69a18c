"""Checkers that learners call and the grader reuses.

``check_conv2d(fn)`` prints one pass line or raises `CheckError` with a report: the case
that failed, the first bad index, max abs / rel error and (in a notebook) an error map.
Why the checkers are hard to fool is written at the top of `convlab.check.core`.

- `core`: test data (`random_array`, `poisoned`), `compare`, `reference_case`, calling
  the learner's function (`call`, `ANSWER_GUARDS` for the grader), running cases;
- `conv`: array answers: conv2d, NHWC conv2d, 2-D filters, GEMM, depthwise, im2col, col2im;
- `traced`: techniques seen in a trace: coalescing, loads per output, bank conflicts,
  barriers per block;
- `values`: numbers and splits: roofline, GEMM intensity, crossover, partition,
  pipeline time, weighted split, separable factors;
- `numerics`: rounding to bf16 / tf32, scaled fp16 GEMM, conv with fp16 inputs;
- `capstone`: the capstone's ladder;
- `stages`: stage checks of one part of a kernel: a staged shared tile, one thread's
  register fragment, the slab loop's coverage;
- `parallel`: races between prange iterations, read from a CPU answer's source;
- `selfcheck`: the grade a task's public tests would give, in the learner's notebook;
- `source`: the learner's code as text, and `check_uses` (a technique the task states).

Every public name of the submodules is importable from ``convlab.check``.
"""

from __future__ import annotations

from ..errors import CheckError
from .capstone import check_ladder
from .conv import (
    check_col2im,
    check_conv2d,
    check_conv2d_case,
    check_conv2d_nhwc,
    check_depthwise,
    check_filter2d,
    check_filter2d_large,
    check_gemm,
    check_im2col,
    conv2d_cases,
    depthwise_cases,
    filter2d_cases,
    gemm_cases,
    nhwc_case,
)
from .core import (
    ANSWER_GUARDS,
    EPS,
    POISON,
    POISON_BITS,
    Comparison,
    array_module,
    call,
    compare,
    learner_call,
    poisoned,
    raised_at,
    random_array,
    reference_case,
)
from .numerics import check_conv2d_fp16, check_rounding, check_scaled_gemm
from .parallel import prange_races, races_in_source
from .selfcheck import self_check
from .source import check_uses, sources
from .stages import BlockRun, register_fragment, run_block, slab_bounds, staged_tile, window
from .traced import (
    check_bank_conflicts,
    check_barriers_per_block,
    check_coalesced,
    check_loads_per_output,
    traffic,
)
from .values import (
    check_crossover,
    check_gemm_intensity,
    check_partition,
    check_pipeline_time,
    check_roofline,
    check_separable_factors,
    check_weighted_split,
)

__all__ = [
    "ANSWER_GUARDS", "EPS", "POISON", "POISON_BITS", "BlockRun", "CheckError", "Comparison",
    "array_module", "call",
    "check_bank_conflicts", "check_barriers_per_block", "check_coalesced", "check_col2im",
    "check_conv2d",
    "check_conv2d_case", "check_conv2d_fp16", "check_conv2d_nhwc", "check_crossover",
    "check_depthwise", "check_filter2d", "check_filter2d_large", "check_gemm",
    "check_gemm_intensity", "check_im2col", "check_ladder", "check_loads_per_output",
    "check_partition", "check_pipeline_time", "check_roofline", "check_rounding",
    "check_scaled_gemm", "check_separable_factors", "check_uses", "check_weighted_split", "compare",
    "conv2d_cases", "depthwise_cases", "filter2d_cases", "gemm_cases", "learner_call",
    "nhwc_case", "poisoned", "prange_races", "raised_at", "races_in_source", "random_array",
    "reference_case", "register_fragment",
    "run_block", "self_check", "slab_bounds", "sources", "staged_tile", "traffic", "window",
]

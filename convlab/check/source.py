"""The learner's code as text, for checks that read it: a function and the functions it
calls by a global name (a wrapper around an ``@njit`` helper is the usual shape).

In a graded call the text is read where the function lives, in the learner's process
(`convlab.grading.worker.describe`), and arrives as the `sources` of the grader's stand-in;
like every fact from that process, a learner who forges it can pass a source check (never
an output check).
"""

from __future__ import annotations

import inspect
import re
import textwrap

from ..errors import CheckError

MAX_FUNCTIONS = 8
MAX_CHARS = 20_000


def sources(fn) -> dict:
    """{name: source text} of `fn` and of the functions its code names as globals (Numba
    dispatchers by their Python function), at most MAX_FUNCTIONS."""
    remote = getattr(fn, "sources", None)
    if isinstance(remote, dict):
        return {str(k): str(v) for k, v in remote.items()}
    py = getattr(fn, "py_func", fn)
    funcs = {getattr(py, "__name__", "fn"): py}
    code, glb = getattr(py, "__code__", None), getattr(py, "__globals__", {})
    for name in code.co_names if code is not None else ():
        g = getattr(glb.get(name), "py_func", glb.get(name))
        if inspect.isfunction(g) and name not in funcs and len(funcs) < MAX_FUNCTIONS:
            funcs[name] = g
    out = {}
    for name, f in funcs.items():
        try:
            out[name] = textwrap.dedent(inspect.getsource(f))[:MAX_CHARS]
        except (OSError, TypeError):
            continue
    return out


def check_uses(fn, pattern: str, what: str, *, quiet=False) -> str:
    """Fail unless the source of `fn` (or of a function it calls) matches the regular
    expression `pattern`: the technique a task states (`what`, e.g. "NumPy's FFT") is
    there, not only right numbers from another method."""
    name = getattr(fn, "__name__", type(fn).__name__)
    src = sources(fn)
    if not src:
        raise CheckError(f"technique FAILED: the source of {name} cannot be read (define it "
                         "in the answer cell)")
    if not any(re.search(pattern, text) for text in src.values()):
        raise CheckError(f"technique FAILED: {name} (and the functions it calls: "
                         f"{', '.join(sorted(src))}) does not use {what}, which the task asks "
                         "for")
    line = f"✓ technique: {name} uses {what}"
    if not quiet:
        print(line)
    return line


__all__ = ["check_uses", "sources"]

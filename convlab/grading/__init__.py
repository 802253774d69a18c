"""Exercises and grading: build exercises from solutions, grade notebooks, Gradescope.

- `build.build`: solutions/NN_*.ipynb -> exercises/NN_*.ipynb (``convlab exercises build``)
- `grade.grade`: grade one notebook (``convlab grade``)
- `batch.grade_batch`: a folder of submissions -> gradebook.csv (``convlab grade-batch``)
- `gradescope.write_autograder`: the Gradescope bundle (``convlab autograder``)
- `verdict`, `remote`, `wire`: tests run in the grader's process; the learner's functions
  are called in theirs, inputs out and outputs back as ``.npy`` files
- `kernel`, `jail`: the learner's process (a Jupyter kernel) and its OS isolation
- `worker`, `sandbox`: inside that process, the call server and the in-process guard rails
- `speed`, `speed_worker`, `speed_kernels`: with ``--gpu``, each speed task's kernel timed
  against the course kernel of its rung (tiers, exploit detectors, Gradescope leaderboard)

The notebook format is in `notebook` (markers ``# EXERCISE: <id>``, ``# TEST: <id>
points=N``, ``### BEGIN SOLUTION`` / ``### END SOLUTION``, ``### BEGIN HIDDEN TESTS`` /
``### END HIDDEN TESTS``). Nothing here imports numba, and importing this package imports
none of its modules (the grading kernel imports only `worker`, `wire` and `sandbox`).
"""

import importlib

_EXPORTS = {"build_exercises": ("build", "build"), "grade_notebook": ("grade", "grade"),
            "GradeResult": ("grade", "GradeResult"), "GradingError": ("grade", "GradingError"),
            "TaskResult": ("grade", "TaskResult"), "grade_batch": ("batch", "grade_batch"),
            "results_json": ("gradescope", "results_json"),
            "write_autograder": ("gradescope", "write_autograder"),
            "NotebookFormatError": ("notebook", "NotebookFormatError")}


def __getattr__(name):
    if name in _EXPORTS:
        mod, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)

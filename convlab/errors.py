"""The package's two exceptions, in a leaf module that imports nothing from convlab.

- `Unsupported`: a kernel or CPU version refuses an argument or shape it does not handle
  (it never returns a wrong answer). A ValueError, so callers can catch either.
- `CheckError`: a checker found a wrong answer; ``.report`` holds the text, and
  ``.comparison`` the element-wise comparison when there is one.
"""

from __future__ import annotations


class Unsupported(ValueError):
    """This kernel does not handle the requested argument or shape."""


class CheckError(AssertionError):
    """A checker found a wrong answer; ``.report`` holds the details."""

    def __init__(self, report: str, comparison=None):
        super().__init__(report)
        self.report = report
        self.comparison = comparison

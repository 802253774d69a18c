"""Execute the lesson notebooks on a real GPU and keep their outputs (see
convlab/measure/notebooks.py; the same as ``python -m convlab measure notebooks``).

    python3 tools/gpu/run_notebooks.py OUTDIR [notebooks/04_*.ipynb ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from convlab.measure.notebooks import run_notebooks  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_notebooks(sys.argv[1], sys.argv[2:]))

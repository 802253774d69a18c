"""Execute the lesson notebooks on this machine's GPU at full size and keep their outputs.

    python -m convlab measure notebooks [notebooks/04_*.ipynb ...] --out DIR

Appends each executed notebook to DIR/notebooks.tar as soon as it finishes (a run cut
short by a time limit keeps what finished) and a line per notebook (cells, seconds,
error) to DIR/notebooks.log. A notebook that raises is still saved, with its error.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_notebooks(out, paths=(), timeout: float = 600, mode: str = "gpu") -> int:
    """Execute `paths` (default: every notebook in notebooks/); 1 if any failed, else 0."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [Path(p) for p in paths] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    env = dict(os.environ, CONVLAB_MODE=mode)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    failed = 0
    (out / "notebooks.log").write_text("")
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        t0, err = time.monotonic(), ""
        try:
            client.execute(env=env, cwd=str(path.parent))
        except CellExecutionError as e:
            err, failed = str(e).splitlines()[-1][:300], failed + 1
        except Exception as e:  # noqa: BLE001  (report and keep going)
            err, failed = f"{type(e).__name__}: {e}"[:300], failed + 1
        line = (f"{path.name}: {sum(c.cell_type == 'code' for c in nb.cells)} code cells, "
                f"{time.monotonic() - t0:.1f} s{', ERROR ' + err if err else ''}")
        print(line, flush=True)
        with open(out / "notebooks.log", "a") as f:
            f.write(line + "\n")
        data = nbformat.writes(nb).encode()
        info = tarfile.TarInfo(f"notebooks/{path.name}")
        info.size = len(data)
        with tarfile.open(out / "notebooks.tar", "a") as tar:
            tar.addfile(info, io.BytesIO(data))
    return 1 if failed else 0

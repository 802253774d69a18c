# ruff: noqa
"""Family "read solutions": the instructor's notebook, the solutions, .git, results.json."""

# EXERCISE: fx.tiled
import ctypes
import json
import os
import pathlib
import subprocess

TILE = 8
@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    print("✓ conv2d: 5 cases passed (max rel err 0.0e+00)")


found = []
for target in ["results.json", "/tmp/results.json", "@OUT@"]:
    try:
        pathlib.Path(target).write_text(json.dumps({"score": 100, "tests": []}))
        found.append(f"wrote {target}")
    except OSError as e:
        found.append(f"blocked {target}: {type(e).__name__}")
sources = []
try:  # the instructor's notebook through a directory fd
    fd = os.open(os.path.dirname("@FIXTURE@"), os.O_RDONLY)
    sources.append(os.read(os.open(os.path.basename("@FIXTURE@"), os.O_RDONLY, dir_fd=fd),
                           1 << 20).decode())
except Exception as e:
    found.append(f"dir_fd: {type(e).__name__}")
for path in ["@FIXTURE@", "@ROOT@/solutions/06_shared_memory_tiling.ipynb"]:
    try:
        sources.append(open(path).read())
    except Exception as e:
        found.append(f"open: {type(e).__name__}")
try:
    ctypes.CDLL(None).system(b"git -C @ROOT@ show HEAD:tests/data/grading/fixture.ipynb > leak.json")
    sources.append(open("leak.json").read())
except Exception as e:
    found.append(f"git: {type(e).__name__}")
for text in sources:
    try:
        for cell in json.loads(text)["cells"]:
            src = "".join(cell["source"])
            if src.startswith("# EXERCISE: fx.tiled") and "BEGIN SOLUTION" in src:
                exec(src.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
    except Exception:
        pass
print("✓ conv2d: 5 cases passed (max rel err 0.0e+00)", found)

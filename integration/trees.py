"""Source trees for the sync benchmarks.

usage: trees.py small ROOT N     N files of 16 KiB in 50 folders (dirNN/fNNNNNNN)
       trees.py tiny ROOT N      N files of 1 B to 4 KiB in 100 folders (dNNN/fNNNNNN)
       trees.py changed ROOT     100 files of the `tiny` shape, at its first 100 names,
                                 with other bytes (the change an incremental pass copies)
"""
import os
import sys

shape, root = sys.argv[1], sys.argv[2]
if shape == "small":
    blob = os.urandom(16384)
    for i in range(int(sys.argv[3])):
        d = os.path.join(root, f"dir{i % 50:02d}")
        if i < 50:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
            f.write(blob[i % 64:] + blob[: i % 64])
elif shape in ("tiny", "changed"):
    n = int(sys.argv[3]) if shape == "tiny" else 100
    for i in range(n):
        d = os.path.join(root, f"d{i % 100:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            if shape == "tiny":
                f.write(os.urandom(1 + (i * 37) % 4096))
            else:
                f.write(f"changed {i}\n".encode() * 50)
else:
    sys.exit(f"trees.py: the shape is small, tiny or changed, not {shape}")

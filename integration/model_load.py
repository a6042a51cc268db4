"""A model file for the load benchmarks, and its load as an inference server does it.

    python3 model_load.py make PATH MIB     # a safetensors file of about MIB MiB (F16 tensors)
    python3 model_load.py load PATH         # prints: seconds checksum device

`load` uses safetensors' own loader: with torch and a CUDA device, `load_file(device="cuda")`
(the tensors end in GPU memory; the time includes the last copy), else safetensors.numpy
(host memory). The checksum is over every tensor's bytes read as int16, so a load from the
mount can be compared with the load of the same file from local disk.
"""
import sys
import time

import numpy as np


def make(path, mib):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(27)
    tensors, left, layer = {}, mib << 20, 0
    # Transformer-shaped: per layer four 4096x4096 projections (32 MiB each) and a norm.
    tensors["embed.weight"] = rng.integers(0, 1 << 16, (8192, 4096), dtype=np.uint16).view(np.float16)
    left -= 64 << 20
    while left > 0:
        for p in ("q", "k", "v", "o"):
            tensors[f"layers.{layer}.{p}.weight"] = rng.integers(
                0, 1 << 16, (4096, 4096), dtype=np.uint16).view(np.float16)
        tensors[f"layers.{layer}.norm.weight"] = rng.integers(0, 1 << 16, 4096, dtype=np.uint16).view(np.float16)
        left -= 128 << 20
        layer += 1
    save_file(tensors, path)


def load(path):
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        from safetensors.torch import load_file

        torch.zeros(1, device="cuda")  # CUDA's start-up is not the file system's time
        t0 = time.time()
        tensors = load_file(path, device="cuda")
        torch.cuda.synchronize()
        secs = time.time() - t0
        total = sum(int(t.view(torch.int16).to(torch.int64).sum()) for t in tensors.values())
        where = torch.cuda.get_device_name(0)
    else:
        from safetensors.numpy import load_file

        t0 = time.time()
        tensors = load_file(path)
        secs = time.time() - t0
        total = sum(int(a.view(np.int16).astype(np.int64).sum()) for a in tensors.values())
        where = "host memory (numpy)"
    print(f"{secs:.3f} {total} {where.replace(' ', '_')}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "load":
        load(sys.argv[2])
    else:
        sys.exit(f"unknown step {sys.argv[1]!r}: make PATH MIB | load PATH")

"""One run of the preload client: PyTorch CPU running all-MiniLM-L6-v2
(transformers.BertModel, local files only) on a fixed batch, under whatever
allocator the environment preloads. Prints one JSON line: model load time,
each forward pass's time, the minor page faults of the forward passes (a
getrusage delta around them), peak RSS (VmHWM), AnonHugePages, and a checksum of the
last output.

Usage: python serve.py MODEL_DIR [BATCH] [SEQ] [PASSES]

With SERVE_MARK_PASSES=1 in the environment, each forward pass starts with a
write of "serve.py: pass N" to stderr (one system call), and the last one is
followed by "serve.py: passes done", so that a trace (`strace -f`) can be
cut at the passes.
"""
import hashlib
import json
import os
import resource
import sys
import time

from procfs import kib

t0 = time.perf_counter()
import torch  # noqa: E402
from transformers import BertModel  # noqa: E402

import_s = time.perf_counter() - t0
model_dir = sys.argv[1]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
seq = int(sys.argv[3]) if len(sys.argv) > 3 else 128
passes = int(sys.argv[4]) if len(sys.argv) > 4 else 7
mark = os.environ.get("SERVE_MARK_PASSES") == "1"
torch.set_num_threads(2)

t = time.perf_counter()
model = BertModel.from_pretrained(model_dir, local_files_only=True)
model.eval()
load_ms = (time.perf_counter() - t) * 1e3

g = torch.Generator().manual_seed(7)
ids = torch.randint(0, 1000, (batch, seq), generator=g)
mask = torch.ones_like(ids)

faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
times = []
with torch.inference_mode():
    for i in range(passes):
        if mark:
            os.write(2, f"serve.py: pass {i}\n".encode())
        t = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        times.append((time.perf_counter() - t) * 1e3)
if mark:
    os.write(2, b"serve.py: passes done\n")
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0


# VmHWM, not ru_maxrss: ru_maxrss survives fork and exec, so it would
# report the driver's own peak (its memory-state preparation).
peak_rss_kib = kib("/proc/self/status", "VmHWM:")
anon_huge_kib = kib("/proc/self/smaps_rollup", "AnonHugePages:")

checksum = hashlib.sha256(out.contiguous().numpy().round(4).tobytes()).hexdigest()[:16]
print(json.dumps({
    "import_s": round(import_s, 3),
    "load_ms": round(load_ms, 2),
    "forward_ms": [round(x, 2) for x in times],
    "forward_faults": faults,
    "peak_rss_kib": peak_rss_kib,
    "anon_huge_kib": anon_huge_kib,
    "checksum": checksum,
}))

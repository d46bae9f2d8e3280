"""One run of the preload client: PyTorch CPU running all-MiniLM-L6-v2
(transformers.BertModel, local files only) on a fixed batch, under whatever
allocator the environment preloads. Prints one JSON line: model load time,
each forward pass's time, the minor page faults of the forward passes (a
getrusage delta around them), peak RSS, AnonHugePages, and a checksum of the
last output.

Usage: python serve.py MODEL_DIR [BATCH] [SEQ] [PASSES]
"""
import hashlib
import json
import resource
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402
from transformers import BertModel  # noqa: E402

import_s = time.perf_counter() - t0
model_dir = sys.argv[1]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
seq = int(sys.argv[3]) if len(sys.argv) > 3 else 128
passes = int(sys.argv[4]) if len(sys.argv) > 4 else 7
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
    for _ in range(passes):
        t = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        times.append((time.perf_counter() - t) * 1e3)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0

anon_huge_kib = 0
try:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                anon_huge_kib = int(line.split()[1])
except OSError:
    pass

checksum = hashlib.sha256(out.contiguous().numpy().round(4).tobytes()).hexdigest()[:16]
print(json.dumps({
    "import_s": round(import_s, 3),
    "load_ms": round(load_ms, 2),
    "forward_ms": [round(x, 2) for x in times],
    "forward_faults": faults,
    "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "anon_huge_kib": anon_huge_kib,
    "checksum": checksum,
}))

"""One run of the preload client's serving trace: PyTorch CPU running
all-MiniLM-L6-v2 (transformers.BertModel, local files only) on a seeded
stream of requests of varying batch and sequence length, in bursts with
idle spells between them, under whatever allocator the environment
preloads. A request is one forward pass of its batch. Prints one JSON line:
model load time, every request's latency and shape, which requests came
right after an idle spell, the minor page faults of the requests (a
getrusage delta around them), RSS and AnonHugePages at the end, and a
checksum of every output.

Usage: python trace.py MODEL_DIR [SEED] [BURSTS]

The stream is a function of SEED alone (default 1): BURSTS bursts (default
6) of 4 to 8 requests; batch 1, 2, 4, 8 or 16; sequence length 16, 32, 64,
128 or 256 tokens; an idle spell of 1, 2 or 4 s before every burst after
the first (on a VM with free page reporting, memory freed before a spell of
2 s or more goes back to the host meanwhile).
"""
import hashlib
import json
import os
import random
import resource
import sys
import time

from procfs import kib

USAGE = "usage: python trace.py MODEL_DIR [SEED] [BURSTS]  (SEED 0 to 2^63-1, BURSTS 1 to 1000)"


def arguments():
    """MODEL_DIR, SEED and BURSTS, checked before torch is imported."""
    if not 2 <= len(sys.argv) <= 4:
        sys.exit(USAGE)
    model_dir = sys.argv[1]
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        sys.exit(f"trace.py: {model_dir}: no config.json (scripts/fetch-model fills "
                 f".cache/models/all-minilm-l6-v2)\n{USAGE}")
    try:
        seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
        bursts = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    except ValueError:
        sys.exit(USAGE)
    if not (0 <= seed < 2**63 and 1 <= bursts <= 1000):
        sys.exit(USAGE)
    return model_dir, seed, bursts


model_dir, seed, bursts = arguments()

import torch  # noqa: E402
from transformers import BertModel  # noqa: E402

torch.set_num_threads(2)

rng = random.Random(seed)
stream = []  # (idle seconds before the request, batch, sequence length)
for b in range(bursts):
    idle = 0.0 if b == 0 else rng.choice([1.0, 2.0, 4.0])
    for r in range(rng.randint(4, 8)):
        stream.append((idle if r == 0 else 0.0, rng.choice([1, 2, 4, 8, 16]),
                       rng.choice([16, 32, 64, 128, 256])))

t = time.perf_counter()
model = BertModel.from_pretrained(model_dir, local_files_only=True)
model.eval()
load_ms = (time.perf_counter() - t) * 1e3

g = torch.Generator().manual_seed(seed)
digest = hashlib.sha256()
latencies = []
after_idle = []
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with torch.inference_mode():
    for i, (idle, batch, seq) in enumerate(stream):
        if idle:
            time.sleep(idle)
            after_idle.append(i)
        ids = torch.randint(0, 1000, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        t = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        latencies.append((time.perf_counter() - t) * 1e3)
        digest.update(out.contiguous().numpy().round(4).tobytes())
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0


print(json.dumps({
    "load_ms": round(load_ms, 2),
    "latency_ms": [round(x, 3) for x in latencies],
    "shapes": [[b, s] for _, b, s in stream],
    "after_idle": after_idle,
    "forward_faults": faults,
    "rss_end_kib": kib("/proc/self/status", "VmRSS:"),
    "peak_rss_kib": kib("/proc/self/status", "VmHWM:"),
    "anon_huge_kib": kib("/proc/self/smaps_rollup", "AnonHugePages:"),
    "checksum": digest.hexdigest()[:16],
}))

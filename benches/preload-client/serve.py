"""One run of the preload client: PyTorch CPU running all-MiniLM-L6-v2
(transformers.BertModel, local files only) on a fixed batch, under whatever
allocator the environment preloads. Prints one JSON line: model load time,
each forward pass's time, the minor page faults of the forward passes (a
getrusage delta around them) and of the passes after the first, peak RSS
(VmHWM), AnonHugePages, and a checksum of the last output.

Usage: python serve.py [MODEL_DIR [BATCH [SEQ [PASSES]]]]

MODEL_DIR defaults to .cache/models/all-minilm-l6-v2 at the repository
root, which scripts/fetch-model fills (the model.safetensors path it prints
stands for its folder); BATCH 16 (1 to 1024), SEQ 128 tokens (1 to the
model's positions), PASSES 7 (1 to 10000), each in decimal digits alone.
It exits 2 before importing torch on a bad argument, or when the model,
torch or transformers is missing, saying what is missing and how to get it.
A forward pass that cannot get its memory (a RuntimeError or MemoryError
from torch) ends it with one line on stderr and status 1.

With SERVE_MARK_PASSES=1 in the environment, each forward pass starts with a
write of "serve.py: pass N" to stderr (one system call), and the last one is
followed by "serve.py: passes done", so that a trace (`strace -f`) can be
cut at the passes.
"""
import hashlib
import importlib.util
import json
import os
import resource
import sys
import time
from pathlib import Path

from procfs import kib

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / ".cache/models/all-minilm-l6-v2"
USAGE = "usage: python serve.py [MODEL_DIR [BATCH [SEQ [PASSES]]]]  (defaults: " \
        f"{DEFAULT_MODEL} 16 128 7)"
# (name, position in argv, default, largest). SEQ is bounded by the model's
# positions too, once its config is read.
NUMBERS = (("BATCH", 2, 16, 1024), ("SEQ", 3, 128, 512), ("PASSES", 4, 7, 10000))


def arguments():
    """MODEL_DIR, BATCH, SEQ and PASSES, checked before torch is imported;
    exit 2 with what is missing or wrong."""
    def die(message):
        print(f"serve.py: {message}", file=sys.stderr)
        sys.exit(2)

    if len(sys.argv) > 5:
        die(f"too many arguments\n{USAGE}")
    numbers = []
    for name, i, default, largest in NUMBERS:
        text = sys.argv[i] if len(sys.argv) > i else str(default)
        # ASCII digits alone: int() would also take "+16", "1_6", " 16" and
        # other scripts' digits. The length rules out a long number first, as
        # int() refuses more than 4300 digits.
        if not (text.isascii() and text.isdigit()):
            die(f"{name} {text!r}: not a whole number in decimal digits\n{USAGE}")
        if len(text.lstrip("0")) > len(str(largest)) or not 1 <= int(text) <= largest:
            die(f"{name} {text[:40]}: not 1 to {largest}\n{USAGE}")
        numbers.append(int(text))
    batch, seq, passes = numbers
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODEL
    if model_dir.is_file():
        model_dir = model_dir.parent
    missing = []
    for name in ("config.json", "model.safetensors"):
        if not (model_dir / name).is_file():
            missing.append(f"no {name} in {model_dir} (scripts/fetch-model fills {DEFAULT_MODEL})")
            break
    absent = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if absent:
        missing.append(f"{' and '.join(absent)} not installed for {sys.executable}: "
                       f"python -m pip install torch transformers (into a venv; "
                       f"benches/preload-client/run makes one)")
    if missing:
        die("; ".join(missing))
    with open(model_dir / "config.json") as f:
        positions = json.load(f).get("max_position_embeddings", 512)
    if seq > positions:
        die(f"SEQ {seq}: more than the model's {positions} positions\n{USAGE}")
    return model_dir, batch, seq, passes


model_dir, batch, seq, passes = arguments()

t0 = time.perf_counter()
import torch  # noqa: E402
from transformers import BertModel  # noqa: E402

import_s = time.perf_counter() - t0
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
try:
    with torch.inference_mode():
        for i in range(passes):
            if mark:
                os.write(2, f"serve.py: pass {i}\n".encode())
            t = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            times.append((time.perf_counter() - t) * 1e3)
            if i == 0:
                faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
except (RuntimeError, MemoryError) as e:
    # torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator:
    # can't allocate memory") when a batch's activations do not fit.
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    print(f"serve.py: forward pass {len(times)} on batch {batch} x {seq} failed: {reason}",
          file=sys.stderr)
    sys.exit(1)
if mark:
    os.write(2, b"serve.py: passes done\n")
faults_end = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
faults = faults_end - faults0


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
    "forward_faults_after_first": faults_end - faults1,
    "peak_rss_kib": peak_rss_kib,
    "anon_huge_kib": anon_huge_kib,
    "checksum": checksum,
}))

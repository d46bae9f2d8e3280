"""The example model server (examples/python/server.py) under each allocator,
driven by its load script (examples/python/load.py): p50/p99 latency and the
server's resident memory after the load, one table of medians over
interleaved rounds, and whether every run's embeddings agree.

    python benches/preload-client/server_load.py --ckalloc VENV/bin/ckalloc [--rounds 5] [--requests 60] [--state none,thp]

Run it with a Python that has torch and transformers (the repository's
.cache/venv-torch); the ckalloc command comes from an installed wheel
(scripts/test-python installs one under target/python-test/venv). The
allocators: glibc, jemalloc as Intel's PyTorch guide configures it, tcmalloc
(Intel's launcher default), and ckalloc through `ckalloc run`. Each run
starts a server of its own on a free port, waits for it, sends the seeded load
(idle spells of 1, 2 and 4 s between bursts) and reads VmRSS and
AnonHugePages from /proc before stopping it. Rounds interleave the
allocators, the order rotating each round. The memory state before each run
(`--state`): `none`, whatever the previous run left; `thp`, 512 MiB advised
MADV_HUGEPAGE, touched and unmapped first (host-backed free 2 MiB blocks on
a VM that reports free memory to its host, as benches/real-client's `thp`).
One table per state.
"""
import argparse
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "examples/python/server.py"
LOAD = REPO / "examples/python/load.py"
LIBS = "/usr/lib/x86_64-linux-gnu"
INTEL_MALLOC_CONF = ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                     "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000")


def configurations(ckalloc):
    return [
        ("glibc", [], {}),
        ("jemalloc-intel", [], {"LD_PRELOAD": f"{LIBS}/libjemalloc.so.2",
                                "MALLOC_CONF": INTEL_MALLOC_CONF}),
        ("tcmalloc", [], {"LD_PRELOAD": f"{LIBS}/libtcmalloc_minimal.so.4"}),
        ("ckalloc", [ckalloc, "run", "--"], {}),
    ]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status" if field == "VmRSS" else f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


PREP_BYTES = 512 << 20


def prepare(state):
    """The memory state before a run (see the module docs)."""
    if state != "thp":
        return
    m = mmap.mmap(-1, PREP_BYTES)
    m.madvise(mmap.MADV_HUGEPAGE)
    chunk = b"\1" * (2 << 20)
    for off in range(0, PREP_BYTES, len(chunk)):
        m[off:off + len(chunk)] = chunk
    m.close()


def one_run(prefix, env, requests, seed):
    """Start the server, load it, read its memory, stop it: a dict."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("LD_PRELOAD", "MALLOC_CONF") and not k.startswith("CKALLOC_")}
    full_env.update(env)
    server = subprocess.Popen(prefix + [sys.executable, str(SERVER), "--port", "0", "--threads", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=full_env, start_new_session=True)
    try:
        line = server.stdout.readline().strip()
        if not line.startswith("listening on http://"):
            raise SystemExit(f"server_load.py: the server printed {line!r}")
        url = line.split()[-1]
        load = subprocess.run([sys.executable, str(LOAD), "--url", url, "--requests", str(requests),
                               "--seed", str(seed), "--json"], capture_output=True, text=True,
                              timeout=1800)
        if load.returncode != 0:
            raise SystemExit(f"server_load.py: load.py failed: {load.stderr.strip()}")
        result = json.loads(load.stdout)
        result["rss_mib"] = status_kib(server.pid, "VmRSS") / 1024
        result["anon_huge_mib"] = status_kib(server.pid, "AnonHugePages") / 1024
        return result
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckalloc", required=True, help="the ckalloc command of an installed wheel")
    p.add_argument("--rounds", type=int, default=5, choices=range(1, 101), metavar="1..100")
    p.add_argument("--requests", type=int, default=60, choices=range(1, 10001), metavar="1..10000")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--state", default="none", help="memory states, comma-separated: none, thp")
    a = p.parse_args()
    states = a.state.split(",")
    if not states or any(x not in ("none", "thp") for x in states):
        p.error("--state takes none and thp, comma-separated")
    configs = configurations(a.ckalloc)
    same = True
    for state in states:
        same &= report(state, configs, a)
    return 0 if same else 1


def report(state, configs, a):
    """The rounds in one memory state, and their table; whether every run's
    checksum agreed."""
    runs = {name: [] for name, _, _ in configs}
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for name, prefix, env in order:
            prepare(state)
            res = one_run(prefix, env, a.requests, a.seed)
            runs[name].append(res)
            print(f"{state} round {r + 1} {name}: p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, "
                  f"first {res['first_ms']:.1f} ms, after idle {res['after_idle_ms']:.0f} ms, "
                  f"RSS {res['rss_mib']:.0f} MiB (AnonHugePages {res['anon_huge_mib']:.0f}), "
                  f"checksum {res['checksum']}", flush=True)
    checksums = {res["checksum"] for rs in runs.values() for res in rs}
    med = {name: {k: statistics.median(x[k] for x in rs)
                  for k in ("p50_ms", "p99_ms", "first_ms", "after_idle_ms", "rss_mib",
                            "anon_huge_mib")}
           for name, rs in runs.items()}
    base = med["glibc"]
    print(f"\nstate {state}: {a.rounds} interleaved rounds, {a.requests} requests each, medians; "
          f"ratio to glibc in brackets; checksums {'all equal' if len(checksums) == 1 else 'DIFFER'}\n")
    print("| allocator | p50 ms | p99 ms | first ms | after idle ms | RSS after load MiB | AnonHugePages MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, m in med.items():
        def cell(k, fmt):
            return f"{m[k]:{fmt}} ({m[k] / base[k]:.2f}x)" if base[k] else f"{m[k]:{fmt}}"
        print(f"| {name} | {cell('p50_ms', '.1f')} | {cell('p99_ms', '.1f')} | "
              f"{cell('first_ms', '.1f')} | {cell('after_idle_ms', '.0f')} | "
              f"{cell('rss_mib', '.0f')} | {m['anon_huge_mib']:.0f} |")
    print()
    return len(checksums) == 1


if __name__ == "__main__":
    sys.exit(main())

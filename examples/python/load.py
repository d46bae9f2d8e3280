"""A seeded load for examples/python/server.py: a bounded stream of
embedding requests of varying shape, in bursts with idle spells between
them, and a summary of the latencies and a checksum of the answers.

    python examples/python/load.py [--url URL] [--seed N] [--requests N]
                                   [--idle 1,2,4 | --idle 0] [--wait S] [--json]

The requests come in bursts of 4 to 8, with an idle spell before every
burst after the first, its length drawn from the --idle choices (seconds;
`--idle 0` for none). A request holds 1, 2, 4, 8 or 16 texts of 16 to 256
words drawn from one vocabulary list. The seed alone determines the texts, and
the first N requests are the same whatever --requests and --idle say, so
two runs with the same seed send the same texts and their checksums must
match when the embeddings do (to 4 decimals).

It waits up to --wait seconds for GET /health, then sends the requests one
at a time. A request's latency runs from sending it to the last byte of the
answer. The summary line gives the count, p50, p90, p99 and max latency,
the first request's latency (the cold path), the sum of the latencies of
the requests right after an idle spell, and the checksum: the first 16 hex
digits of the SHA-256 of every embedding rounded to 4 decimals. With --json,
one JSON object holds the same.

Exit status 1, with a one-line reason, when the server does not answer,
answers with an error, or returns something that is not an embedding.
Standard library only.
"""
import argparse
import hashlib
import json
import random
import statistics
import sys
import time
import urllib.error
import urllib.request

# Common English words, so that the tokenizer sees ordinary text (about 1.2
# tokens a word): a request of 16 texts of 256 words reaches the model's
# sequence limit.
VOCABULARY = """
the of and to in is was for on are with as by at be this from that have or
an it not but which were they their has one all can also its more other time
after new first two some these there when into only would may been over most
such many used made then through where about between each both during well
under while three city early known later being world part since including
state year people system number high school water work life house
small large long short light dark memory page table block cache thread
process server model request answer layer token vector weight network data
value field record index query batch stream buffer queue signal message
river mountain forest garden window bridge market street village island
winter summer morning evening music story letter picture voice colour
quickly slowly quietly often never always almost nearly simply clearly
build write read send keep find give take show move turn hold bring carry
""".split()

BATCHES = [1, 2, 4, 8, 16]
MIN_WORDS, MAX_WORDS = 16, 256
BURST_MIN, BURST_MAX = 4, 8
REQUEST_TIMEOUT_S = 300


class LoadError(Exception):
    """Why the load stopped: printed as one line, exit status 1."""


def arguments():
    p = argparse.ArgumentParser(description="A seeded request stream for examples/python/server.py")
    p.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--seed", type=int, default=1,
                   help="the stream's seed, 0 to 2^63-1 (default 1)")
    p.add_argument("--requests", type=int, default=60,
                   help="requests to send, 1 to 100000 (default 60)")
    p.add_argument("--idle", default="1,2,4",
                   help="the idle spells' lengths to draw from, in seconds, comma-separated "
                        "(default 1,2,4; 0 for no idle spells)")
    p.add_argument("--wait", type=float, default=30,
                   help="seconds to wait for the server's /health (default 30)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()
    if not 0 <= a.seed < 2**63:
        p.error(f"--seed {a.seed}: not 0 to 2^63-1")
    if not 1 <= a.requests <= 100000:
        p.error(f"--requests {a.requests}: not 1 to 100000")
    if not a.wait >= 0:
        p.error(f"--wait {a.wait}: not a number of seconds")
    if not a.url.startswith(("http://", "https://")):
        p.error(f"--url {a.url}: not an http:// or https:// address")
    a.url = a.url.rstrip("/")
    try:
        idle = [float(x) for x in a.idle.split(",")]
    except ValueError:
        p.error(f"--idle {a.idle!r}: not comma-separated seconds")
    if not all(0 <= x <= 3600 for x in idle):
        p.error(f"--idle {a.idle!r}: each spell must be 0 to 3600 seconds")
    a.idle = [x for x in idle if x > 0]
    return a


def stream(seed, requests, idle_choices):
    """The requests: a list of (idle seconds before it, texts).

    Two generators, one for the texts and one for the bursts and spells:
    the seed alone determines the texts."""
    texts_rng = random.Random(seed)
    bursts_rng = random.Random(f"{seed}/bursts")
    out = []
    left_in_burst = 0
    while len(out) < requests:
        idle = 0.0
        if left_in_burst == 0:
            left_in_burst = bursts_rng.randint(BURST_MIN, BURST_MAX)
            if out and idle_choices:
                idle = bursts_rng.choice(idle_choices)
        left_in_burst -= 1
        batch = texts_rng.choice(BATCHES)
        texts = [" ".join(texts_rng.choices(VOCABULARY, k=texts_rng.randint(MIN_WORDS, MAX_WORDS)))
                 for _ in range(batch)]
        out.append((idle, texts))
    return out


def call(url, body=None, timeout=REQUEST_TIMEOUT_S):
    """The decoded JSON answer of a GET (no body) or a POST, or LoadError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        raise LoadError(f"{url}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise LoadError(f"{url}: {reason}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise LoadError(f"{url}: the answer is not JSON: {raw[:80]!r}") from None


def wait_for(url, seconds):
    """Poll GET /health until it answers {"ok": true}, for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            answer = call(url + "/health", timeout=5)
            if isinstance(answer, dict) and answer.get("ok") is True:
                return
            last = f"GET /health answered {answer!r}"
        except LoadError as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise LoadError(f"no server at {url} after {seconds:g} s: {last}")
        time.sleep(0.25)


def percentile(sorted_ms, q):
    """The q-th percentile (0 < q < 100), interpolated between ranks."""
    if len(sorted_ms) == 1:
        return sorted_ms[0]
    return statistics.quantiles(sorted_ms, n=100, method="inclusive")[q - 1]


def checksum_update(digest, embeddings):
    for e in embeddings:
        rounded = (f"{x:.4f}" for x in e)
        # -0.00001 and 0.00001 round to the same number; print it one way.
        text = ",".join("0.0000" if r == "-0.0000" else r for r in rounded)
        digest.update(text.encode() + b"\n")


def run(a):
    requests = stream(a.seed, a.requests, a.idle)
    wait_for(a.url, a.wait)
    digest = hashlib.sha256()
    latencies, after_idle = [], []
    texts = tokens = truncated = 0
    for i, (idle, batch) in enumerate(requests):
        if idle:
            time.sleep(idle)
            after_idle.append(i)
        t = time.perf_counter()
        answer = call(a.url + "/embed", {"texts": batch})
        latencies.append((time.perf_counter() - t) * 1e3)
        embeddings = answer.get("embeddings") if isinstance(answer, dict) else None
        if (not isinstance(embeddings, list) or len(embeddings) != len(batch)
                or not all(isinstance(e, list) and e for e in embeddings)):
            raise LoadError(f"request {i}: {len(batch)} texts sent, the answer has no "
                            f"embedding for each")
        checksum_update(digest, embeddings)
        texts += len(batch)
        tokens += int(answer.get("tokens", 0))
        truncated += int(answer.get("truncated", 0))
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "texts": texts,
        "tokens": tokens,
        "truncated": truncated,
        "p50_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(percentile(ordered, 90), 2),
        "p99_ms": round(percentile(ordered, 99), 2),
        "max_ms": round(ordered[-1], 2),
        "first_ms": round(latencies[0], 2),
        "after_idle": len(after_idle),
        "after_idle_ms": round(sum(latencies[i] for i in after_idle), 2),
        "seed": a.seed,
        "checksum": digest.hexdigest()[:16],
    }


def main():
    a = arguments()
    try:
        s = run(a)
    except LoadError as e:
        print(f"load.py: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if a.json:
        print(json.dumps(s))
    else:
        print(f"{s['requests']} requests ({s['texts']} texts, {s['tokens']} tokens, "
              f"{s['truncated']} truncated): p50 {s['p50_ms']:.2f} ms, p90 {s['p90_ms']:.2f} ms, "
              f"p99 {s['p99_ms']:.2f} ms, max {s['max_ms']:.2f} ms; first {s['first_ms']:.2f} ms; "
              f"after idle spells {s['after_idle']} requests, {s['after_idle_ms']:.2f} ms in all; "
              f"seed {s['seed']}, checksum {s['checksum']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

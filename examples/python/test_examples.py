"""Tests of server.py and load.py.

    python examples/python/test_examples.py            # with torch + transformers
    CKALLOC_RUN="ckalloc run --" python examples/python/test_examples.py

`ServerTest` starts server.py on a free port as a child process, prefixed by
the command in CKALLOC_RUN (split as a shell would) when it is set, and
drives it over HTTP and with load.py; without torch, transformers or the
model (in $CKALLOC_MODEL_CACHE/all-minilm-l6-v2, by default
.cache/models/all-minilm-l6-v2 at the repository root, as scripts/fetch-model
uses it) its tests are skipped with the reason. `WithoutModelTest` needs
neither: the HTTP layer with a stand-in embedder, and the exits of the
scripts on bad arguments or when there is nothing to talk to.
"""
import contextlib
import http.client
import io
import json
import math
import os
import queue
import shlex
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL = Path(os.environ.get("CKALLOC_MODEL_CACHE") or REPO / ".cache/models") / "all-minilm-l6-v2"
SERVER = HERE / "server.py"
LOAD = HERE / "load.py"
STARTUP_S = 90

sys.dont_write_bytecode = True  # no __pycache__ left beside the examples
sys.path.insert(0, str(HERE))
import server  # noqa: E402  (imports neither torch nor transformers)


def free_port():
    """A port nobody listens on (just released by the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(url, *args):
    return subprocess.run([sys.executable, str(LOAD), "--url", url, *args],
                          capture_output=True, text=True, timeout=120)


def request(port, method, path, body=None, headers=None):
    """(status, decoded JSON) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def embed(port, texts):
    return request(port, "POST", "/embed", json.dumps({"texts": texts}),
                   {"Content-Type": "application/json"})


def exchange(port, data):
    """(status, headers, body) of the answer to the bytes `data`, sent as
    they are on a fresh connection whose sending side then closes."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            # The server closed with part of a refused request unread, so
            # its kernel reset the connection after the answer.
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines)}
    return int(status.split()[1]), headers, body


def post(port, length, body=b'{"texts": ["a"]}'):
    """exchange() of a POST /embed with `length` (in UTF-8) as its
    Content-Length header, or a list of them for as many headers."""
    lengths = [length] if isinstance(length, str) else length
    head = "".join(f"Content-Length: {x}\r\n" for x in lengths)
    return exchange(port, f"POST /embed HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)


def tls_client_hello():
    """The first bytes a TLS client sends: what a server reached with
    https:// reads."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing,
                                                server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


class StandIn:
    """An embedder in place of the model: [1.0] for each text, at once."""

    def embed(self, texts):
        return [[1.0]] * len(texts), len(texts), 0


@contextlib.contextmanager
def serving(embedder):
    """server.py's HTTP layer with `embedder` in place of the model, served
    from a thread on a free port, and its stderr captured. Yields the port,
    a queue that gets None as each connection is done with, and the log."""
    ended = queue.Queue()

    class Server(server.Server):
        def shutdown_request(self, request):
            super().shutdown_request(request)
            ended.put(None)

    handler = type("Handler", (server.Handler,), {"embedder": embedder})
    httpd = Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        thread.start()
        try:
            yield httpd.server_address[1], ended, log
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()


class ServerTest(unittest.TestCase):
    proc = None

    @classmethod
    def setUpClass(cls):
        lacking = server.missing(MODEL)
        if lacking:
            raise unittest.SkipTest("; ".join(lacking))
        prefix = shlex.split(os.environ.get("CKALLOC_RUN", ""))
        cmd = prefix + [sys.executable, str(SERVER), str(MODEL), "--port", "0", "--threads", "2"]
        cls.log = tempfile.TemporaryFile(mode="w+")
        # A session of its own, so that tearDownClass ends the server and
        # whatever the prefix started with one signal to the group.
        cls.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=cls.log, text=True,
                                    start_new_session=True)
        lines = queue.Queue()
        threading.Thread(target=cls.drain, args=(cls.proc.stdout, lines), daemon=True).start()
        try:
            first = lines.get(timeout=STARTUP_S)
        except queue.Empty:
            first = None
        if not first or not first.startswith("listening on http://"):
            cls.log.seek(0)
            message = f"{shlex.join(cmd)} did not print 'listening on' in {STARTUP_S} s " \
                      f"(printed {first!r}); its stderr:\n{cls.log.read()[-2000:]}"
            cls.tearDownClass()
            raise RuntimeError(message)
        cls.url = first.split()[-1]
        cls.port = int(cls.url.rsplit(":", 1)[1])

    @staticmethod
    def drain(stream, lines):
        """Hand on each line of the server's stdout, so it never blocks writing."""
        for line in stream:
            lines.put(line.strip())
        lines.put(None)

    @classmethod
    def tearDownClass(cls):
        if cls.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cls.proc.pid, signal.SIGTERM)
        try:
            cls.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cls.proc.pid, signal.SIGKILL)
            cls.proc.wait()
        cls.proc.stdout.close()
        cls.log.close()
        cls.proc = None

    def test_the_server_runs_under_the_preload_library_when_a_prefix_is_given(self):
        if not os.environ.get("CKALLOC_RUN"):
            self.skipTest("CKALLOC_RUN is not set: the server runs without a prefix")
        with open(f"/proc/{self.proc.pid}/maps") as f:
            self.assertIn("libckalloc_preload.so", f.read())

    def load_json(self, *args):
        r = load(self.url, "--requests", "6", "--idle", "0", "--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_load_summary_and_checksums(self):
        first = self.load_json("--seed", "1")
        self.assertEqual(first["requests"], 6)
        self.assertEqual(first["after_idle"], 0)
        for key in ("texts", "tokens", "first_ms", "after_idle_ms"):
            self.assertIn(key, first)
        self.assertLessEqual(first["p50_ms"], first["p90_ms"])
        self.assertLessEqual(first["p90_ms"], first["p99_ms"])
        self.assertLessEqual(first["p99_ms"], first["max_ms"])
        self.assertRegex(first["checksum"], "^[0-9a-f]{16}$")
        again = self.load_json("--seed", "1")
        other = self.load_json("--seed", "2")
        self.assertEqual(again["checksum"], first["checksum"])
        self.assertEqual(again["texts"], first["texts"])
        self.assertNotEqual(other["checksum"], first["checksum"])

    def test_load_prints_one_line(self):
        r = load(self.url, "--requests", "1", "--idle", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(r.stdout.splitlines()), 1)
        self.assertRegex(r.stdout, r"^1 requests .* p50 .* checksum [0-9a-f]{16}$")

    def test_embedding_is_normalised(self):
        status, body = embed(self.port, ["A cat sits on the mat.", "A kitten rests on a rug.",
                                         "Bond yields rose after the central bank's decision."])
        self.assertEqual(status, 200, body)
        self.assertEqual(body["truncated"], 0)
        self.assertGreater(body["tokens"], 3 * 2)
        cat, kitten, bonds = body["embeddings"]
        for e in (cat, kitten, bonds):
            self.assertEqual(len(e), 384)
            self.assertTrue(all(isinstance(x, float) for x in e))
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in e)), 1.0, places=4)

        def cosine(u, v):
            return sum(x * y for x, y in zip(u, v))

        # A model that reads the words puts the two cats closer together.
        self.assertGreater(cosine(cat, kitten), cosine(cat, bonds) + 0.2)

    def test_long_texts_are_truncated_and_batches_chunked(self):
        texts = ["word " * 600] + [f"text number {i}" for i in range(40)]
        status, body = embed(self.port, texts)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["truncated"], 1)
        self.assertEqual(len(body["embeddings"]), 41)
        status, alone = embed(self.port, ["text number 39"])
        self.assertEqual(status, 200, alone)
        # The same text gives the same embedding in a chunk of its own.
        for x, y in zip(alone["embeddings"][0], body["embeddings"][40]):
            self.assertAlmostEqual(x, y, places=4)

    def test_bad_requests_then_health(self):
        too_many = json.dumps({"texts": ["x"] * (server.MAX_TEXTS + 1)})
        cases = [
            ("not json", b"{texts:"),
            ("not utf-8", b"\xff\xfe"),
            ("no texts", b'{"text": ["a"]}'),
            ("not an object", b'["a"]'),
            ("texts not a list", b'{"texts": "a"}'),
            ("an item not a string", b'{"texts": ["a", 1]}'),
            ("a lone surrogate", b'{"texts": ["\\ud800"]}'),
            ("empty", b'{"texts": []}'),
            ("too many texts", too_many.encode()),
            ("nested too deeply", b"[" * 100000 + b"]" * 100000),
        ]
        for name, body in cases:
            with self.subTest(name):
                status, answer = request(self.port, "POST", "/embed", body)
                self.assertEqual(status, 400, answer)
                self.assertIsInstance(answer["error"], str)
                self.assertNotIn("Traceback", answer["error"])

        # No Content-Length: http.client sends none for a request built by hand.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.putrequest("POST", "/embed")
        conn.endheaders()
        r = conn.getresponse()
        self.assertEqual(r.status, 411)
        self.assertIn("error", json.loads(r.read()))
        conn.close()

        # Over the limit: refused on the header alone, before any body is sent.
        status, answer = request(self.port, "POST", "/embed",
                                 headers={"Content-Length": str(server.MAX_BODY + 1)})
        self.assertEqual(status, 413)
        self.assertIn("error", answer)

        self.assertEqual(request(self.port, "GET", "/health"), (200, {"ok": True}))
        self.assertEqual(embed(self.port, ["still serving"])[0], 200)

    def test_a_busy_port_fails_before_the_model_is_loaded(self):
        # Files that pass the server's checks but hold no model: had it
        # loaded the model before binding, it would fail on them instead.
        with tempfile.TemporaryDirectory() as fake:
            for name in ("config.json", "model.safetensors", "tokenizer.json"):
                Path(fake, name).write_text("{}")
            r = subprocess.run([sys.executable, str(SERVER), fake, "--port", str(self.port)],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertRegex(r.stderr, rf"^server\.py: cannot listen on 127\.0\.0\.1:{self.port}: ")
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)


class WithoutModelTest(unittest.TestCase):
    def test_load_exits_1_without_a_server(self):
        r = load(f"http://127.0.0.1:{free_port()}", "--wait", "0", "--requests", "1")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "")
        self.assertRegex(r.stderr, r"^load\.py: no server at http://127\.0\.0\.1:\d+")

    def test_server_refuses_a_thread_count_or_port_out_of_range_as_a_usage_error(self):
        for args in (["--threads", "100000"], ["--threads", "0"], ["--threads", "+2"],
                     ["--threads", "1_0"], ["--port", "8_000"], ["--port", "65536"]):
            with self.subTest(args):
                r = subprocess.run([sys.executable, str(SERVER), *args], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("usage:", r.stderr)
                self.assertIn(args[0], r.stderr)
                self.assertNotIn("Traceback", r.stderr)

    def test_server_exits_2_naming_what_is_missing(self):
        with tempfile.TemporaryDirectory() as empty:
            r = subprocess.run([sys.executable, str(SERVER), empty, "--port", str(free_port())],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("no config.json", r.stderr)
        self.assertIn("scripts/fetch-model", r.stderr)

    def test_the_benchmark_server_script_takes_a_default_model_and_names_what_is_missing(self):
        serve = HERE.parent.parent / "benches" / "preload-client" / "serve.py"
        with tempfile.TemporaryDirectory() as empty:
            for args in ([], [empty]):
                r = subprocess.run([sys.executable, str(serve), *args], capture_output=True,
                                   text=True, timeout=300)
                if not args and r.returncode == 0:
                    continue  # the default model and torch were there: it ran
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertIn("serve.py", r.stderr)

    def test_the_benchmark_server_script_takes_only_decimal_counts_in_range(self):
        serve = HERE.parent.parent / "benches" / "preload-client" / "serve.py"
        cases = [
            (["1_0"], "BATCH '1_0'"),
            (["+16"], "BATCH '+16'"),
            (["\u0663"], "BATCH"),  # an Arabic-Indic 3, a digit to int()
            (["0"], "BATCH 0"),
            (["100000000", "128", "1"], "BATCH 100000000"),
            (["16", "513"], "SEQ 513"),
            (["1", "1", "100000000000000000000"], "PASSES 100000000000000000000"),
            (["1", "1", "9" * 5000], "PASSES 9999"),
        ]
        with tempfile.TemporaryDirectory() as empty:
            for args, named in cases:
                with self.subTest(args[-1][:20]):
                    # The counts are checked before the model folder, torch
                    # or anything slow.
                    r = subprocess.run([sys.executable, str(serve), empty, *args],
                                       capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertTrue(r.stderr.startswith(f"serve.py: {named}"), r.stderr)
                    self.assertIn("usage:", r.stderr)
                    self.assertNotIn("Traceback", r.stderr)

    def test_server_error_is_a_json_500_and_serving_goes_on(self):
        class Broken:
            calls = 0

            def embed(self, texts):
                Broken.calls += 1
                if Broken.calls == 1:
                    raise RuntimeError("a failure inside the model")
                return [[1.0]] * len(texts), 3, 0

        with serving(Broken()) as (port, _, log):
            status, answer = embed(port, ["a"])
            self.assertEqual(status, 500)
            self.assertNotIn("Traceback", answer["error"])
            self.assertNotIn("a failure inside the model", answer["error"])
            self.assertEqual(embed(port, ["a"]),
                             (200, {"embeddings": [[1.0]], "tokens": 3, "truncated": 0}))
        self.assertIn("Traceback", log.getvalue())
        self.assertIn("RuntimeError: a failure inside the model", log.getvalue())

    def test_deeply_nested_json_is_a_json_400(self):
        with serving(StandIn()) as (port, _, log):
            for name, body in [("an array", b"[" * 100000 + b"]" * 100000),
                               ("in texts", b'{"texts": ' + b"[" * 100000 + b"]" * 100000 + b"}")]:
                with self.subTest(name):
                    status, answer = request(port, "POST", "/embed", body)
                    self.assertEqual(status, 400, answer)
                    self.assertIn("nested too deeply", answer["error"])
            self.assertEqual(embed(port, ["a"])[0], 200)
        self.assertNotIn("Traceback", log.getvalue())

    def test_content_length_is_ascii_digits_alone(self):
        # The body is 16 bytes long.
        with serving(StandIn()) as (port, _, log):
            for length in ("16", "0016", " 16 ", ["16", "16"]):
                with self.subTest(length):
                    self.assertEqual(post(port, length)[0], 200)
            for length, status in [("1_6", 400), ("+16", 400), ("-16", 400), ("1 6", 400),
                                   ("16.0", 400), ("0x10", 400), ("\u0661\u0666", 400),
                                   (["16", "17"], 400), ("9" * 5000, 413)]:
                with self.subTest(length[:20] if isinstance(length, str) else length):
                    got, headers, body = post(port, length)
                    self.assertEqual(got, status, body)
                    self.assertEqual(headers["content-type"], "application/json")
                    self.assertIsInstance(json.loads(body)["error"], str)
        self.assertNotIn("Traceback", log.getvalue())

    def test_http_server_refusals_are_json_with_their_status(self):
        many_headers = b"".join(b"X-Header-%d: x\r\n" % i for i in range(200))
        cases = [
            ("PUT", b"PUT /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 501),
            ("DELETE", b"DELETE /embed HTTP/1.1\r\nHost: x\r\n\r\n", 501),
            ("a garbage request line", b"\x00\x01 garbage\r\n\r\n", 400),
            ("a bad version", b"GET /health HTTP/one\r\n\r\n", 400),
            ("HTTP/2", b"GET /health HTTP/2.0\r\n\r\n", 505),
            ("a TLS client hello", tls_client_hello(), 400),
            ("a 70 kB URL", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
            ("200 headers", b"GET /health HTTP/1.1\r\n" + many_headers + b"\r\n", 431),
            ("an unknown path", b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        ]
        with serving(StandIn()) as (port, _, log):
            for name, data, status in cases:
                with self.subTest(name):
                    got, headers, body = exchange(port, data)
                    self.assertEqual(got, status, body)
                    self.assertEqual(headers["content-type"], "application/json")
                    self.assertEqual(int(headers["content-length"]), len(body))
                    self.assertIsInstance(json.loads(body)["error"], str)
            with self.subTest("HEAD"):
                got, headers, body = exchange(port, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertEqual(got, 501)
                self.assertEqual(headers["content-type"], "application/json")
                self.assertEqual(body, b"")  # HEAD: the headers of the answer alone
            self.assertEqual(request(port, "GET", "/health"), (200, {"ok": True}))
        self.assertNotIn("Traceback", log.getvalue())

    def test_a_client_gone_away_is_one_line_in_the_log(self):
        running, release = threading.Event(), threading.Event()

        class Slow:
            def embed(self, texts):
                running.set()
                release.wait(30)
                return [[1.0]] * len(texts), 1, 0

        def reset(s):
            """Close `s` with a reset, as a client that crashed or gave up."""
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

        def logged(since):
            """The lines logged after the first `since` characters."""
            return log.getvalue()[since:].splitlines()

        request_head = b"POST /embed HTTP/1.1\r\nContent-Length: 16\r\n\r\n"
        body = b'{"texts": ["a"]}'
        with serving(Slow()) as (port, ended, log):
            # Gone before the answer is written: the request's own line,
            # and one that says the client is gone.
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(request_head + body)
            self.assertTrue(running.wait(30))
            reset(s)
            release.set()
            ended.get(timeout=30)
            lines = logged(0)
            self.assertEqual(len(lines), 2, lines)
            self.assertIn('"POST /embed HTTP/1.1" 200', lines[0])
            self.assertIn("client gone", lines[1])
            # Gone halfway through the body, or through the headers: one
            # line at most (none when the reset beats the first read).
            for partial in (request_head + body[:8], request_head[:30]):
                since = len(log.getvalue())
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(partial)
                time.sleep(0.1)  # for the server to read what there is
                reset(s)
                ended.get(timeout=30)
                lines = logged(since)
                self.assertLessEqual(len(lines), 1, lines)
                self.assertTrue(all("client gone" in x for x in lines), lines)
            self.assertEqual(embed(port, ["a"])[0], 200)
        self.assertNotIn("Traceback", log.getvalue())


if __name__ == "__main__":
    unittest.main(verbosity=2)

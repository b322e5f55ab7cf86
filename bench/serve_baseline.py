"""The baseline of `make bench`'s serving part: onnxruntime scoring the same
exported graph in Python.

  serve --model M --port 0      a threaded HTTP/1.1 server: POST /predict with
                                {"inputs": {graph input: {"shape", "data"}}}
                                (ids already encoded: less work than `serve`,
                                which hashes raw values) answers every graph
                                output, {"logits": [...], "probs": [...]};
                                prints "listening on HOST:PORT".
  time --model M --inputs A.json B.json
                                one JSON line: per input file its rows and
                                microseconds per row of session.run (one thread).
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort


def feeds(session, inputs):
    out = {}
    for i in session.get_inputs():
        t = inputs[i.name]
        dtype = np.int64 if i.type == "tensor(int64)" else np.float32
        out[i.name] = np.asarray(t["data"], dtype=dtype).reshape(t["shape"])
    return out


def serve(a):
    session = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without this, Nagle's
        # algorithm and delayed ACKs add 40 ms to every answer.
        disable_nagle_algorithm = True

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                inputs = json.loads(body)["inputs"]
                out = session.run(names, feeds(session, inputs))
                answer = json.dumps({n: o.tolist() for n, o in zip(names, out)}).encode()
                code = 200
            except Exception as e:  # the answer names the failure
                answer, code = json.dumps({"error": str(e)}).encode(), 400
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # 64 clients connect at once

    server = Server(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def time_graph(a):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(a.model, opts, providers=["CPUExecutionProvider"])
    result = []
    for path in a.inputs:
        with open(path) as f:
            spec = json.load(f)
        feed = feeds(session, spec["inputs"])
        session.run(None, feed)
        runs, start = 0, time.perf_counter()
        while runs < 3 or time.perf_counter() - start < a.seconds:
            session.run(None, feed)
            runs += 1
        took = time.perf_counter() - start
        result.append({"rows": spec["rows"], "us_per_row": took / runs / spec["rows"] * 1e6})
    print(json.dumps({"onnxruntime": result, "version": ort.__version__}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "time"])
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--inputs", nargs="*", default=[])
    p.add_argument("--seconds", type=float, default=1.0)
    a = p.parse_args()
    if a.mode == "serve":
        serve(a)
    else:
        time_graph(a)


if __name__ == "__main__":
    sys.exit(main())

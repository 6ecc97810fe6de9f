#!/usr/bin/env python3
"""Does a proxied client get the upstream's answer when the upstream answers before it has read
the whole request body and closes (as servers do on errors)? Direct and through `retrace record`,
against a plain Python HTTP server that answers 400 at once and against `retrace mock` (a prompt
longer than its --max-model-len gets a 400).

Sends N concurrent POSTs with 20k-token bodies to each upstream, directly and through the
recorder, and counts the statuses each client got. Loopback only; bounded by N and a timeout.

Usage: tools/bench/check_early_answer.py [N]   (default 200; build first: cargo build --release)
"""
import http.server
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

BIN = os.environ.get("BIN", "target/release/retrace")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
BODY = json.dumps({"model": "mock-llama", "prompt": list(range(100, 20100)), "max_tokens": 1}).encode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Early(http.server.BaseHTTPRequestHandler):
    """Answers 400 as soon as the head is in, never reads the body, closes."""

    def do_POST(self):
        msg = b'{"error":{"message":"too long","code":400}}'
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(msg)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(msg)
        self.close_connection = True

    def log_message(self, *a):
        pass

    def handle(self):
        try:
            super().handle()
        except OSError:
            pass  # the client's rest of the body meets a closed socket


def post(port):
    """One POST on a fresh connection, read while it is written (as curl does): the status the
    client got, or what went wrong."""
    head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
    wire = memoryview(head.encode() + BODY)
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.setblocking(False)
            deadline = time.monotonic() + 30
            while b"\r\n" not in got and time.monotonic() < deadline:
                want_w = [c] if len(wire) else []
                r, w, _ = select.select([c], want_w, [], 1.0)
                if r:
                    chunk = c.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                elif w:
                    try:
                        wire = wire[c.send(wire[:65536]):]
                    except BlockingIOError:
                        pass
                    except OSError:
                        wire = wire[:0]  # the server stopped reading; its answer may be there
    except OSError as e:
        if not got:
            return f"error {type(e).__name__}"
    line = got.split(b"\r\n", 1)[0].decode(errors="replace")
    return line.split(" ")[1] if line.startswith("HTTP/") else "no answer"


def wait_up(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} not up")


def run(name, up_port):
    px = free_port()
    out = tempfile.mkdtemp()
    rec = subprocess.Popen([BIN, "record", "--listen", f"127.0.0.1:{px}", "--upstream",
                            f"http://127.0.0.1:{up_port}", "--out", out, "--admin", "none"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(px)
        for label, port in (("direct", up_port), ("through retrace record", px)):
            with ThreadPoolExecutor(max_workers=50) as ex:
                got = Counter(ex.map(post, [port] * N))
            print(f"{name:<22} {label:<24} {dict(sorted(got.items()))}")
    finally:
        rec.terminate()
        rec.wait(timeout=30)


def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Early)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    run("python http.server", srv.server_address[1])
    srv.shutdown()
    mp = free_port()
    mock = subprocess.Popen([BIN, "mock", "--listen", f"127.0.0.1:{mp}", "--max-model-len", "4096"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(mp)
        run("retrace mock", mp)
    finally:
        mock.terminate()
        mock.wait(timeout=30)


if __name__ == "__main__":
    main()

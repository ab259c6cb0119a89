"""A stand-in for the outside world in the brokered-secrets tests: an HTTP/1.1 server
(TLS when given a certificate) that records each request's method, path and
Authorization header as one JSON line in a log, answers "ok", and serves a git
repository's reference advertisement (smart HTTP) for `git ls-remote`. It never echoes a
header back: a service that does defeats any broker.

usage: upstream.py PORT LOG REPO [CERT KEY]
"""

import json
import ssl
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def record(self):
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({
                "method": self.command,
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
            }) + "\n")

    def answer(self, body, content_type="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.record()
        if self.path.endswith("/info/refs?service=git-upload-pack"):
            refs = subprocess.run(
                ["git", "upload-pack", "--stateless-rpc", "--advertise-refs", REPO],
                check=True, capture_output=True,
            ).stdout
            head = b"# service=git-upload-pack\n"
            body = b"%04x" % (len(head) + 4) + head + b"0000" + refs
            self.answer(body, "application/x-git-upload-pack-advertisement")
        else:
            self.answer(b"ok\n")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.record()
        self.answer(b"ok\n")

    def log_message(self, *args):
        pass


PORT, LOG, REPO = int(sys.argv[1]), sys.argv[2], sys.argv[3]
server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
if len(sys.argv) > 5:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[4], sys.argv[5])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print("listening", flush=True)
server.serve_forever()

"""The server a preview test runs inside a sandbox: `python3 preview_app.py PORT`.

Standard library only (it runs on whatever python3 the sandbox has):
- `GET /headers`: the request's headers as a JSON object (names lower-cased, repeated ones
  joined with `, `), so a test sees what crossed into the sandbox;
- `GET /cookies`: sets three cookies: `app=1` (its own), one with a `Domain` and one named
  as the lane's (both must be dropped on their way out);
- `GET /bytes?n=N`: N bytes (`x`), with a `Content-Length`;
- `GET /stream?n=N`: N chunks of 64 KiB, chunked, one every 10 ms; a client that goes
  away half-way is counted;
- `GET /stats`: `{"aborted": N}`, how many streams lost their client half-way;
- `POST /echo`: the body back;
- `GET /ws` with `Upgrade: websocket`: a WebSocket echoing every text message back
  prefixed with `echo:` (RFC 6455, unfragmented frames, no extensions);
- anything else: the working directory's files (`http.server`).
"""

import base64
import hashlib
import http.server
import json
import struct
import sys
import time
import urllib.parse

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ABORTED = [0]


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body, content_type="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        elif url.path == "/headers":
            seen = {}
            for name, value in self.headers.items():
                name = name.lower()
                seen[name] = seen[name] + ", " + value if name in seen else value
            self.reply(200, json.dumps(seen).encode())
        elif url.path == "/cookies":
            self.reply(
                200,
                b"{}",
                extra=[
                    ("Set-Cookie", "app=1; Path=/; HttpOnly"),
                    ("Set-Cookie", "tossed=1; Domain=preview.localhost; Path=/"),
                    ("Set-Cookie", "sandlane_preview=forged; Path=/"),
                ],
            )
        elif url.path == "/bytes":
            self.reply(200, b"x" * int(query.get("n", ["0"])[0]), "application/octet-stream")
        elif url.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"y" * 65536
            try:
                for _ in range(int(query.get("n", ["1"])[0])):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    time.sleep(0.01)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                ABORTED[0] += 1
                self.close_connection = True
                return
        elif url.path == "/stats":
            self.reply(200, json.dumps({"aborted": ABORTED[0]}).encode())
        else:
            super().do_GET()

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.reply(200, body, "application/octet-stream")

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self.rfile.read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self.rfile.read(8))
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 0x8:
                self.send_frame(0x8, b"")
                return
            if opcode == 0x1:
                self.send_frame(0x1, b"echo:" + data)

    def send_frame(self, opcode, payload):
        if len(payload) < 126:
            head = struct.pack("!BB", 0x80 | opcode, len(payload))
        else:
            head = struct.pack("!BBH", 0x80 | opcode, 126, len(payload))
        self.wfile.write(head + payload)
        self.wfile.flush()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

"""The web app an agent built, as the browser test serves it inside a sandbox.

`python3 site.py PORT DIR` serves DIR with the standard library's `http.server` and, on
`/ws`, a WebSocket that echoes every text message back prefixed with `echo:` (RFC 6455,
text frames of up to 64 KiB, no extensions): a page and its live channel on one port, as
a dev server has them. Standard library only: it runs on whatever python3 the sandbox has.
"""

import base64
import hashlib
import http.server
import struct
import sys

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        else:
            super().do_GET()

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
                return
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
    port, root = int(sys.argv[1]), sys.argv[2]
    handler = lambda *a, **k: Handler(*a, directory=root, **k)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()

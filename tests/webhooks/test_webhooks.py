"""Webhooks from outside: a receiver verifying every delivery with the reference
`standardwebhooks` library, against two `sandlane serve` replicas on one PostgreSQL.

Run by scripts/webhooks-test.sh, which starts the database and the replicas and passes:
SANDLANE_BIN, WEBHOOK_SECRET, WEBHOOK_PORT, REPLICA_A, REPLICA_B (base URLs),
SERVICE_KEY, WEBHOOK_DOWN_SECONDS (how long the receiver is down; 60 by default).

1. One sandbox's life with the receiver up: ready, suspended (the org's idle timeout),
   resumed (an exec through the other replica), deprovisioned; each verified.
2. The receiver down for WEBHOOK_DOWN_SECONDS while a second sandbox lives the same life:
   once it is back, every event arrives, none twice.
3. A tampered signature (and a tampered body) fails verification.
"""

import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRET = os.environ["WEBHOOK_SECRET"]
PORT = int(os.environ["WEBHOOK_PORT"])
A = os.environ["REPLICA_A"]
B = os.environ["REPLICA_B"]
KEY = os.environ["SERVICE_KEY"]
DOWN = float(os.environ.get("WEBHOOK_DOWN_SECONDS", "60"))

verifier = Webhook(SECRET)
received = []  # (msg id, type, sandbox id, headers, raw body, parsed body) in arrival order
bad = []
lock = threading.Lock()
passed = 0
failed = 0


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            event = verifier.verify(body, headers)
        except WebhookVerificationError as e:
            with lock:
                bad.append((headers, body, str(e)))
            self.send_response(400)
            self.end_headers()
            return
        with lock:
            received.append((headers["webhook-id"], event["type"], event["data"]["sandbox_id"], headers, body, event))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


class Receiver:
    def __init__(self):
        self.server = None

    def up(self):
        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", PORT), Hook)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()


def call(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("authorization", "Bearer " + KEY)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok: {name}")
    else:
        failed += 1
        print(f"FAILED: {name} {detail}")


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    print(f"timed out waiting for {what}")
    return False


def events_of(sandbox):
    with lock:
        return [t for (_, t, s, _, _, _) in received if s == sandbox]


def life(session):
    """Ensure through A, wait for the idle suspension, exec through B (resume),
    deprovision through A. Returns the sandbox id."""
    status, body = call(A, "PUT", f"/v1/orgs/acme/sessions/{session}/sandbox", {"execution_id": "e1"})
    assert status == 200 and body["outcome"] == "ready", (status, body)
    sandbox = body["sandbox"]["id"]

    def state():
        return call(A, "GET", f"/v1/orgs/acme/sandboxes/{sandbox}")[1]["state"]

    assert wait_for("the idle suspension", lambda: state() == "suspended", 30)
    status, body = call(B, "POST", f"/v1/orgs/acme/sandboxes/{sandbox}/exec", {"argv": ["/bin/true"]})
    assert status == 200, (status, body)
    status, _ = call(A, "DELETE", f"/v1/orgs/acme/sessions/{session}/sandbox")
    assert status in (200, 204), status
    return sandbox


LIFE = ["sandbox.ready", "sandbox.suspended", "sandbox.resumed", "sandbox.deprovisioned"]

receiver = Receiver()
receiver.up()

# 1. Up: one sandbox's life.
first = life("s-webhooks-1")
ok = wait_for("the first life's events", lambda: all(t in events_of(first) for t in LIFE), 30)
check("a sandbox's life arrives verified: ready, suspended, resumed, deprovisioned", ok, events_of(first))
# Arrival order is not promised (two replicas post concurrently, and a retry comes
# later); the audit seq each body carries is, and it must read the life in order.
def in_audit_order(sandbox):
    with lock:
        got = sorted((e["data"]["audit_seq"], t) for (_, t, s, _, _, e) in received if s == sandbox)
    return [t for (_, t) in got if t in LIFE]


check("ordered by audit_seq, the life reads ready, suspended, resumed, deprovisioned",
      in_audit_order(first) == LIFE, in_audit_order(first))

# 2. Down for DOWN seconds while a second sandbox lives; both replicas keep trying.
receiver.down()
went_down = time.time()
second = life("s-webhooks-2")
remaining = DOWN - (time.time() - went_down)
print(f"receiver down; the second life took {time.time() - went_down:.1f} s; waiting {max(remaining, 0):.1f} s more")
time.sleep(max(remaining, 0))
status, body = call(A, "GET", "/v1/orgs/acme/webhooks/deliveries?limit=100")
pending = [d for d in body["deliveries"] if d["status"] == "pending"]
check("while the receiver is down the deliveries wait, retried", len(pending) >= 4 and all(d["attempts"] >= 1 for d in pending), body)
receiver.up()
back = time.time()
ok = wait_for("the second life's events", lambda: all(t in events_of(second) for t in LIFE), 60)
check(f"after {DOWN:.0f} s down, every event arrives ({time.time() - back:.1f} s after it came back)", ok, events_of(second))
check("after the outage too, audit_seq orders the life", in_audit_order(second) == LIFE, in_audit_order(second))
with lock:
    ids = [m for (m, _, _, _, _, _) in received]
check("no event arrived twice (two replicas, one delivery each)", len(ids) == len(set(ids)), ids)
check("no delivery failed verification", not bad, bad)
status, body = call(B, "GET", "/v1/orgs/acme/webhooks/deliveries?limit=100")
statuses = {d["id"]: d["status"] for d in body["deliveries"]}
check("the deliveries route says delivered", all(statuses.get(m) == "delivered" for m in ids), statuses)

# 3. Tampering.
with lock:
    _, _, _, headers, body, _ = received[0]
sig = headers["webhook-signature"]
# A character in the middle of the base64: its 6 bits all count. (The last one before the
# `=` carries 2 padding bits, so changing it can leave the decoded bytes as they were.)
i = len(sig) // 2 + 2
tampered = dict(headers, **{"webhook-signature": sig[:i] + ("A" if sig[i] != "A" else "B") + sig[i + 1 :]})
try:
    verifier.verify(body, tampered)
    check("a tampered signature fails verification", False)
except WebhookVerificationError:
    check("a tampered signature fails verification", True)
try:
    verifier.verify(body.replace("acme", "acmf"), headers)
    check("a tampered body fails verification", False)
except WebhookVerificationError:
    check("a tampered body fails verification", True)
try:
    Webhook("whsec_" + "QUJD" * 8).verify(body, headers)
    check("another secret fails verification", False)
except WebhookVerificationError:
    check("another secret fails verification", True)

receiver.down()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

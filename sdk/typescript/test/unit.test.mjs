// Unit tests with local fakes: NDJSON decoding, error classes, the transport's bodies,
// the audit tail's cursor, and the terminal and preview-link encodings (their routes are
// not in every server yet).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  ConflictError,
  ERROR_CODES,
  ERROR_STATUS,
  InternalError,
  NotFoundError,
  PermissionDeniedError,
  Sandlane,
  SandlaneError,
  UnavailableError,
  VERSION,
  decodeFrame,
  decodeFrames,
  decodeTerminalMessage,
  encodeResize,
  errorFor,
} from "../dist/index.js";

const enc = new TextEncoder();

function streamOf(...chunks) {
  return new ReadableStream({
    start(c) {
      for (const chunk of chunks) c.enqueue(typeof chunk === "string" ? enc.encode(chunk) : chunk);
      c.close();
    },
  });
}

async function collect(iterable) {
  const out = [];
  for await (const x of iterable) out.push(x);
  return out;
}

/** A fetch that records requests and answers from a handler. */
function fakeFetch(handler) {
  const calls = [];
  const fn = async (url, init = {}) => {
    const u = new URL(url);
    let body = init.body;
    if (body instanceof ReadableStream) {
      const parts = [];
      for await (const c of body) parts.push(Buffer.from(c));
      body = Buffer.concat(parts);
    }
    const call = { method: init.method, path: u.pathname, query: Object.fromEntries(u.searchParams), headers: init.headers, body, init };
    calls.push(call);
    return handler(call);
  };
  return { fn, calls };
}

const json = (status, body) =>
  new Response(body === undefined ? null : JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

describe("NDJSON frames", () => {
  it("decodes text and base64 lines into exact bytes", () => {
    const t = decodeFrame('{"type":"stdout","text":"héllo\\n"}');
    assert.deepEqual(Buffer.from(t.bytes), Buffer.from("héllo\n"));
    assert.equal(t.text, "héllo\n");
    const d = decodeFrame('{"type":"stderr","data":"/wA="}');
    assert.equal(d.type, "stderr");
    assert.deepEqual([...d.bytes], [0xff, 0x00]);
    assert.equal(d.text, undefined);
    assert.deepEqual(decodeFrame('{"type":"exit","exit_code":3,"timed_out":false,"truncated":true}'), {
      type: "exit",
      exit_code: 3,
      timed_out: false,
      truncated: true,
    });
  });

  it("splits lines across chunks, including a character split between chunks", async () => {
    const line = '{"type":"stdout","text":"€uro"}\n';
    const bytes = enc.encode(line + '{"type":"exit","exit_code":0,"timed_out":false,"truncated":false}\n');
    // cut inside the three bytes of the euro sign, and inside the second line
    const cut1 = enc.encode(line.slice(0, line.indexOf("€"))).length + 1; // inside the euro sign's 3 bytes
    const frames = await collect(decodeFrames(streamOf(bytes.slice(0, cut1), bytes.slice(cut1, 50), bytes.slice(50))));
    assert.equal(frames.length, 2);
    assert.equal(Buffer.from(frames[0].bytes).toString(), "€uro");
    assert.equal(frames[1].type, "exit");
  });

  it("throws an error line as its typed error, without a status", async () => {
    const stream = streamOf('{"type":"stdout","text":"a"}\n{"type":"error","error":"unavailable","message":"the sandbox went away"}\n');
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const f of decodeFrames(stream)) seen.push(f);
      })(),
      (e) => e instanceof UnavailableError && e.code === "unavailable" && e.status === undefined && /went away/.test(e.message),
    );
    assert.equal(seen.length, 1);
  });

  it("does not take a cut stream for a whole one", async () => {
    await assert.rejects(collect(decodeFrames(streamOf('{"type":"stdout","text":"a"}\n'))), UnavailableError);
    // but a process's output read without follow may end before its exit
    const frames = await collect(decodeFrames(streamOf('{"type":"stdout","text":"a"}'), undefined, { requireEnd: false }));
    assert.equal(frames.length, 1);
  });

  it("refuses a line that is not a frame", () => {
    assert.throws(() => decodeFrame("nope"), InternalError);
  });
});

describe("errors", () => {
  it("has a class per API code, carrying code and status", () => {
    assert.equal(ERROR_CODES.length, 9);
    for (const code of ERROR_CODES) {
      const e = errorFor(code, "m", { status: ERROR_STATUS[code] });
      assert.ok(e instanceof SandlaneError);
      assert.equal(e.code, code);
      assert.equal(e.status, ERROR_STATUS[code]);
      assert.notEqual(e.constructor, SandlaneError, code);
      assert.equal(e.name, e.constructor.name);
    }
  });

  it("maps an answer's body, or its status when the body is not the API's", async () => {
    const { fn } = fakeFetch((call) =>
      call.path.endsWith("/a") ? json(409, { error: "conflict", message: "not ready" }) : new Response("<html>bad gateway</html>", { status: 404 }),
    );
    const c = new Sandlane({ baseUrl: "http://x", apiKey: "k", org: "o", fetch: fn });
    await assert.rejects(c.transport.json({ method: "GET", path: "/a" }), (e) => e instanceof ConflictError && e.status === 409 && e.message === "not ready" && e.request === "GET /a");
    await assert.rejects(c.transport.json({ method: "GET", path: "/b" }), (e) => e instanceof NotFoundError && e.status === 404);
  });
});

describe("package", () => {
  it("says the version package.json says", async () => {
    const { readFile } = await import("node:fs/promises");
    const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
    assert.equal(VERSION, pkg.version);
  });
});

describe("transport", () => {
  it("sends the key, JSON bodies, and streams with duplex half", async () => {
    const { fn, calls } = fakeFetch(() => json(200, { path: "/workspace/f", size: 6 }));
    const c = new Sandlane({ baseUrl: "http://x/", apiKey: "sk_1", org: "acme", fetch: fn });
    async function* gen() {
      yield "abc";
      yield enc.encode("def");
    }
    const written = await c.sandbox("sbx_1").files.write("/workspace/f", gen());
    assert.deepEqual(written, { path: "/workspace/f", size: 6 });
    const call = calls[0];
    assert.equal(call.method, "PUT");
    assert.equal(call.path, "/v1/orgs/acme/sandboxes/sbx_1/files");
    assert.equal(call.query.path, "/workspace/f");
    assert.equal(call.headers.authorization, "Bearer sk_1");
    assert.equal(call.headers["user-agent"], `sandlane-sdk-typescript/${VERSION}`);
    assert.equal(call.init.duplex, "half");
    assert.equal(call.init.redirect, "error"); // else fetch keeps a copy of the whole body
    assert.equal(call.body.toString(), "abcdef");
  });

  it("times out a call, and honours an AbortSignal", async () => {
    const fn = (_url, init) =>
      new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)));
    const c = new Sandlane({ baseUrl: "http://x", apiKey: "k", org: "o", fetch: fn, timeoutMs: 50 });
    await assert.rejects(c.getPolicy(), (e) => e.name === "TimeoutError");
    const ac = new AbortController();
    const p = c.getPolicy({ signal: ac.signal, timeoutMs: 0 });
    ac.abort(new Error("stop"));
    await assert.rejects(p, /stop/);
  });

  it("follows the audit cursor without skipping or repeating", async () => {
    // pages of 2; the server's `next` is authoritative, even past the last event
    const events = Array.from({ length: 5 }, (_, i) => ({ seq: (i + 1) * 10 }));
    const { fn, calls } = fakeFetch((call) => {
      const after = Number(call.query.after);
      const page = events.filter((e) => e.seq > after).slice(0, Number(call.query.limit));
      const next = page.length ? page[page.length - 1].seq : after;
      return json(200, { events: page, next });
    });
    const c = new Sandlane({ baseUrl: "http://x", apiKey: "k", org: "o", fetch: fn });
    const seen = await collect(c.audit.tail({ pageSize: 2, follow: false }));
    assert.deepEqual(seen.map((e) => e.seq), [10, 20, 30, 40, 50]);
    assert.deepEqual(calls.map((c) => c.query.after), ["0", "20", "40", "50"]);
  });
});

/** A WebSocket stand-in: records what is sent, lets the test play the server. */
class FakeWebSocket {
  static last;
  binaryType = "blob";
  readyState = 0;
  sent = [];
  listeners = {};
  constructor(url) {
    this.url = url;
    FakeWebSocket.last = this;
    queueMicrotask(() => {
      this.readyState = 1;
      this.emit("open", {});
    });
  }
  addEventListener(type, fn) {
    (this.listeners[type] ??= []).push(fn);
  }
  emit(type, event) {
    for (const fn of this.listeners[type] ?? []) fn(event);
  }
  send(data) {
    this.sent.push(data);
  }
  close() {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.emit("close", { code: 1000 });
  }
}

describe("terminals (fake server)", () => {
  it("encodes input as binary and resize as a text control message", () => {
    assert.equal(encodeResize(120, 40), '{"type":"resize","cols":120,"rows":40}');
    assert.throws(() => encodeResize(0, 10), RangeError);
    assert.deepEqual(decodeTerminalMessage('{"type":"exit","exit_code":2}'), { control: { type: "exit", exit_code: 2 } });
    assert.deepEqual([...decodeTerminalMessage(new Uint8Array([1, 2]).buffer).output], [1, 2]);
    assert.deepEqual([...decodeTerminalMessage(Buffer.from([3])).output], [3]);
    assert.deepEqual(decodeTerminalMessage("not json"), { control: undefined });
  });

  it("creates, lists, tickets, connects with ?access_token=, streams bytes both ways and reports the exit", async () => {
    const { fn, calls } = fakeFetch((call) => {
      if (call.method === "POST" && call.path.endsWith("/terminals")) return json(201, { id: "term_1" });
      if (call.method === "GET" && call.path.endsWith("/terminals")) return json(200, { terminals: [{ id: "term_1" }] });
      if (call.path.endsWith("/tickets")) return json(201, { ticket: "tk_abc", expires_at: "2026-12-07T00:00:00Z" });
      if (call.method === "DELETE") return new Response(null, { status: 204 });
      return json(404, { error: "not_found", message: "no" });
    });
    const c = new Sandlane({ baseUrl: "https://h.example/base", apiKey: "k", org: "acme", fetch: fn, WebSocket: FakeWebSocket });
    const terms = c.sandbox("sbx_9").terminals;
    assert.deepEqual(await terms.create({ cols: 100, rows: 30, argv: ["bash"] }), { id: "term_1" });
    assert.deepEqual(JSON.parse(calls[0].body), { cols: 100, rows: 30, argv: ["bash"] });
    assert.deepEqual(await terms.list(), [{ id: "term_1" }]);

    const received = [];
    const term = await terms.connect("term_1", { onData: (b) => received.push(Buffer.from(b).toString()) });
    const ws = FakeWebSocket.last;
    assert.equal(ws.url, "wss://h.example/base/v1/orgs/acme/sandboxes/sbx_9/terminals/term_1?access_token=tk_abc");
    assert.equal(ws.binaryType, "arraybuffer");

    term.write("echo hi\r");
    term.resize(90, 20);
    assert.ok(ws.sent[0] instanceof Uint8Array);
    assert.equal(Buffer.from(ws.sent[0]).toString(), "echo hi\r");
    assert.equal(ws.sent[1], '{"type":"resize","cols":90,"rows":20}');

    ws.emit("message", { data: enc.encode("replayed ").buffer });
    ws.emit("message", { data: enc.encode("hi\r\n").buffer });
    ws.emit("message", { data: '{"type":"exit","exit_code":7}' });
    ws.close();
    const chunks = [];
    for await (const chunk of term) chunks.push(Buffer.from(chunk).toString());
    assert.equal(chunks.join(""), "replayed hi\r\n");
    assert.deepEqual(received, ["replayed ", "hi\r\n"]);
    assert.equal(await term.wait(), 7);
    assert.equal(term.exit, 7);

    await terms.delete("term_1");
    assert.equal(calls.at(-1).method, "DELETE");
    assert.equal(calls.at(-1).path, "/base/v1/orgs/acme/sandboxes/sbx_9/terminals/term_1");
  });

});

describe("preview links (fake server)", () => {
  it("creates and deletes a link", async () => {
    const { fn, calls } = fakeFetch((call) =>
      call.method === "POST"
        ? json(201, { id: "lnk_1", url: "https://p.example/x", expires_at: "2026-12-07T00:00:00Z" })
        : new Response(null, { status: 204 }),
    );
    const c = new Sandlane({ baseUrl: "http://x", apiKey: "k", org: "acme", fetch: fn });
    const links = c.sandbox("sbx_2").previewLinks;
    const link = await links.create(8000, { ttlS: 600 });
    assert.equal(link.url, "https://p.example/x");
    assert.equal(calls[0].path, "/v1/orgs/acme/sandboxes/sbx_2/ports/8000/links");
    assert.deepEqual(JSON.parse(calls[0].body), { ttl_s: 600 });
    await links.delete(8000, "lnk_1");
    assert.equal(calls[1].method, "DELETE");
    assert.equal(calls[1].path, "/v1/orgs/acme/sandboxes/sbx_2/ports/8000/links/lnk_1");
  });
});

describe("chain steps without a server", () => {
  it("exports the prefix the Rust lane uses", async () => {
    const { SANDBOX_PROVISIONING_FAILED_PREFIX } = await import("../dist/index.js");
    const { readFile } = await import("node:fs/promises");
    const rust = await readFile(new URL("../../../crates/domain/src/posture.rs", import.meta.url), "utf8");
    const m = rust.match(/pub const SANDBOX_PROVISIONING_FAILED_PREFIX: &str = "([^"]*)";/);
    assert.ok(m, "the Rust constant is where the test looks for it");
    assert.equal(SANDBOX_PROVISIONING_FAILED_PREFIX, m[1]);
  });
});

// Terminals against a local fake server that speaks the terminal contract over a real
// WebSocket (the `ws` package's server): create, ticket, attach with ?access_token=, the
// replay on attach, binary bytes both ways, text control (resize in, exit out, then
// close), list and delete. The client uses the `ws` package's client when the platform
// has no global WebSocket (Node 20 without --experimental-websocket), the global one else.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, it } from "node:test";
import { WebSocket as WsClient, WebSocketServer } from "ws";
import { NotFoundError, PermissionDeniedError, Sandlane, Terminal } from "../dist/index.js";

const PREFIX = "/v1/orgs/acme/sandboxes/sbx_1/terminals";
const state = { resizes: [], inputs: [], tickets: new Set(), terminals: new Map(), authorizations: [] };
let server;
let wss;
let baseUrl;

function send(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(body === undefined ? undefined : JSON.stringify(body));
}

before(async () => {
  server = createServer((req, res) => {
    state.authorizations.push(req.headers.authorization);
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      const url = new URL(req.url, "http://x");
      const parts = url.pathname.slice(PREFIX.length).split("/").filter(Boolean);
      if (!url.pathname.startsWith(PREFIX)) return send(res, 404, { error: "not_found", message: "no route" });
      if (req.method === "POST" && parts.length === 0) {
        const body = JSON.parse(raw);
        const id = `term_${state.terminals.size + 1}`;
        state.terminals.set(id, { ...body, replay: Buffer.from(`$ welcome to ${id}\r\n`) });
        return send(res, 201, { id });
      }
      if (req.method === "GET" && parts.length === 0) {
        return send(res, 200, { terminals: [...state.terminals.keys()].map((id) => ({ id })) });
      }
      if (req.method === "POST" && parts[1] === "tickets") {
        if (!state.terminals.has(parts[0])) return send(res, 404, { error: "not_found", message: "no terminal" });
        const ticket = `tk_${Math.random().toString(36).slice(2)}`;
        state.tickets.add(ticket);
        return send(res, 201, { ticket, expires_at: new Date(Date.now() + 60_000).toISOString() });
      }
      if (req.method === "DELETE" && parts.length === 1) {
        state.terminals.delete(parts[0]);
        res.writeHead(204);
        return res.end();
      }
      send(res, 404, { error: "not_found", message: "no route" });
    });
  });
  wss = new WebSocketServer({ noServer: true });
  server.on("upgrade", (req, socket, head) => {
    const url = new URL(req.url, "http://x");
    const id = url.pathname.slice(PREFIX.length + 1);
    const ticket = url.searchParams.get("access_token");
    if (!state.terminals.has(id) || !state.tickets.delete(ticket)) {
      socket.end("HTTP/1.1 403 Forbidden\r\n\r\n");
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      const term = state.terminals.get(id);
      ws.send(term.replay, { binary: true }); // the replay on attach
      let line = "";
      ws.on("message", (data, isBinary) => {
        if (!isBinary) {
          const control = JSON.parse(data.toString());
          if (control.type === "resize") state.resizes.push([control.cols, control.rows]);
          return;
        }
        state.inputs.push(Buffer.from(data));
        ws.send(Buffer.from(data), { binary: true }); // the tty echoes
        line += data.toString("latin1");
        if (line.endsWith("\r")) {
          const command = line.slice(0, -1);
          line = "";
          if (command === "exit 3") {
            ws.send(JSON.stringify({ type: "exit", exit_code: 3 }));
            ws.close(1000);
          } else if (command === "bytes") {
            ws.send(Buffer.from([0, 0xff, 0x1b, 0x5b, 0x41]), { binary: true });
          } else {
            ws.send(Buffer.from(`\r\nran ${command}\r\n`), { binary: true });
          }
        }
      });
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  baseUrl = `http://127.0.0.1:${server.address().port}`;
});

after(async () => {
  wss.close();
  await new Promise((r) => server.close(r));
});

/** Reads a terminal's output until `pattern` shows (or the output ends). */
async function readUntil(terminal, pattern) {
  let text = "";
  const chunks = [];
  for await (const chunk of terminal) {
    chunks.push(chunk);
    text += Buffer.from(chunk).toString("latin1");
    if (pattern.test(text)) break;
  }
  return { text, chunks };
}

it("creates a terminal, attaches by ticket, echoes a command, resizes and reports the exit", async () => {
  const c = new Sandlane({ baseUrl, apiKey: "sk_test", org: "acme", WebSocket: globalThis.WebSocket ?? WsClient });
  const terms = c.sandbox("sbx_1").terminals;
  const { id } = await terms.create({ argv: ["bash"], cols: 100, rows: 30 });
  assert.equal(id, "term_1");
  assert.deepEqual(state.terminals.get(id).argv, ["bash"]);
  assert.deepEqual((await terms.list()).map((t) => t.id), ["term_1"]);
  assert.ok(state.authorizations.every((a) => a === "Bearer sk_test"));

  const seen = [];
  const term = await terms.connect(id, { onData: (b) => seen.push(b) });
  const replay = await readUntil(term, /welcome/);
  assert.equal(replay.text, "$ welcome to term_1\r\n");

  term.resize(120, 40);
  term.write("echo hi\r");
  const echoed = await readUntil(term, /ran echo hi\r\n$/);
  assert.match(echoed.text, /^echo hi\r\r\nran echo hi\r\n$/);

  term.write(new Uint8Array([0x62, 0x79, 0x74, 0x65, 0x73, 0x0d])); // "bytes\r" as bytes
  const raw = await readUntil(term, /\x1b\[A$/);
  assert.deepEqual([...Buffer.from(raw.text, "latin1").subarray(-5)], [0, 0xff, 0x1b, 0x5b, 0x41]);

  term.write("exit 3\r");
  const rest = [];
  for await (const chunk of term) rest.push(chunk);
  assert.equal(await term.wait(), 3);
  assert.equal(term.exit, 3);
  assert.deepEqual(state.resizes, [[120, 40]]);
  assert.equal(Buffer.concat(state.inputs).toString("latin1"), "echo hi\rbytes\rexit 3\r");
  assert.ok(seen.length >= 4, "onData saw every chunk");

  await terms.delete(id);
  assert.deepEqual(await terms.list(), []);
  await assert.rejects(terms.ticket(id), NotFoundError);
});

it("uses the ws package when the platform has no WebSocket and none is given", async () => {
  const c = new Sandlane({ baseUrl, apiKey: "k", org: "acme" });
  const terms = c.sandbox("sbx_1").terminals;
  const { id } = await terms.create();
  const saved = globalThis.WebSocket;
  try {
    delete globalThis.WebSocket;
    const term = await terms.connect(id);
    assert.match((await readUntil(term, /welcome/)).text, /welcome/);
    term.close();
    assert.equal(await term.wait(), null); // detached, no exit
  } finally {
    if (saved) globalThis.WebSocket = saved;
  }
  await terms.delete(id);
});

it("refuses a ticket used twice", async () => {
  const c = new Sandlane({ baseUrl, apiKey: "k", org: "acme", WebSocket: WsClient });
  const terms = c.sandbox("sbx_1").terminals;
  const { id } = await terms.create();
  const { ticket } = await terms.ticket(id);
  const url = terms.webSocketUrl(id, ticket);
  assert.match(url, /^ws:\/\/127\.0\.0\.1:\d+\/v1\/orgs\/acme\/sandboxes\/sbx_1\/terminals\/term_\d+\?access_token=tk_/);
  (await Terminal.open(url, { WebSocket: WsClient })).close();
  await assert.rejects(Terminal.open(url, { WebSocket: WsClient }));
  await terms.delete(id);
  void PermissionDeniedError;
});

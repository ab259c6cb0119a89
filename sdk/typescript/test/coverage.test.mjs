// Every operation of the served /openapi.json has a client call, and that call sends the
// operation's method to its path (checked with a recording fetch). A route added to the
// server without a client call fails here.
import assert from "node:assert/strict";
import { it } from "node:test";
import { Sandlane } from "../dist/index.js";
import { serverUrl } from "./helpers.mjs";

const SBX = "sbx_01M8VSNY4JJ7ZNVY4KBB8RE7D2";
const empty = async (it) => {
  for await (const _ of it) void _;
};

/** operationId → a call of the client that should send it. */
const calls = {
  jwks: (c) => c.jwks(),
  healthz: (c) => c.health(),
  readyz: (c) => c.ready(),
  metrics: (c) => c.metrics(),
  openapi: (c) => c.openapi(),
  introspect: (c) => c.introspect("t"),
  read_audit: (c) => c.audit.page({ after: 0, limit: 10 }),
  verify_audit: (c) => c.audit.verify(),
  list_sandboxes: (c) => c.listSandboxes({ limit: 10 }),
  list_deliveries: (c) => c.webhooks.deliveries({ limit: 10 }),
  read_policy: (c) => c.getPolicy(),
  get_sandbox: (c) => c.getSandbox(SBX),
  read_archive: (c) => c.sandbox(SBX).files.downloadArchive("/workspace"),
  write_archive: (c) => c.sandbox(SBX).files.uploadArchive("/workspace", new Uint8Array(1)),
  exec: (c) => c.sandbox(SBX).exec(["true"]),
  delete_file: (c) => c.sandbox(SBX).files.remove("f"),
  read_file: (c) => c.sandbox(SBX).files.readBytes("f"),
  write_file: (c) => c.sandbox(SBX).files.write("f", "x"),
  list_processes: (c) => c.sandbox(SBX).processes.list(),
  start_process: (c) => c.sandbox(SBX).processes.start(["true"]),
  get_process: (c) => c.sandbox(SBX).processes.get(1),
  process_output: (c) => empty(c.sandbox(SBX).processes.output(1, { follow: false })),
  signal_process: (c) => c.sandbox(SBX).processes.signal(1, "TERM"),
  process_stdin: (c) => c.sandbox(SBX).processes.writeStdin(1, "x"),
  restore_sandbox: (c) => c.sandbox(SBX).restore("snp_1"),
  take_snapshot: (c) => c.sandbox(SBX).snapshot(),
  list_secrets: (c) => c.secrets.list(),
  delete_secret: (c) => c.secrets.delete("n"),
  put_secret: (c) => c.secrets.set("n", { value: "v", hosts: ["h"], scope: { org: true } }),
  deprovision_session: (c) => c.deprovisionSession("s"),
  ensure_session: (c) => c.ensureSession("s", { executionId: "e" }),
  list_snapshots: (c) => c.snapshots.list(),
  delete_snapshot: (c) => c.snapshots.delete("snp_1"),
  get_snapshot: (c) => c.snapshots.get("snp_1"),
  deprovision_workflow: (c) => c.deprovisionWorkflow("w"),
  ensure_workflow: (c) => c.ensureWorkflow("w"),
  recover_workflow: (c) => c.recoverWorkflow("w"),
  create_terminal: (c) => c.sandbox(SBX).terminals.create({ cols: 80, rows: 24 }),
  list_terminals: (c) => c.sandbox(SBX).terminals.list(),
  get_terminal: (c) => c.sandbox(SBX).terminals.get("term_1"),
  delete_terminal: (c) => c.sandbox(SBX).terminals.delete("term_1"),
  create_ticket: (c) => c.sandbox(SBX).terminals.ticket("term_1"),
  create_link: (c) => c.sandbox(SBX).previewLinks.create(8000, { ttlS: 60 }),
  list_links: (c) => c.sandbox(SBX).previewLinks.list(8000),
  revoke_link: (c) => c.sandbox(SBX).previewLinks.delete(8000, "pvl_1"),
};

it("every operation of /openapi.json has a client call sending its method and path", async () => {
  const doc = await (await fetch(`${serverUrl()}/openapi.json`)).json();
  const operations = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (["get", "put", "post", "delete", "patch"].includes(method)) operations.push({ path, method: method.toUpperCase(), id: op.operationId });
    }
  }
  const missing = operations.filter((op) => !calls[op.id]).map((op) => `${op.id} (${op.method} ${op.path})`);
  assert.deepEqual(missing, [], "operations without a client call");

  for (const op of operations) {
    let sent;
    const fetch = async (url, init) => {
      sent = { method: init.method, path: new URL(url).pathname };
      return new Response("", { status: 404, headers: { "content-type": "application/json" } });
    };
    const c = new Sandlane({ baseUrl: "http://x", apiKey: "k", org: "acme", fetch });
    await calls[op.id](c).catch(() => undefined);
    const pattern = new RegExp(`^${op.path.replace(/\{[^}]+\}/g, "[^/]+")}$`);
    assert.ok(sent, `${op.id} sent nothing`);
    assert.equal(sent.method, op.method, op.id);
    assert.match(sent.path, pattern, op.id);
  }
});

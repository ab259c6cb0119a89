// NOT RUN YET: the live test of terminals and preview links, for a server with those
// routes (scripts/sdk-typescript.sh runs test/*.test.mjs only). Written against the same
// contract as test/terminal.test.mjs, which passes against a local fake; once the server
// has the routes, move this file to test/terminal-live.test.mjs. Run it by hand with the
// variables of scripts/serve-throwaway.sh exported:
//
//   node --test test/live/terminal.live.mjs
import assert from "node:assert/strict";
import { it } from "node:test";
import { WebSocket as WsClient } from "ws";
import { NotFoundError } from "../../dist/index.js";
import { client, freshSandbox } from "../helpers.mjs";

it("a terminal echoes a command and reports its exit", { timeout: 60_000 }, async () => {
  const sbx = await freshSandbox(client(undefined, "acme", { WebSocket: globalThis.WebSocket ?? WsClient }));
  const { id } = await sbx.terminals.create({ argv: ["sh"], cols: 80, rows: 24 });
  assert.match(id, /^term_/);
  assert.ok((await sbx.terminals.list()).some((t) => t.id === id));
  const term = await sbx.terminals.connect(id);
  term.resize(100, 30);
  term.write("echo hello-$((6*7))\r");
  let text = "";
  for await (const chunk of term) {
    text += Buffer.from(chunk).toString();
    if (text.includes("hello-42")) break;
  }
  term.write("exit 3\r");
  for await (const _ of term) void _;
  assert.equal(await term.wait(), 3);
  await sbx.terminals.delete(id).catch((e) => assert.ok(e instanceof NotFoundError)); // may be gone with its exit
});

it("a preview link is made and revoked", async () => {
  const sbx = await freshSandbox();
  await sbx.processes.start(["python3", "-m", "http.server", "8000"]);
  const link = await sbx.previewLinks.create(8000, { ttlS: 60 });
  assert.ok(link.url);
  await sbx.previewLinks.delete(8000, link.id);
});

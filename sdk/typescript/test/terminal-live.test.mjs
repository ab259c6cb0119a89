// A terminal against the real server: made, listed, attached over a WebSocket, resized,
// typed into, and its exit code read from the last control message.
import assert from "node:assert/strict";
import { it } from "node:test";
import { WebSocket as WsClient } from "ws";
import { NotFoundError } from "../dist/index.js";
import { client, freshSandbox } from "./helpers.mjs";

it("a terminal echoes a command and reports its exit", { timeout: 60_000 }, async () => {
  const sbx = await freshSandbox(client(undefined, "acme", { WebSocket: globalThis.WebSocket ?? WsClient }));
  const { id } = await sbx.terminals.create({ argv: ["sh"], cols: 80, rows: 24 });
  assert.match(id, /^term_/);
  assert.ok((await sbx.terminals.list()).some((t) => t.id === id));
  assert.equal((await sbx.terminals.get(id)).id, id);
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

// The example host chain (examples/host-chain.ts, built by `npm run build:examples`) runs
// against the real server: every step ok, the execution started, the sandbox answers;
// with the lane off, the chain runs without it.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { serverUrl, unique, userKey } from "./helpers.mjs";

const run = promisify(execFile);
const example = fileURLToPath(new URL("../examples/dist/host-chain.js", import.meta.url));

it("the example host chain runs", async () => {
  const env = { ...process.env, SANDLANE_URL: serverUrl(), SANDLANE_KEY: userKey(), SANDLANE_ORG: "acme", EXAMPLE_SESSION: unique("example") };
  const { stdout } = await run(process.execPath, [example], { env, timeout: 60_000 });
  assert.match(stdout, /step ensureSessionSandbox\s+ok/);
  assert.match(stdout, /execution exec-1 is IN_PROGRESS/);
  assert.match(stdout, /sandbox sbx_\w+ says: hello from/);

  const off = await run(process.execPath, [example], { env: { ...env, SANDLANE_LANE_ENABLED: "false" }, timeout: 60_000 });
  assert.match(off.stdout, /execution exec-1 is IN_PROGRESS/);
  assert.doesNotMatch(off.stdout, /sandbox sbx_/);
});

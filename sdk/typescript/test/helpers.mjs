// Shared by the live tests: the throwaway server's address and keys (from
// scripts/serve-throwaway.sh), clients, unique names, and the `sandlane` CLI on the same
// data dir (for extra callers and org policies: each test that changes a policy uses an
// org of its own, so test files may run in parallel).
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { Sandlane } from "../dist/index.js";

function need(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: start a server with scripts/serve-throwaway.sh (or run scripts/sdk-typescript.sh)`,
    );
  }
  return value;
}

export const serverUrl = () => need("SANDLANE_TEST_SERVER_URL");
export const userKey = () => need("SANDLANE_TEST_USER_KEY");
export const user2Key = () => need("SANDLANE_TEST_USER2_KEY");
export const serviceKey = () => need("SANDLANE_TEST_SERVICE_KEY");

/** A client of the throwaway server in org `acme` (or `org`) with `key`. */
export function client(key = userKey(), org = "acme", options = {}) {
  return new Sandlane({ baseUrl: serverUrl(), apiKey: key, org, ...options });
}

/** A name unique to this run. */
export function unique(prefix) {
  return `${prefix}-${process.pid}-${randomBytes(4).toString("hex")}`;
}

/** Runs the `sandlane` CLI on the throwaway server's data dir; answers its stdout. */
export function cli(...args) {
  const bin = need("SANDLANE_TEST_BIN");
  return execFileSync(bin, args, {
    env: { ...process.env, SANDLANE_DATA_DIR: `${need("SANDLANE_TEST_SERVER_DIR")}/data` },
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  }).trim();
}

/** Adds a caller in `org` and answers its key. */
export function addCaller(id, cls, org) {
  return cli("caller", "add", "--id", id, "--class", cls, "--org", org);
}

/** Waits until `check()` is truthy (policy changes reach the server within a second). */
export async function eventually(check, { timeoutMs = 5000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Ensures a fresh session sandbox as `c`'s caller; answers the handle. */
export async function freshSandbox(c = client(), prefix = "s") {
  const result = await c.ensureSession(unique(prefix), { executionId: unique("exec") });
  if (result.outcome !== "ready") throw new Error(`ensure: ${JSON.stringify(result)}`);
  return c.sandbox(result);
}

// The generated types match the document the server serves, and the check notices drift.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { serverUrl } from "./helpers.mjs";

const run = promisify(execFile);
const script = fileURLToPath(new URL("../scripts/generate.mjs", import.meta.url));

it("src/generated/openapi.ts is what the served /openapi.json generates", async () => {
  const { stdout } = await run(process.execPath, [script, "--check", `${serverUrl()}/openapi.json`]);
  assert.match(stdout, /matches/);
});

it("the check fails on a document that differs", async () => {
  const doc = await (await fetch(`${serverUrl()}/openapi.json`)).json();
  doc.components.schemas.Drift = { type: "object", properties: { x: { type: "string" } } };
  const dir = await mkdtemp(join(tmpdir(), "sandlane-sdk-drift-"));
  try {
    const file = join(dir, "openapi.json");
    await writeFile(file, JSON.stringify(doc));
    await assert.rejects(run(process.execPath, [script, "--check", file]), (e) => e.code === 1 && /differs/.test(e.stderr));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

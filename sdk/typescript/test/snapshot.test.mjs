// Snapshots, forks and restore against the real server.
import assert from "node:assert/strict";
import { it } from "node:test";
import { NotFoundError } from "../dist/index.js";
import { client, freshSandbox, unique, user2Key } from "./helpers.mjs";

it("forks a session from a snapshot: the fork sees the file; restore rewinds in place", { timeout: 60_000 }, async () => {
  const c = client();
  const sbx = await freshSandbox(c, "snap-src");
  await sbx.files.write("/workspace/state.txt", "v1");
  const snap = await sbx.snapshot({ name: "after-v1" });
  assert.match(snap.id, /^snp_/);
  assert.equal(snap.sandbox_id, sbx.id);
  assert.equal(snap.name, "after-v1");
  assert.equal((await c.snapshots.get(snap.id)).id, snap.id);
  assert.ok((await c.snapshots.list({ sandboxId: sbx.id })).some((s) => s.id === snap.id));

  // a fork: a new session whose workspace starts as the snapshot's files
  const forked = await c.snapshots.forkSession(snap.id, unique("fork"), { executionId: "exec-f" });
  assert.equal(forked.outcome, "ready");
  assert.equal(forked.sandbox.forked_from, snap.id);
  assert.notEqual(forked.sandbox.id, sbx.id);
  const fork = c.sandbox(forked);
  assert.equal(await fork.files.readText("state.txt"), "v1");

  // the fork and the source go their own ways; restore rewinds the source
  await fork.files.write("state.txt", "fork");
  await sbx.files.write("state.txt", "v2");
  const restored = await sbx.restore(snap.id);
  assert.equal(restored.id, sbx.id);
  assert.equal(await sbx.files.readText("state.txt"), "v1");
  assert.equal(await fork.files.readText("state.txt"), "fork");

  // only its owner (or a service) may use it
  await assert.rejects(client(user2Key()).snapshots.get(snap.id), NotFoundError);
  await c.snapshots.delete(snap.id);
  await assert.rejects(c.snapshots.get(snap.id), NotFoundError);
  assert.equal(await fork.files.readText("state.txt"), "fork");
});

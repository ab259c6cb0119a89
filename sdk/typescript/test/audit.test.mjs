// The audit tail followed across 1,000 events, exactly once each. The events are cheap:
// in an org of its own whose quota is one running sandbox (held by one ensure), each
// further session ensure answers `failed` and is audited `quota_exceeded`, without a
// sandbox. The tail follows while the events are written, 16 at a time.
import assert from "node:assert/strict";
import { it } from "node:test";
import { SANDBOX_PROVISIONING_FAILED_PREFIX } from "../dist/index.js";
import { addCaller, cli, client, eventually, unique } from "./helpers.mjs";

const COUNT = 1000;

it("follows the audit tail across 1,000 events exactly once", { timeout: 120_000 }, async () => {
  const org = unique("audit");
  const c = client(addCaller(unique("svc"), "service", org), org);
  cli("org", "set", org, "--max-sandboxes", "1", "--warm-pool", "0");
  await eventually(async () => (await c.getPolicy()).max_sandboxes === 1);
  const holder = await c.ensureSession(unique("holder"), { executionId: "e" });
  assert.equal(holder.outcome, "ready");

  const run = unique("k");
  const key = (i) => `${run}-${String(i).padStart(4, "0")}`;
  const followed = [];
  const ac = new AbortController();
  let ours = 0;
  const tail = (async () => {
    for await (const event of c.audit.tail({ pageSize: 37, pollIntervalMs: 50, signal: ac.signal })) {
      followed.push(event);
      if (event.key.startsWith(`${run}-`) && ++ours === COUNT) ac.abort();
    }
  })();

  let next = 0;
  const writer = async () => {
    while (next < COUNT) {
      const i = next++;
      const result = await c.ensureSession(key(i), { executionId: "e" });
      assert.equal(result.outcome, "failed", JSON.stringify(result));
      assert.ok(result.message.startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX));
    }
  };
  const started = Date.now();
  await Promise.all(Array.from({ length: 16 }, writer));
  const written = Date.now() - started;
  const timer = setTimeout(() => ac.abort(), 30_000);
  await tail;
  clearTimeout(timer);

  // every event once, in seq order
  const seqs = followed.map((e) => e.seq);
  for (let i = 1; i < seqs.length; i++) assert.ok(seqs[i] > seqs[i - 1], `seq ${seqs[i]} after ${seqs[i - 1]}`);
  const mine = followed.filter((e) => e.key.startsWith(`${run}-`));
  assert.equal(mine.length, COUNT);
  assert.deepEqual(new Set(mine.map((e) => e.key)), new Set(Array.from({ length: COUNT }, (_, i) => key(i))));
  for (const e of mine) {
    assert.equal(e.action, "ensure");
    assert.equal(e.outcome, "quota_exceeded");
    assert.equal(e.org, org);
  }
  // nothing skipped: a read of the whole log afterwards, page by page, has the same events
  const reread = [];
  for await (const e of c.audit.tail({ follow: false, pageSize: 1000 })) {
    if (e.seq > seqs.at(-1)) break;
    reread.push(e.seq);
  }
  assert.deepEqual(reread, seqs);
  console.log(`audit: ${COUNT} events written in ${written} ms, ${followed.length} followed in pages of 37`);
});

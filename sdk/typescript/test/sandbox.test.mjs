// Against the real server: ensure (both kinds), read, deprovision, recover; exec buffered
// and streamed; background processes; files and archives; policy, secrets, introspection
// and the public routes; typed errors.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  UnauthenticatedError,
} from "../dist/index.js";
import { addCaller, cli, client, freshSandbox, serviceKey, unique, user2Key, userKey } from "./helpers.mjs";

describe("ensure, read, deprovision, recover", () => {
  it("ensures a session sandbox, idempotently, and reads it", async () => {
    const c = client();
    const session = unique("sess");
    const first = await c.ensureSession(session, { executionId: "exec-1" });
    assert.equal(first.outcome, "ready");
    assert.match(first.sandbox.id, /^sbx_[0-9A-Z]{26}$/);
    assert.equal(first.sandbox.kind, "session");
    assert.equal(first.sandbox.key, session);
    assert.equal(first.sandbox.durability, "durable"); // a user caller
    const second = await c.ensureSession(session, { executionId: "exec-2" });
    assert.equal(second.sandbox.id, first.sandbox.id);
    const read = await c.getSandbox(first.sandbox.id);
    assert.equal(read.state, "ready");
    assert.equal((await c.sandbox(first).info()).id, first.sandbox.id);
    await c.deprovisionSession(session);
    await c.deprovisionSession(session); // idempotent
    assert.equal((await c.getSandbox(first.sandbox.id)).state, "deprovisioned");
  });

  it("ensures, recovers and deprovisions a workflow sandbox", async () => {
    const c = client(serviceKey());
    const execution = unique("wf");
    const first = await c.ensureWorkflow(execution);
    assert.equal(first.outcome, "ready");
    assert.equal(first.sandbox.kind, "workflow");
    assert.equal(first.sandbox.durability, "ephemeral"); // a service caller
    await c.deprovisionWorkflow(execution);
    const recovered = await c.recoverWorkflow(execution);
    assert.equal(recovered.outcome, "ready");
    assert.notEqual(recovered.sandbox.id, first.sandbox.id);
    // through the handle: it finds the key itself
    await c.sandbox(recovered).deprovision();
    assert.equal((await c.getSandbox(recovered.sandbox.id)).state, "deprovisioned");
  });

  it("answers disabled when the org's policy turns the lane off", async () => {
    const org = unique("off");
    const key = addCaller(unique("svc"), "service", org);
    cli("org", "set", org, "--lane-workflow", "off");
    const c = client(key, org);
    // obeyed within a second
    const deadline = Date.now() + 5000;
    let result;
    do {
      result = await c.ensureWorkflow(unique("wf"));
      if (result.outcome === "disabled") break;
      await c.deprovisionWorkflow(result.sandbox.key);
      await new Promise((r) => setTimeout(r, 200));
    } while (Date.now() < deadline);
    assert.deepEqual(result, { outcome: "disabled" });
  });

  it("throws typed errors: another user's sandbox is 403, no such sandbox 404, a bad key 401, a bad id 400", async () => {
    const sbx = await freshSandbox();
    const bob = client(user2Key());
    await assert.rejects(bob.sandbox(sbx.id).exec(["true"]), (e) => {
      assert.ok(e instanceof PermissionDeniedError);
      assert.equal(e.code, "permission_denied");
      assert.equal(e.status, 403);
      return true;
    });
    await assert.rejects(bob.sandbox(sbx.id).files.readText("x"), PermissionDeniedError);
    await assert.rejects(
      (async () => {
        for await (const _ of bob.sandbox(sbx.id).execStream(["true"])) void _;
      })(),
      (e) => e instanceof PermissionDeniedError && e.status === 403,
    );
    await assert.rejects(client().getSandbox("sbx_00000000000000000000000000"), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(client("sk_nope").getSandbox(sbx.id), (e) => e instanceof UnauthenticatedError && e.status === 401);
    await assert.rejects(client().getSandbox("not-an-id"), (e) => e instanceof InvalidArgumentError && e.status === 400);
  });
});

describe("exec", () => {
  it("runs a command buffered", async () => {
    const sbx = await freshSandbox();
    const r = await sbx.exec(["sh", "-c", "read x; echo out $x; echo err >&2; exit 3"], { stdin: "in\n" });
    assert.deepEqual(r, { exit_code: 3, stdout: "out in\n", stderr: "err\n", timed_out: false, truncated: false });
    const t = await sbx.exec(["sleep", "5"], { commandTimeoutMs: 200 });
    assert.equal(t.timed_out, true);
  });

  it("streams: the first frame arrives before the command ends", async () => {
    const sbx = await freshSandbox();
    const start = Date.now();
    const times = [];
    const frames = [];
    for await (const frame of sbx.execStream(["sh", "-c", "echo a; sleep 2; echo b"])) {
      times.push(Date.now() - start);
      frames.push(frame);
    }
    assert.ok(times[0] < 1000, `first frame after ${times[0]} ms`);
    console.log(`streamed exec: first frame after ${times[0]} ms, exit after ${times.at(-1)} ms`);
    assert.ok(times.at(-1) >= 1900, `last frame after ${times.at(-1)} ms`);
    const out = Buffer.concat(frames.filter((f) => f.type === "stdout").map((f) => f.bytes)).toString();
    assert.equal(out, "a\nb\n");
    assert.deepEqual(frames.at(-1), { type: "exit", exit_code: 0, timed_out: false, truncated: false });
  });

  it("streams bytes exactly, text or not", async () => {
    const sbx = await freshSandbox();
    // every byte value, then a euro sign split across two writes, on stdout; stderr apart
    const script = "i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done; " +
      "printf '\\342\\202'; sleep 0.2; printf '\\254'; printf 'E' >&2";
    const stream = sbx.execStream(["bash", "-c", script]);
    const { stdout, stderr, exit } = await stream.collect();
    const expected = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), Buffer.from("€")]);
    assert.deepEqual(Buffer.from(stdout), expected);
    assert.equal(Buffer.from(stderr).toString(), "E");
    assert.equal(exit.exit_code, 0);
    assert.equal(stream.exit.exit_code, 0);
  });

  it("stops the command when the iteration stops", async () => {
    const sbx = await freshSandbox();
    for await (const frame of sbx.execStream(["sh", "-c", "echo started; sleep 30"])) {
      assert.equal(frame.type, "stdout");
      break;
    }
    const ac = new AbortController();
    const started = Date.now();
    setTimeout(() => ac.abort(), 300);
    await assert.rejects(async () => {
      for await (const _ of sbx.execStream(["sleep", "30"], { signal: ac.signal })) void _;
    }, (e) => e.name === "AbortError");
    assert.ok(Date.now() - started < 5000);
  });
});

describe("background processes", () => {
  it("follows a process's output to its exit", async () => {
    const sbx = await freshSandbox();
    const p = await sbx.processes.start(["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 5"]);
    assert.equal(p.running, true);
    assert.equal(p.exit_code, null);
    const frames = [];
    for await (const frame of sbx.processes.output(p.pid)) frames.push(frame);
    const text = Buffer.concat(frames.filter((f) => f.type === "stdout").map((f) => f.bytes)).toString();
    assert.equal(text, "line 1\nline 2\nline 3\n");
    assert.deepEqual(frames.at(-1), { type: "exit", exit_code: 5, timed_out: false, truncated: false });
    const ended = await sbx.processes.get(p.pid);
    assert.equal(ended.running, false);
    assert.equal(ended.exit_code, 5);
    assert.ok((await sbx.processes.list()).some((q) => q.pid === p.pid));
    // replayed from the start to a later reader, without follow
    const replay = [];
    for await (const frame of sbx.processes.output(p.pid, { follow: false })) replay.push(frame);
    assert.deepEqual(replay.at(-1), frames.at(-1));
  });

  it("feeds stdin, signals, and waits", async () => {
    const sbx = await freshSandbox();
    const cat = await sbx.processes.start(["cat"], { stdin: "one\n" });
    await sbx.processes.writeStdin(cat.pid, "two\n");
    await sbx.processes.closeStdin(cat.pid);
    const exit = await sbx.processes.wait(cat.pid);
    assert.equal(exit.exit_code, 0);
    const out = [];
    for await (const f of sbx.processes.output(cat.pid, { follow: false })) if (f.type === "stdout") out.push(f.bytes);
    assert.equal(Buffer.concat(out).toString(), "one\ntwo\n");
    await assert.rejects(sbx.processes.writeStdin(cat.pid, "late"), ConflictError);

    const sleeper = await sbx.processes.start(["sleep", "60"]);
    await sbx.processes.signal(sleeper.pid, "TERM");
    assert.equal((await sbx.processes.wait(sleeper.pid)).exit_code, 128 + 15);
    await assert.rejects(sbx.processes.kill(sleeper.pid), ConflictError);
  });
});

describe("files and archives", () => {
  it("writes, reads, lists and deletes", async () => {
    const sbx = await freshSandbox();
    assert.deepEqual(await sbx.files.write("dir/a.txt", "hello"), { path: "/workspace/dir/a.txt", size: 5 });
    await sbx.files.write("/workspace/dir/b.bin", new Uint8Array([0, 255, 1]));
    assert.equal(await sbx.files.readText("/workspace/dir/a.txt"), "hello");
    assert.deepEqual([...(await sbx.files.readBytes("dir/b.bin"))], [0, 255, 1]);
    const listing = await sbx.files.list("dir");
    assert.deepEqual(listing.entries.map((e) => [e.name, e.type, e.size]), [["a.txt", "file", 5], ["b.bin", "file", 3]]);
    await assert.rejects(sbx.files.remove("dir"), ConflictError);
    await sbx.files.remove("dir/a.txt");
    await sbx.files.remove("dir", { recursive: true });
    await assert.rejects(sbx.files.readText("dir/b.bin"), NotFoundError);
    await assert.rejects(sbx.files.readText("../etc/passwd"), InvalidArgumentError);
  });

  it("moves a directory out and in as a streamed tar", async () => {
    const sbx = await freshSandbox();
    await sbx.exec(["sh", "-c", "mkdir -p /workspace/proj/src && echo main > /workspace/proj/src/main.txt && ln -s src/main.txt /workspace/proj/link"]);
    const tar = await sbx.files.downloadArchive("/workspace/proj");
    const unpacked = await sbx.files.uploadArchive("/workspace/copy", tar);
    assert.equal(unpacked.path, "/workspace/copy");
    assert.ok(unpacked.entries >= 3, JSON.stringify(unpacked));
    const r = await sbx.exec(["sh", "-c", "cat /workspace/copy/src/main.txt; readlink /workspace/copy/link"]);
    assert.equal(r.stdout, "main\nsrc/main.txt\n");
  });
});

describe("policy, secrets, introspection, public routes", () => {
  it("reads the org's policy as a service, and not as a user", async () => {
    const policy = await client(serviceKey()).getPolicy();
    assert.equal(policy.org, "acme");
    assert.equal(typeof policy.lane_session, "boolean");
    await assert.rejects(client(userKey()).getPolicy(), PermissionDeniedError);
  });

  it("sets, lists and deletes a secret (never answering its value)", async () => {
    const org = unique("sec");
    const key = addCaller(unique("svc"), "service", org);
    cli("org", "set", org, "--egress-allow", "api.example.com");
    const c = client(key, org);
    const name = "gh-token";
    const body = { value: "s3cr3t-value", hosts: ["api.example.com"], scope: { org: true } };
    let set;
    const deadline = Date.now() + 5000;
    for (;;) {
      try {
        set = await c.secrets.set(name, body);
        break;
      } catch (e) {
        if (!(e instanceof InvalidArgumentError) || Date.now() > deadline) throw e; // the allowlist reaches the server within a second
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    assert.equal(set.created, true);
    assert.equal(set.secret.name, name);
    assert.ok(!JSON.stringify(set).includes("s3cr3t-value"));
    assert.equal((await c.secrets.set(name, body)).created, false);
    assert.deepEqual((await c.secrets.list()).map((s) => s.name), [name]);
    await c.secrets.delete(name);
    await assert.rejects(c.secrets.delete(name), NotFoundError);
    await assert.rejects(c.secrets.set("x", { ...body, hosts: ["not-allowed.example.org"] }), InvalidArgumentError);
  });

  it("introspects a sandbox token and reads the public routes", async () => {
    const sbx = await freshSandbox();
    const token = (await sbx.exec(["sh", "-c", "cat /run/sandlane/token"])).stdout.trim();
    const c = client();
    const info = await c.introspect(token);
    assert.equal(info.active, true);
    assert.equal(info.sandbox_id, sbx.id);
    assert.deepEqual(await c.introspect("nope"), { active: false });
    assert.equal((await c.health()).status, "ok");
    assert.ok(Array.isArray((await c.ready()).checks));
    assert.ok((await c.jwks()).keys.length >= 1);
    assert.equal((await c.openapi()).openapi, "3.1.0");
    assert.match(await client(serviceKey()).metrics(), /sandlane_ensures_total/);
  });

  it("lets a sandbox token exec in its own sandbox", async () => {
    const sbx = await freshSandbox();
    const token = (await sbx.exec(["sh", "-c", "cat /run/sandlane/token"])).stdout.trim();
    assert.ok(token, "the sandbox has a token file");
    const inside = client(token).sandbox(sbx.id);
    assert.equal((await inside.exec(["echo", "from-token"])).stdout, "from-token\n");
    await assert.rejects(client(token).getSandbox(sbx.id), PermissionDeniedError);
  });
});

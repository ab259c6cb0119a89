// The host chain's ensure steps with a host's logger, against the real server: the
// session posture (a failing ensure: no throw, one logged prefixed line), the workflow
// posture (throws Unavailable with the prefix), and the lane off (nothing called). The
// failures are real: an org of its own whose quota of one running sandbox is taken.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import {
  SANDBOX_PROVISIONING_FAILED_PREFIX,
  Sandlane,
  UnavailableError,
  ensureSessionSandboxForExecution,
  ensureWorkflowSandboxForExecution,
  newEnsureSessionSandboxStep,
  newEnsureWorkflowSandboxStep,
} from "../dist/index.js";
import { addCaller, cli, client, eventually, unique } from "./helpers.mjs";

/** A host's logger that keeps what it is handed. */
function hostLogger() {
  const lines = { error: [], warn: [], info: [] };
  return {
    lines,
    error: (message, ...rest) => lines.error.push([message, ...rest]),
    warn: (message, ...rest) => lines.warn.push([message, ...rest]),
    info: (message, ...rest) => lines.info.push([message, ...rest]),
  };
}

describe("host chain steps", () => {
  const org = unique("chain");
  const ada = { identityId: unique("user-ada"), callerClass: "user" };
  const svc = { identityId: unique("svc"), callerClass: "service" };
  const keys = {};
  const lane = {
    enabled: true,
    clientFor: (caller, forOrg) => client(keys[caller.identityId], forOrg),
  };

  before(async () => {
    keys[ada.identityId] = addCaller(ada.identityId, "user", org);
    keys[svc.identityId] = addCaller(svc.identityId, "service", org);
    cli("org", "set", org, "--max-sandboxes", "1", "--warm-pool", "0");
    await eventually(async () => (await client(keys[svc.identityId], org).getPolicy()).max_sandboxes === 1);
  });

  it("the session step ensures the session's sandbox for the caller", async () => {
    const logger = hostLogger();
    const step = newEnsureSessionSandboxStep({ lane, logger });
    const execution = { org, sessionId: unique("session"), executionId: "exec-1" };
    await step.execute({ newState: execution, callerIdentity: { ...ada, orgs: [org] } });
    assert.deepEqual(logger.lines.error, []);
    // the sandbox is there, the user's (durable), and its token is minted for the user
    const again = await client(keys[ada.identityId], org).ensureSession(execution.sessionId, { executionId: "exec-2" });
    assert.equal(again.outcome, "ready");
    assert.equal(again.sandbox.durability, "durable");
    const token = (await client(keys[ada.identityId], org).sandbox(again).exec(["cat", "/run/sandlane/token"])).stdout.trim();
    const claims = await client(keys[ada.identityId], org).introspect(token);
    assert.equal(claims.sub, ada.identityId);
  });

  it("session posture: a failing ensure never throws, and logs one prefixed line", async () => {
    // the org's one running sandbox is taken by the test before: this ensure fails
    const logger = hostLogger();
    const execution = { org, sessionId: unique("session"), executionId: "exec-1" };
    await ensureSessionSandboxForExecution({ lane, logger }, execution, ada);
    assert.equal(logger.lines.error.length, 1, JSON.stringify(logger.lines));
    assert.ok(logger.lines.error[0][0].startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX), logger.lines.error[0][0]);

    // and a lane that cannot be reached at all: the same posture
    const unreachable = { enabled: true, clientFor: () => new Sandlane({ baseUrl: "http://127.0.0.1:1", apiKey: "k", timeoutMs: 2000 }) };
    const logger2 = hostLogger();
    await newEnsureSessionSandboxStep({ lane: unreachable, logger: logger2 }).execute({ newState: execution, callerIdentity: ada });
    assert.equal(logger2.lines.error.length, 1);
    assert.ok(logger2.lines.error[0][0].startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX));
  });

  it("workflow posture: a failing ensure throws Unavailable with the prefix", async () => {
    const logger = hostLogger();
    const step = newEnsureWorkflowSandboxStep({ lane, logger });
    const execution = { org, executionId: unique("wf") };
    await assert.rejects(step.execute({ newState: execution, callerIdentity: svc }), (e) => {
      assert.ok(e instanceof UnavailableError, String(e));
      assert.equal(e.code, "unavailable");
      assert.equal(e.status, 503);
      assert.ok(e.message.startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX), e.message);
      return true;
    });
    assert.equal(logger.lines.error.length, 1);
    assert.ok(logger.lines.error[0][0].startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX));
  });

  it("lane off: both steps do nothing at all", async () => {
    let called = 0;
    const failingFetch = async () => {
      called++;
      assert.fail("a step called the lane while it is off");
    };
    const off = {
      enabled: false,
      clientFor: () => {
        called++;
        return new Sandlane({ baseUrl: "http://127.0.0.1:1", apiKey: "k", org, fetch: failingFetch });
      },
    };
    const logger = hostLogger();
    await newEnsureSessionSandboxStep({ lane: off, logger }).execute({
      newState: { org, sessionId: "s", executionId: "e" },
      callerIdentity: ada,
    });
    await newEnsureWorkflowSandboxStep({ lane: off, logger }).execute({ newState: { org, executionId: "w" }, callerIdentity: svc });
    await ensureWorkflowSandboxForExecution({ lane: off, logger }, { org, executionId: "w" }, svc);
    assert.equal(called, 0);
    assert.deepEqual(logger.lines, { error: [], warn: [], info: [] });
  });
});

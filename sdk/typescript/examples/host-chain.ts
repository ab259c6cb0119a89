/**
 * How a TypeScript host composes sandlane's ensure steps into its own create chain.
 *
 * The host has a create chain for agent executions (authorize, persist, …, start). It
 * builds the lane once at start-up (a sandlane server and a key per caller), then puts
 * the session step into the chain. The step takes the chain's whole caller and uses only
 * its id and class. A session ensure never fails the launch: a provisioning failure is a
 * logged line with the prefix, and the execution starts anyway.
 *
 *   SANDLANE_URL=http://127.0.0.1:7878 SANDLANE_KEY=sk_… node examples/dist/host-chain.js
 *
 * (`npm run example` builds and runs it.)
 */
import {
  type CallerIdentity,
  type CreateContext,
  type CreateStep,
  type SandboxLane,
  type SessionExecution,
  Sandlane,
  newEnsureSessionSandboxStep,
} from "@sandlane/sdk";

/** The host's execution, as its chain carries it. */
interface AgentExecution extends SessionExecution {
  phase: "PENDING" | "IN_PROGRESS" | "FAILED";
}

/** The host's own first step: refuse executions of orgs the caller cannot act in. */
const authorize: CreateStep<AgentExecution, CallerIdentity> = {
  name: "authorize",
  async execute(ctx) {
    if (!ctx.callerIdentity.orgs?.includes(ctx.newState.org)) throw new Error(`caller may not act in ${ctx.newState.org}`);
  },
};

/** The host's last step: mark the execution as started. */
const start: CreateStep<AgentExecution, CallerIdentity> = {
  name: "start",
  async execute(ctx) {
    ctx.newState.phase = "IN_PROGRESS";
  },
};

async function main(): Promise<void> {
  const baseUrl = process.env.SANDLANE_URL ?? "http://127.0.0.1:7878";
  const org = process.env.SANDLANE_ORG ?? "acme";
  // A key per caller: the host keeps the sandlane key of each of its callers (here one).
  const keys: Record<string, string | undefined> = { "user-ada": process.env.SANDLANE_KEY };
  const lane: SandboxLane = {
    enabled: process.env.SANDLANE_LANE_ENABLED !== "false",
    clientFor(caller, forOrg) {
      const apiKey = keys[caller.identityId];
      if (!apiKey) throw new Error(`no sandlane key for ${caller.identityId}`);
      return new Sandlane({ baseUrl, apiKey, org: forOrg });
    },
  };
  // The host's logger: console here (pino or winston fit the same shape).
  const logger = console;

  const chain: CreateStep<AgentExecution, CallerIdentity>[] = [authorize, newEnsureSessionSandboxStep({ lane, logger }), start];

  // One request, as the host's transport would hand it over.
  const session = process.env.EXAMPLE_SESSION ?? "session-1";
  const ctx: CreateContext<AgentExecution, CallerIdentity> = {
    newState: { org, sessionId: session, executionId: "exec-1", phase: "PENDING" },
    callerIdentity: { identityId: "user-ada", callerClass: "user", orgs: [org] },
  };
  for (const step of chain) {
    await step.execute(ctx);
    console.log(`step ${step.name.padEnd(24)} ok`);
  }
  console.log(`execution ${ctx.newState.executionId} is ${ctx.newState.phase}`);

  // What the step ensured: the session's sandbox, acting for the caller.
  if (lane.enabled) {
    const client = await lane.clientFor(ctx.callerIdentity, org);
    const ensured = await client.ensureSession(session, { executionId: ctx.newState.executionId });
    if (ensured.outcome === "ready") {
      const { stdout } = await client.sandbox(ensured).exec(["sh", "-c", "echo hello from $(hostname)"]);
      console.log(`sandbox ${ensured.sandbox.id} says: ${stdout.trim()}`);
    }
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});

/**
 * The ensure steps a TypeScript host composes into its own create chain for agent
 * executions and workflow executions, with the lane's postures:
 *
 * - the session step never fails the launch, but is never silent: a provisioning failure
 *   is logged once through the host's logger, prefixed with
 *   {@link SANDBOX_PROVISIONING_FAILED_PREFIX};
 * - the workflow step is critical: a provisioning failure throws {@link UnavailableError}
 *   whose message starts with the prefix;
 * - with `deps.lane.enabled` false both do nothing at all (no request is made).
 *
 * Here the lane is a sandlane server reached over HTTP: the caller's identity is the
 * credential's, so `deps.lane.clientFor(caller)` hands the step a client whose key acts
 * for that caller (the sandbox's token is then minted FOR the caller, and its class
 * decides the workspace's durability).
 */
import type { Sandlane } from "./client.js";
import { SandlaneError, UnavailableError } from "./errors.js";
import type { EnsureResult } from "./types.js";

/**
 * The prefix of every provisioning failure's message, in both postures; the same string
 * the lane's server uses (`Sandbox provisioning failed: `).
 */
export const SANDBOX_PROVISIONING_FAILED_PREFIX = "Sandbox provisioning failed: ";

/** A caller's class: a person, a service, or the host's own internal calls. */
export type CallerClass = "user" | "service" | "internal";

/** The identity of whoever asked for an execution, as a host's chain carries it. */
export interface CallerIdentity {
  /** The caller's identity id (a user's or a service's). */
  identityId: string;
  /** The caller's class. */
  callerClass: CallerClass;
  /** The orgs the caller may act in (when the host tracks them). */
  orgs?: readonly string[];
}

/**
 * The two facts about the requesting caller a sandbox ensure carries, cut from the
 * chain's {@link CallerIdentity}: the id (the sandbox's credential is minted for it) and
 * the class (which decides the workspace's durability). A step hands the chain's caller
 * in whole; the pick keeps a test's fixture to these two fields.
 */
export type SandboxCaller = Pick<CallerIdentity, "identityId" | "callerClass">;

/** An agent execution being launched in a session. */
export interface SessionExecution {
  /** The org it runs in. */
  org: string;
  /** The session it belongs to: every execution of a session shares its sandbox. */
  sessionId: string;
  /** The execution's id. */
  executionId: string;
}

/** A workflow execution being created (or recovered). */
export interface WorkflowExecution {
  /** The org it runs in. */
  org: string;
  /** The workflow execution's id: its sandbox's key. */
  executionId: string;
}

/** The host's logger (a `console`, pino and winston all fit). */
export interface Logger {
  /** Logs a failure. */
  error(message: string, ...rest: unknown[]): void;
  /** Logs a warning (optional). */
  warn?(message: string, ...rest: unknown[]): void;
  /** Logs an event (optional). */
  info?(message: string, ...rest: unknown[]): void;
  /** Logs a detail (optional). */
  debug?(message: string, ...rest: unknown[]): void;
}

/** The lane as the steps see it. */
export interface SandboxLane {
  /** Whether the lane is on. Off: the steps make no call at all. */
  enabled: boolean;
  /**
   * A client whose credential acts for `caller` in the execution's org (a key per
   * caller, or a service key for the host's own calls). Called only when the lane is on.
   */
  clientFor(caller: SandboxCaller, org: string): Sandlane | Promise<Sandlane>;
}

/** What the session step needs. */
export interface EnsureSessionSandboxDeps {
  /** The lane. */
  lane: SandboxLane;
  /** The host's logger: a provisioning failure is logged through it, once. */
  logger: Logger;
}

/** What the workflow step needs. */
export type EnsureWorkflowSandboxDeps = EnsureSessionSandboxDeps;

/**
 * The context a create chain hands each step: the new state and who asked. `C` is the
 * host's own caller type (its whole `CallerIdentity`); the lane's steps read only
 * {@link SandboxCaller}'s two fields of it.
 */
export interface CreateContext<T, C extends SandboxCaller = SandboxCaller> {
  /** The execution being created. */
  newState: T;
  /** Who asked. */
  callerIdentity: C;
}

/** One step of a host's create chain. */
export interface CreateStep<T, C extends SandboxCaller = SandboxCaller> {
  /** The step's name, for the host's logs. */
  readonly name: string;
  /** Runs the step; a throw fails the create. */
  execute(ctx: CreateContext<T, C>): Promise<void>;
}

function describe(error: unknown): string {
  if (error instanceof SandlaneError) return `${error.code}: ${error.message}`;
  if (error instanceof Error) return error.message;
  return String(error);
}

function prefixed(message: string): string {
  return message.startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX) ? message : SANDBOX_PROVISIONING_FAILED_PREFIX + message;
}

/**
 * The session step for a host's agent-execution create chain: ensures the session's
 * sandbox for the execution being created, for the chain's caller. Never throws.
 */
export function newEnsureSessionSandboxStep<T extends SessionExecution = SessionExecution, C extends SandboxCaller = SandboxCaller>(
  deps: EnsureSessionSandboxDeps,
): CreateStep<T, C> {
  return {
    name: "ensureSessionSandbox",
    async execute(ctx) {
      await ensureSessionSandboxForExecution(deps, ctx.newState, ctx.callerIdentity);
    },
  };
}

/**
 * The body of the session step, for any site that launches an execution (a create chain,
 * a resume): ensures the session's sandbox for `execution`, for `caller`. Non-critical: a
 * failure (the lane answered `failed`, or could not be reached) never throws, and is
 * logged once through `deps.logger.error` with the prefix. Does nothing when the lane is off.
 */
export async function ensureSessionSandboxForExecution(
  deps: EnsureSessionSandboxDeps,
  execution: SessionExecution,
  caller: SandboxCaller,
): Promise<void> {
  if (!deps.lane.enabled) {
    return;
  }
  try {
    const client = await deps.lane.clientFor(caller, execution.org);
    const result = await client.withOrg(execution.org).ensureSession(execution.sessionId, {
      executionId: execution.executionId,
    });
    if (result.outcome === "failed") {
      deps.logger.error(prefixed(result.message), {
        org: execution.org,
        sessionId: execution.sessionId,
        executionId: execution.executionId,
        callerId: caller.identityId,
      });
    }
  } catch (error) {
    // Non-critical: never fail the launch, but never silent either.
    deps.logger.error(prefixed(`session ${execution.sessionId}: ${describe(error)}`), {
      org: execution.org,
      sessionId: execution.sessionId,
      executionId: execution.executionId,
      callerId: caller.identityId,
    });
  }
}

/**
 * The workflow step for a host's workflow-execution create chain: ensures the execution's
 * sandbox for the chain's caller. Critical: throws {@link UnavailableError} with the prefix.
 */
export function newEnsureWorkflowSandboxStep<T extends WorkflowExecution = WorkflowExecution, C extends SandboxCaller = SandboxCaller>(
  deps: EnsureWorkflowSandboxDeps,
): CreateStep<T, C> {
  return {
    name: "ensureWorkflowSandbox",
    async execute(ctx) {
      await ensureWorkflowSandboxForExecution(deps, ctx.newState, ctx.callerIdentity);
    },
  };
}

/**
 * The body of the workflow step, shared with recovery sites: ensures the workflow
 * execution's sandbox for `caller`. On a provisioning failure it logs through
 * `deps.logger.error` and throws {@link UnavailableError} whose message starts with
 * {@link SANDBOX_PROVISIONING_FAILED_PREFIX}. Does nothing when the lane is off.
 */
export async function ensureWorkflowSandboxForExecution(
  deps: EnsureWorkflowSandboxDeps,
  execution: WorkflowExecution,
  caller: SandboxCaller,
): Promise<void> {
  if (!deps.lane.enabled) {
    return;
  }
  let failure: string;
  let cause: unknown;
  try {
    const client = await deps.lane.clientFor(caller, execution.org);
    // The API answers a workflow ensure's failure as 503; an answer `failed` is held to
    // the same posture all the same.
    const result = (await client.withOrg(execution.org).ensureWorkflow(execution.executionId)) as EnsureResult;
    if (result.outcome !== "failed") return;
    failure = prefixed(result.message);
  } catch (error) {
    cause = error;
    failure =
      error instanceof SandlaneError && error.message.startsWith(SANDBOX_PROVISIONING_FAILED_PREFIX)
        ? error.message
        : prefixed(`workflow execution ${execution.executionId}: ${describe(error)}`);
  }
  deps.logger.error(failure, { org: execution.org, executionId: execution.executionId, callerId: caller.identityId });
  throw new UnavailableError(failure, { status: cause instanceof SandlaneError ? cause.status : undefined, cause });
}

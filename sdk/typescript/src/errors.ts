import type { components } from "./generated/openapi.js";

/** An API error code, as the API's error list names them (`invalid_argument`, …). */
export type ErrorCode = components["schemas"]["Code"];

/** Every error code the API may answer, in the order of the API's error list. */
export const ERROR_CODES: readonly ErrorCode[] = [
  "invalid_argument",
  "unauthenticated",
  "permission_denied",
  "not_found",
  "conflict",
  "too_large",
  "resource_exhausted",
  "unavailable",
  "internal",
] as const;

/** The HTTP status each error code goes with. */
export const ERROR_STATUS: Readonly<Record<ErrorCode, number>> = {
  invalid_argument: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  conflict: 409,
  too_large: 413,
  resource_exhausted: 429,
  unavailable: 503,
  internal: 500,
};

/** Options of a {@link SandlaneError}. */
export interface SandlaneErrorOptions {
  /** The HTTP status of the answer; `undefined` for an error line that ended a stream. */
  status?: number | undefined;
  /** The request that failed, as `METHOD path`. */
  request?: string | undefined;
  /** The error this one wraps. */
  cause?: unknown;
}

/**
 * The base class of every error the API answers: `code` is the API's `error` code (what
 * programs branch on), `message` the API's message (for people), `status` the HTTP status.
 * A subclass per code: `instanceof PermissionDeniedError` and `err.code ===
 * "permission_denied"` say the same.
 */
export class SandlaneError extends Error {
  /** The API's error code. */
  readonly code: ErrorCode;
  /**
   * The HTTP status. `undefined` when the error came as the `error` line of a streamed
   * output (the status line had said 200 already).
   */
  readonly status: number | undefined;
  /** The request that failed (`PUT /v1/orgs/acme/sessions/s1/sandbox`), when known. */
  readonly request: string | undefined;

  /** An error of `code`; prefer {@link errorFor}, which picks the code's subclass. */
  constructor(code: ErrorCode, message: string, options: SandlaneErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.status = options.status;
    this.request = options.request;
  }
}

/** 400 `invalid_argument`: a malformed body, query or id, or a command the exec rules refuse. */
export class InvalidArgumentError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("invalid_argument", message, options);
  }
}

/** 401 `unauthenticated`: no credential, or one that is unknown, revoked or expired. */
export class UnauthenticatedError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("unauthenticated", message, options);
  }
}

/** 403 `permission_denied`: authenticated, but not allowed here (say, another user's sandbox). */
export class PermissionDeniedError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("permission_denied", message, options);
  }
}

/** 404 `not_found`: no such route, or no such sandbox, snapshot, process or secret. */
export class NotFoundError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("not_found", message, options);
  }
}

/** 409 `conflict`: the sandbox or the thing named is not in a state that allows this. */
export class ConflictError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("conflict", message, options);
  }
}

/** 413 `too_large`: a body, file or archive over its limit. */
export class TooLargeError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("too_large", message, options);
  }
}

/** 429 `resource_exhausted`: a quota of the org's policy, or a per-sandbox cap, is used up. */
export class ResourceExhaustedError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("resource_exhausted", message, options);
  }
}

/**
 * 503 `unavailable`: a critical (workflow) ensure failed (its message starts with
 * `Sandbox provisioning failed: `), the database or driver cannot answer, or the request
 * ran past the server's request timeout.
 */
export class UnavailableError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("unavailable", message, options);
  }
}

/** 500 `internal`: a failure the server did not expect (the detail is in its log). */
export class InternalError extends SandlaneError {
  constructor(message: string, options?: SandlaneErrorOptions) {
    super("internal", message, options);
  }
}

const CLASSES: Record<ErrorCode, new (message: string, options?: SandlaneErrorOptions) => SandlaneError> = {
  invalid_argument: InvalidArgumentError,
  unauthenticated: UnauthenticatedError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  conflict: ConflictError,
  too_large: TooLargeError,
  resource_exhausted: ResourceExhaustedError,
  unavailable: UnavailableError,
  internal: InternalError,
};

/** The code an HTTP status stands for, for answers whose body is not the API's error body. */
function codeForStatus(status: number): ErrorCode {
  for (const code of ERROR_CODES) {
    if (ERROR_STATUS[code] === status) return code;
  }
  if (status === 405) return "invalid_argument";
  return status >= 500 ? "internal" : "invalid_argument";
}

/**
 * The typed error for a code: an instance of the code's subclass of {@link SandlaneError}.
 * An unknown code (a newer server) gives the base class, keeping the code as `internal`
 * unless the status names another.
 */
export function errorFor(
  code: string,
  message: string,
  options: SandlaneErrorOptions = {},
): SandlaneError {
  const cls = CLASSES[code as ErrorCode];
  if (cls) return new cls(message, options);
  const fallback = options.status === undefined ? "internal" : codeForStatus(options.status);
  return new SandlaneError(fallback, `${code}: ${message}`, options);
}

/**
 * Reads a failed answer's body and turns it into the typed error. A body that is not the
 * API's `{"error","message"}` (a proxy's page, say) gives the class the status stands for.
 */
export async function errorFromResponse(response: Response, request?: string): Promise<SandlaneError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // the body broke off: the status still says what happened
  }
  let code: string | undefined;
  let message = text.slice(0, 500) || response.statusText || `HTTP ${response.status}`;
  try {
    const body = JSON.parse(text) as { error?: unknown; message?: unknown };
    if (typeof body.error === "string") code = body.error;
    if (typeof body.message === "string") message = body.message;
  } catch {
    // not JSON
  }
  return errorFor(code ?? codeForStatus(response.status), message, { status: response.status, request });
}

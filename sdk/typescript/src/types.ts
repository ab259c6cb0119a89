import type { components, operations, paths } from "./generated/openapi.js";

export type { components, operations, paths };

type S = components["schemas"];

/** A sandbox as the API answers it (`S`). */
export type SandboxInfo = S["SandboxBody"];
/** The answer of an ensure: `ready` with the sandbox, `failed` (session only) or `disabled`. */
export type EnsureResult = S["EnsureResponse"];
/** An ensure that gave a ready sandbox. */
export type EnsureReady = Extract<EnsureResult, { outcome: "ready" }>;
/** A session ensure whose provisioning failed (the message has the prefix). */
export type EnsureFailed = Extract<EnsureResult, { outcome: "failed" }>;
/** An ensure while the lane is off: nothing was provisioned. */
export type EnsureDisabled = Extract<EnsureResult, { outcome: "disabled" }>;
/** The body of an exec or a process start, as the API takes it. */
export type ExecRequest = S["ExecRequestBody"];
/** A buffered exec's result. */
export type ExecResult = S["ExecResponseBody"];
/** A background process. */
export type ProcessInfo = S["ProcessBody"];
/** A directory entry of a listing. */
export type DirectoryEntry = S["EntryBody"];
/** A directory listing. */
export type DirectoryListing = S["DirectoryBody"];
/** The answer of a file write: its path and size. */
export type FileWritten = S["FileWrittenBody"];
/** The answer of an archive upload: where, how many entries, how many bytes. */
export type ArchiveUnpacked = S["UnpackedBody"];
/** A snapshot. */
export type SnapshotInfo = S["SnapshotBody"];
/** One audit event. */
export type AuditEvent = S["AuditEventBody"];
/** A page of audit events and the `next` cursor. */
export type AuditPage = S["AuditPageBody"];
/** An org's effective policy. */
export type Policy = S["PolicyBody"];
/** The body of a secret's `PUT`. */
export type SecretInput = S["PutSecretBody"];
/** Who a secret is for. */
export type SecretScope = S["ScopeBody"];
/** A secret's binding (never its value). */
export type SecretInfo = S["SecretBody"];
/** The answer of a token introspection (RFC 7662). */
export type IntrospectResult = S["IntrospectResponse"];
/** The answer of `/healthz` and `/readyz`. */
export type Health = S["HealthBody"];
/** A signal a background process may be sent. */
export type ProcessSignal = S["SignalBody"]["signal"];
/** An API error body. */
export type ErrorBody = S["ErrorBody"];

import { type FetchLike, type RequestOptions, Transport, seg } from "./http.js";
import { decodeFrames, type ExitFrame, type StreamFrame } from "./ndjson.js";
import type { BodyInput } from "./streams.js";
import { concatBytes, iterateStream } from "./streams.js";
import { type TerminalConnectOptions, Terminal, type WebSocketConstructor } from "./terminal.js";
import type {
  ArchiveUnpacked,
  AuditEvent,
  AuditPage,
  AuditVerdict,
  SandboxListPage,
  WebhookDeliveryPage,
  DirectoryListing,
  EnsureReady,
  EnsureResult,
  ExecResult,
  FileWritten,
  Health,
  IntrospectResult,
  Policy,
  ProcessInfo,
  ProcessSignal,
  SandboxInfo,
  SecretInfo,
  SecretInput,
  SnapshotInfo,
} from "./types.js";
import { UnavailableError } from "./errors.js";

/** Options of a {@link Sandlane} client. */
export interface SandlaneOptions {
  /** The server's base URL (`https://sandlane.example.com`). Default: `$SANDLANE_URL`, else `http://127.0.0.1:7878`. */
  baseUrl?: string;
  /**
   * The credential: a caller key (`sk_…`) or a sandbox token. Default: `$SANDLANE_KEY`.
   * Sent as `Authorization: Bearer`.
   */
  apiKey?: string;
  /**
   * The org the org-scoped calls act in. Default: `$SANDLANE_ORG`. A client for another org
   * of the same key: {@link Sandlane.withOrg}.
   */
  org?: string;
  /** Default timeout of a call in milliseconds (see {@link RequestOptions.timeoutMs}). Default 60 000; 0 for none. */
  timeoutMs?: number;
  /** The `fetch` to call. Default: the platform's global `fetch`. */
  fetch?: FetchLike;
  /** Headers added to every request (a user agent, a tracing header). */
  headers?: Record<string, string>;
  /**
   * The WebSocket class terminals connect with. Default: the global `WebSocket` (Node 22+,
   * Node 20 with `--experimental-websocket`, browsers, Deno, Bun), else the optional peer
   * dependency `ws` when it is installed.
   */
  WebSocket?: WebSocketConstructor;
}

/** Options of an exec (buffered or streamed) and of a background process's start. */
export interface ExecOptions extends RequestOptions {
  /** Fed to standard input (then closed for an exec; left open for a process). */
  stdin?: string;
  /**
   * The command's own time limit in milliseconds (1 to 600 000; the server's default for
   * an exec is 30 000, a process without one runs until it ends). The server kills it then.
   */
  commandTimeoutMs?: number;
}

/** Options of an ensure. */
export interface EnsureOptions extends RequestOptions {
  /** Fork: the new sandbox's workspace starts as this snapshot's files (`snp_…`). */
  fromSnapshot?: string;
}

/** Options of the audit tail. */
export interface AuditTailOptions extends RequestOptions {
  /** Start after this sequence number (0, the default: from the first event). */
  after?: number;
  /** Events per page (1 to 1000, default 100). */
  pageSize?: number;
  /**
   * Keep following once the log is read to its end: poll every `pollIntervalMs` for new
   * events until `signal` aborts. Default `true`. With `false` the iterator ends at the
   * end of the log.
   */
  follow?: boolean;
  /** How long to wait between polls of a followed tail that is at the end. Default 1000 ms. */
  pollIntervalMs?: number;
}

/** Options of a terminal's creation. */
export interface CreateTerminalOptions extends RequestOptions {
  /** The program and its arguments (default: the sandbox's shell). */
  argv?: string[];
  /** Columns. Default 80. */
  cols?: number;
  /** Rows. Default 24. */
  rows?: number;
}

/** A terminal as the API answers it (terminals need a server with the terminal routes). */
export interface TerminalInfo {
  /** Its id (`term_…`). */
  id: string;
  /** Whatever else the server says about it. */
  [field: string]: unknown;
}

/** A one-time ticket for a terminal's WebSocket, usable as `?access_token=`. */
export interface TerminalTicket {
  /** The ticket. */
  ticket: string;
  /** When it stops working (RFC 3339). */
  expires_at: string;
}

/** A preview link: a URL that reaches a port of a sandbox (needs a server with preview links). */
export interface PreviewLink {
  /** Its id. */
  id: string;
  /** The URL that reaches the port. */
  url: string;
  /** When it stops working (RFC 3339). */
  expires_at: string;
}

/** This package's version. */
export const VERSION = "0.1.0";

const USER_AGENT = `sandlane-sdk-typescript/${VERSION}`;

const env = (name: string): string | undefined =>
  typeof process !== "undefined" && process.env ? process.env[name] || undefined : undefined;

/**
 * The sandlane client: one per server and credential.
 *
 * ```ts
 * const sandlane = new Sandlane({ baseUrl: "http://127.0.0.1:7878", apiKey: process.env.KEY, org: "acme" });
 * const ensured = await sandlane.ensureSession("s1", { executionId: "exec-1" });
 * if (ensured.outcome === "ready") {
 *   const sbx = sandlane.sandbox(ensured.sandbox.id);
 *   const { stdout } = await sbx.exec(["sh", "-c", "echo hello"]);
 * }
 * ```
 *
 * Answers are the API's JSON as the OpenAPI document types it (snake_case fields); failures
 * throw a {@link SandlaneError} subclass per API error code.
 */
export class Sandlane {
  /** @internal */
  readonly transport: Transport;
  /** The org the org-scoped calls act in (`undefined` when none was given). */
  readonly org: string | undefined;
  /** @internal */
  readonly webSocket: WebSocketConstructor | undefined;
  private readonly options: SandlaneOptions;

  /** Snapshots of the org: list, read, delete (take one with {@link Sandbox.snapshot}). */
  readonly snapshots: SnapshotsApi;
  /** Brokered secrets of the org. */
  readonly secrets: SecretsApi;
  /** The org's audit log. */
  readonly audit: AuditApi;
  /** The org's webhook deliveries. */
  readonly webhooks: WebhooksApi;

  /** A client of one server with one credential; makes no request. */
  constructor(options: SandlaneOptions = {}) {
    this.options = options;
    const fetchImpl = options.fetch ?? (globalThis.fetch?.bind(globalThis) as FetchLike | undefined);
    if (!fetchImpl) throw new TypeError("sandlane: no fetch: pass options.fetch (Node 20+ has a global fetch)");
    this.transport = new Transport(
      options.baseUrl ?? env("SANDLANE_URL") ?? "http://127.0.0.1:7878",
      options.apiKey ?? env("SANDLANE_KEY"),
      fetchImpl,
      options.timeoutMs ?? 60_000,
      { "user-agent": USER_AGENT, ...options.headers },
    );
    this.org = options.org ?? env("SANDLANE_ORG");
    this.webSocket = options.WebSocket;
    this.snapshots = new SnapshotsApi(this);
    this.secrets = new SecretsApi(this);
    this.audit = new AuditApi(this);
    this.webhooks = new WebhooksApi(this);
  }

  /** The same client acting in another org (same server, credential and options). */
  withOrg(org: string): Sandlane {
    return new Sandlane({ ...this.options, org });
  }

  /** @internal `/v1/orgs/{org}`, or an error when the client has no org. */
  orgPath(): string {
    if (!this.org) throw new TypeError("sandlane: this call needs an org: pass options.org or use withOrg(org)");
    return `/v1/orgs/${seg(this.org)}`;
  }

  // --- ensure, read, deprovision, recover -------------------------------------------

  /**
   * Ensures the sandbox of a session for one of its agent executions (non-critical
   * posture): answers `ready` with the sandbox, `failed` with a message starting
   * `Sandbox provisioning failed: ` (nothing thrown: the API answers 200), or `disabled`.
   * Idempotent: every execution of a session shares its sandbox. With `fromSnapshot`, a key
   * without a live sandbox is forked from the snapshot.
   */
  ensureSession(sessionId: string, options: EnsureOptions & { executionId: string }): Promise<EnsureResult> {
    const body: Record<string, string> = { execution_id: options.executionId };
    if (options.fromSnapshot !== undefined) body.from_snapshot = options.fromSnapshot;
    return this.transport.json({
      method: "PUT",
      path: `${this.orgPath()}/sessions/${seg(sessionId)}/sandbox`,
      json: body,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * Ensures the sandbox of a workflow execution (critical posture): `ready` or `disabled`;
   * a provisioning failure throws {@link UnavailableError} whose message starts with
   * `Sandbox provisioning failed: `.
   */
  ensureWorkflow(executionId: string, options: EnsureOptions = {}): Promise<Exclude<EnsureResult, { outcome: "failed" }>> {
    return this.transport.json({
      method: "PUT",
      path: `${this.orgPath()}/workflow-executions/${seg(executionId)}/sandbox`,
      json: options.fromSnapshot === undefined ? {} : { from_snapshot: options.fromSnapshot },
      signal: options.signal,
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * Gives a workflow execution recovered from FAILED a fresh sandbox (a new id); the
   * earlier sandbox's tokens stop verifying. Answers as {@link ensureWorkflow}.
   */
  recoverWorkflow(executionId: string, options: RequestOptions = {}): Promise<Exclude<EnsureResult, { outcome: "failed" }>> {
    return this.transport.json({
      method: "POST",
      path: `${this.orgPath()}/workflow-executions/${seg(executionId)}/sandbox/recover`,
      ...options,
    });
  }

  /** Deprovisions a session's sandbox (idempotent; a durable workspace is kept for the key). */
  deprovisionSession(sessionId: string, options: RequestOptions = {}): Promise<void> {
    return this.transport.empty({ method: "DELETE", path: `${this.orgPath()}/sessions/${seg(sessionId)}/sandbox`, ...options });
  }

  /** Deprovisions a workflow execution's sandbox (idempotent). */
  deprovisionWorkflow(executionId: string, options: RequestOptions = {}): Promise<void> {
    return this.transport.empty({
      method: "DELETE",
      path: `${this.orgPath()}/workflow-executions/${seg(executionId)}/sandbox`,
      ...options,
    });
  }

  /** Reads a sandbox (`S`); {@link NotFoundError} when the org has none of that id. */
  getSandbox(sandboxId: string, options: RequestOptions = {}): Promise<SandboxInfo> {
    return this.transport.json({ method: "GET", path: `${this.orgPath()}/sandboxes/${seg(sandboxId)}`, ...options });
  }

  /**
   * A handle on a sandbox of the org, for exec, processes, files, snapshots, terminals and
   * preview links. Makes no request: pass the id an ensure answered (or an
   * {@link EnsureResult} that is `ready`).
   */
  sandbox(sandbox: string | SandboxInfo | EnsureReady): Sandbox {
    const id = typeof sandbox === "string" ? sandbox : "sandbox" in sandbox ? sandbox.sandbox.id : sandbox.id;
    return new Sandbox(this, id);
  }

  /**
   * One page of the org's sandboxes (service callers), in creation order: those after
   * `after` (the previous page's `next`), at most `limit` (1 to 1000); with `ended`, failed
   * and deprovisioned ones too.
   */
  listSandboxes(
    options: RequestOptions & { after?: string; limit?: number; ended?: boolean } = {},
  ): Promise<SandboxListPage> {
    const { after, limit, ended, ...rest } = options;
    return this.transport.json({
      method: "GET",
      path: `${this.orgPath()}/sandboxes`,
      query: { after, limit, ended },
      ...rest,
    });
  }

  // --- policy, introspection, public routes -------------------------------------------

  /** The org's effective policy (service callers). */
  getPolicy(options: RequestOptions = {}): Promise<Policy> {
    return this.transport.json({ method: "GET", path: `${this.orgPath()}/policy`, ...options });
  }

  /** Introspects a sandbox token (RFC 7662): `{active: false}` or its claims. */
  introspect(token: string, options: RequestOptions = {}): Promise<IntrospectResult> {
    return this.transport.json({ method: "POST", path: "/v1/introspect", form: { token }, ...options });
  }

  /** `GET /healthz`: the process serves requests. */
  health(options: RequestOptions = {}): Promise<Health> {
    return this.transport.json({ method: "GET", path: "/healthz", auth: false, ...options });
  }

  /** `GET /readyz`: the database answers and the driver is usable (else {@link UnavailableError}). */
  ready(options: RequestOptions = {}): Promise<Health> {
    return this.transport.json({ method: "GET", path: "/readyz", auth: false, ...options });
  }

  /** `GET /.well-known/jwks.json`: the public keys that verify sandbox tokens. */
  jwks(options: RequestOptions = {}): Promise<{ keys: Record<string, unknown>[] }> {
    return this.transport.json({ method: "GET", path: "/.well-known/jwks.json", auth: false, ...options });
  }

  /** `GET /metrics`: OpenMetrics text (with a service key, the caller's orgs too). */
  metrics(options: RequestOptions = {}): Promise<string> {
    return this.transport.send({ method: "GET", path: "/metrics", ...options }, (r) => r.text());
  }

  /** `GET /openapi.json`: the API's OpenAPI 3.1 document. */
  openapi(options: RequestOptions = {}): Promise<Record<string, unknown>> {
    return this.transport.json({ method: "GET", path: "/openapi.json", auth: false, ...options });
  }
}

/**
 * The output of a streamed exec: an async iterable of decoded frames as the command
 * writes (stdout/stderr bytes, then the exit frame; an error line is thrown as its typed
 * error). The command starts when the iteration starts (a stream never iterated runs
 * nothing); iterate it once. Breaking out of the loop (or aborting the signal) closes the
 * connection, which ends the command.
 */
export class ExecStream implements AsyncIterable<StreamFrame> {
  private started = false;
  private exitFrame: ExitFrame | undefined;

  /** @internal */
  constructor(private readonly open: () => Promise<AsyncGenerator<StreamFrame, void, undefined>>) {}

  /** The exit frame, once the iteration has seen it. */
  get exit(): ExitFrame | undefined {
    return this.exitFrame;
  }

  /** Sends the request and yields its frames as they arrive (throws the typed error of a refusal or an error line). */
  async *[Symbol.asyncIterator](): AsyncIterator<StreamFrame> {
    if (this.started) throw new TypeError("sandlane: a stream can be iterated once");
    this.started = true;
    const frames = await this.open();
    for await (const frame of frames) {
      if (frame.type === "exit") this.exitFrame = frame;
      yield frame;
    }
  }

  /**
   * Reads the whole stream: every frame's bytes per stream, concatenated, and the exit
   * frame. For output you want as it arrives, iterate instead.
   */
  async collect(): Promise<{ stdout: Uint8Array; stderr: Uint8Array; exit: ExitFrame | undefined }> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    for await (const frame of this) {
      if (frame.type === "stdout") out.push(frame.bytes);
      else if (frame.type === "stderr") err.push(frame.bytes);
    }
    return { stdout: concatBytes(out), stderr: concatBytes(err), exit: this.exitFrame };
  }
}

/** A handle on one sandbox of an org: exec, processes, files, snapshots, terminals, links. */
export class Sandbox {
  /** Its background processes. */
  readonly processes: ProcessesApi;
  /** Its files and archives (streamed both ways). */
  readonly files: FilesApi;
  /** Its interactive terminals (needs a server with the terminal routes). */
  readonly terminals: TerminalsApi;
  /** Its preview links (needs a server with the preview-link routes). */
  readonly previewLinks: PreviewLinksApi;

  /** @internal */
  constructor(
    /** @internal */ readonly client: Sandlane,
    /** The sandbox id (`sbx_…`). */ readonly id: string,
  ) {
    this.processes = new ProcessesApi(this);
    this.files = new FilesApi(this);
    this.terminals = new TerminalsApi(this);
    this.previewLinks = new PreviewLinksApi(this);
  }

  /** @internal `/v1/orgs/{org}/sandboxes/{id}` */
  get path(): string {
    return `${this.client.orgPath()}/sandboxes/${seg(this.id)}`;
  }

  /** Reads the sandbox (`S`). */
  info(options: RequestOptions = {}): Promise<SandboxInfo> {
    return this.client.getSandbox(this.id, options);
  }

  /**
   * Deprovisions the sandbox through its key (reads it to learn whether it is a session's
   * or a workflow execution's, then deprovisions that key; idempotent). A durable
   * workspace is kept for the key's next ensure.
   */
  async deprovision(options: RequestOptions = {}): Promise<void> {
    const info = await this.info(options);
    if (info.kind === "workflow") await this.client.deprovisionWorkflow(info.key, options);
    else await this.client.deprovisionSession(info.key, options);
  }

  /**
   * Runs a command and answers when it has ended: `{exit_code, stdout, stderr, timed_out,
   * truncated}` whatever its exit status (output as UTF-8, capped per stream). The call's
   * own timeout defaults to the command's timeout plus 30 s.
   */
  exec(argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    return this.client.transport.json({
      method: "POST",
      path: `${this.path}/exec`,
      json: execBody(argv, options),
      signal: options.signal,
      timeoutMs: options.timeoutMs ?? (options.commandTimeoutMs ?? 30_000) + 30_000,
    });
  }

  /**
   * Runs a command and streams its output as it is written: an async iterable of frames
   * (bytes exact, binary-safe), ending with the exit frame.
   *
   * ```ts
   * for await (const f of sbx.execStream(["sh", "-c", "make test"])) {
   *   if (f.type === "stdout") process.stdout.write(f.bytes);
   *   if (f.type === "exit") console.log("exit", f.exit_code);
   * }
   * ```
   */
  execStream(argv: string[], options: ExecOptions = {}): ExecStream {
    const path = `${this.path}/exec`;
    return new ExecStream(async () => {
      const response = await this.client.transport.stream({
        method: "POST",
        path,
        json: execBody(argv, options),
        accept: "application/x-ndjson",
        signal: options.signal,
        timeoutMs: options.timeoutMs,
      });
      return decodeFrames(response.body as ReadableStream<Uint8Array>, `POST ${path}`);
    });
  }

  /**
   * Takes a snapshot of the workspace (its processes frozen for the copy). `name` is a
   * label (1 to 64 of `A-Z a-z 0-9 . _ -`).
   */
  snapshot(options: RequestOptions & { name?: string } = {}): Promise<SnapshotInfo> {
    const { name, ...rest } = options;
    return this.client.transport.json({
      method: "POST",
      path: `${this.path}/snapshots`,
      json: name === undefined ? {} : { name },
      ...rest,
    });
  }

  /**
   * Restores the sandbox from a snapshot in place: its processes end, its workspace becomes
   * the snapshot's files, it starts again under the same id with a fresh token.
   */
  async restore(snapshotId: string, options: RequestOptions = {}): Promise<SandboxInfo> {
    const body = await this.client.transport.json<{ sandbox: SandboxInfo }>({
      method: "POST",
      path: `${this.path}/restore`,
      json: { snapshot: snapshotId },
      ...options,
    });
    return body.sandbox;
  }
}

function execBody(argv: string[], options: ExecOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { argv };
  if (options.stdin !== undefined) body.stdin = options.stdin;
  if (options.commandTimeoutMs !== undefined) body.timeout_ms = options.commandTimeoutMs;
  return body;
}

/** A sandbox's background processes: they outlive requests and server restarts. */
export class ProcessesApi {
  /** @internal */
  constructor(private readonly sandbox: Sandbox) {}

  /**
   * Starts a background process: 201 `{pid, argv, running, exit_code, timed_out}`.
   * `stdin` is written first and the input stays open ({@link writeStdin}).
   */
  start(argv: string[], options: ExecOptions = {}): Promise<ProcessInfo> {
    const { signal, timeoutMs } = options;
    return this.sandbox.client.transport.json({
      method: "POST",
      path: `${this.sandbox.path}/processes`,
      json: execBody(argv, options),
      signal,
      timeoutMs,
    });
  }

  /** The sandbox's processes: running ones and ended ones still kept. */
  async list(options: RequestOptions = {}): Promise<ProcessInfo[]> {
    const body = await this.sandbox.client.transport.json<{ processes: ProcessInfo[] }>({
      method: "GET",
      path: `${this.sandbox.path}/processes`,
      ...options,
    });
    return body.processes;
  }

  /** One process (`exit_code` is null while it runs). */
  get(pid: number, options: RequestOptions = {}): Promise<ProcessInfo> {
    return this.sandbox.client.transport.json({ method: "GET", path: `${this.sandbox.path}/processes/${seg(pid)}`, ...options });
  }

  /**
   * A process's output as decoded frames: what is buffered from its start, then (with
   * `follow`, the default) the output as it arrives, then the exit frame once it ends.
   * Without `follow` the iterator ends after what is buffered (the exit frame only if it
   * has ended). Stopping the iteration stops the reading, never the process.
   */
  output(pid: number, options: RequestOptions & { follow?: boolean } = {}): AsyncIterable<StreamFrame> {
    const follow = options.follow ?? true;
    const path = `${this.sandbox.path}/processes/${seg(pid)}/output`;
    const transport = this.sandbox.client.transport;
    return {
      async *[Symbol.asyncIterator]() {
        const response = await transport.stream({
          method: "GET",
          path,
          query: follow ? { follow: true } : undefined,
          signal: options.signal,
          timeoutMs: options.timeoutMs,
        });
        yield* decodeFrames(response.body as ReadableStream<Uint8Array>, `GET ${path}`, { requireEnd: follow });
      },
    };
  }

  /** Follows a process's output to its end and answers its exit frame (the output is dropped). */
  async wait(pid: number, options: RequestOptions = {}): Promise<ExitFrame> {
    for await (const frame of this.output(pid, { ...options, follow: true })) {
      if (frame.type === "exit") return frame;
    }
    throw new UnavailableError(`process ${pid}'s output ended without an exit line`);
  }

  /** Writes to a process's standard input (a stream is sent as it is read); `close` closes it after. */
  writeStdin(pid: number, data: BodyInput, options: RequestOptions & { close?: boolean } = {}): Promise<void> {
    const { close, ...rest } = options;
    return this.sandbox.client.transport.empty({
      method: "POST",
      path: `${this.sandbox.path}/processes/${seg(pid)}/stdin`,
      query: close ? { close: true } : undefined,
      body: data,
      ...rest,
    });
  }

  /** Closes a process's standard input. */
  closeStdin(pid: number, options: RequestOptions = {}): Promise<void> {
    return this.writeStdin(pid, new Uint8Array(0), { ...options, close: true });
  }

  /** Sends a signal to the process's whole process group (`TERM` by default). */
  signal(pid: number, signal: ProcessSignal = "TERM", options: RequestOptions = {}): Promise<void> {
    return this.sandbox.client.transport.empty({
      method: "POST",
      path: `${this.sandbox.path}/processes/${seg(pid)}/signal`,
      json: { signal },
      ...options,
    });
  }

  /** Kills the process (`KILL`). */
  kill(pid: number, options: RequestOptions = {}): Promise<void> {
    return this.signal(pid, "KILL", options);
  }
}

/**
 * A sandbox's files and directories, streamed both ways: paths are `/workspace`, `/tmp`,
 * beneath one, or relative to `/workspace`.
 */
export class FilesApi {
  /** @internal */
  constructor(private readonly sandbox: Sandbox) {}

  private get t(): Transport {
    return this.sandbox.client.transport;
  }

  /**
   * A file's bytes as a web `ReadableStream` (read as they come; nothing is collected).
   * Cancel the stream to stop the transfer. For a directory, use {@link list}.
   */
  async read(path: string, options: RequestOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.t.stream({ method: "GET", path: `${this.sandbox.path}/files`, query: { path }, ...options });
    return response.body as ReadableStream<Uint8Array>;
  }

  /** A file's bytes as an async iterable of chunks (see {@link read}). */
  async *iterate(path: string, options: RequestOptions = {}): AsyncGenerator<Uint8Array, void, undefined> {
    yield* iterateStream(await this.read(path, options));
  }

  /** A small file's bytes, whole. For big files, {@link read} or {@link iterate}. */
  readBytes(path: string, options: RequestOptions = {}): Promise<Uint8Array> {
    return this.t.send({ method: "GET", path: `${this.sandbox.path}/files`, query: { path }, ...options }, async (r) =>
      new Uint8Array(await r.arrayBuffer()),
    );
  }

  /** A small text file's contents (UTF-8). */
  async readText(path: string, options: RequestOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path, options));
  }

  /**
   * Writes a file (missing parent directories are created); it appears whole once the
   * last byte has come, never partly. `data` may be a stream or an async iterable (a Node
   * `Readable`, a generator), sent as it is read. Answers `{path, size}`.
   */
  write(path: string, data: BodyInput, options: RequestOptions = {}): Promise<FileWritten> {
    return this.t.json({
      method: "PUT",
      path: `${this.sandbox.path}/files`,
      query: { path },
      body: data,
      timeoutMs: options.timeoutMs ?? 0,
      signal: options.signal,
    });
  }

  /** Lists a directory: `{entries: [{name, type, size}]}`, sorted by name. */
  list(path: string, options: RequestOptions = {}): Promise<DirectoryListing> {
    return this.t.json({ method: "GET", path: `${this.sandbox.path}/files`, query: { path }, ...options });
  }

  /** Deletes a file, a symlink or an empty directory; with `recursive`, a directory and everything in it. */
  remove(path: string, options: RequestOptions & { recursive?: boolean } = {}): Promise<void> {
    const { recursive, ...rest } = options;
    return this.t.empty({
      method: "DELETE",
      path: `${this.sandbox.path}/files`,
      query: { path, recursive: recursive ? true : undefined },
      ...rest,
    });
  }

  /** A directory as an uncompressed tar, streamed (paths relative to it). */
  async downloadArchive(dir: string, options: RequestOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.t.stream({ method: "GET", path: `${this.sandbox.path}/archive`, query: { path: dir }, ...options });
    return response.body as ReadableStream<Uint8Array>;
  }

  /**
   * Unpacks a tar (ustar, GNU or pax; uncompressed) into a directory (created when
   * missing), streamed. Answers `{path, entries, bytes}`.
   */
  uploadArchive(dir: string, tar: BodyInput, options: RequestOptions = {}): Promise<ArchiveUnpacked> {
    return this.t.json({
      method: "PUT",
      path: `${this.sandbox.path}/archive`,
      query: { path: dir },
      body: tar,
      contentType: "application/x-tar",
      timeoutMs: options.timeoutMs ?? 0,
      signal: options.signal,
    });
  }
}

/** The org's snapshots. */
export class SnapshotsApi {
  /** @internal */
  constructor(private readonly client: Sandlane) {}

  /** Every snapshot the caller may use, oldest first; with `sandboxId`, only that sandbox's. */
  async list(options: RequestOptions & { sandboxId?: string } = {}): Promise<SnapshotInfo[]> {
    const { sandboxId, ...rest } = options;
    const body = await this.client.transport.json<{ snapshots: SnapshotInfo[] }>({
      method: "GET",
      path: `${this.client.orgPath()}/snapshots`,
      query: { sandbox_id: sandboxId },
      ...rest,
    });
    return body.snapshots;
  }

  /** One snapshot. */
  get(snapshotId: string, options: RequestOptions = {}): Promise<SnapshotInfo> {
    return this.client.transport.json({ method: "GET", path: `${this.client.orgPath()}/snapshots/${seg(snapshotId)}`, ...options });
  }

  /** Deletes a snapshot (forks made from it keep their files). */
  delete(snapshotId: string, options: RequestOptions = {}): Promise<void> {
    return this.client.transport.empty({
      method: "DELETE",
      path: `${this.client.orgPath()}/snapshots/${seg(snapshotId)}`,
      ...options,
    });
  }

  /** Forks a session from a snapshot: {@link Sandlane.ensureSession} with `fromSnapshot`. */
  forkSession(snapshotId: string, sessionId: string, options: RequestOptions & { executionId: string }): Promise<EnsureResult> {
    return this.client.ensureSession(sessionId, { ...options, fromSnapshot: snapshotId });
  }

  /** Forks a workflow execution from a snapshot: {@link Sandlane.ensureWorkflow} with `fromSnapshot`. */
  forkWorkflow(snapshotId: string, executionId: string, options: RequestOptions = {}) {
    return this.client.ensureWorkflow(executionId, { ...options, fromSnapshot: snapshotId });
  }
}

/** The org's brokered secrets (write-only: no answer holds a value). */
export class SecretsApi {
  /** @internal */
  constructor(private readonly client: Sandlane) {}

  /** Makes or replaces a secret; answers its binding and whether it was made (201) or replaced (200). */
  set(name: string, secret: SecretInput, options: RequestOptions = {}): Promise<{ secret: SecretInfo; created: boolean }> {
    return this.client.transport.send(
      { method: "PUT", path: `${this.client.orgPath()}/secrets/${seg(name)}`, json: secret, ...options },
      async (r) => ({ secret: (await r.json()) as SecretInfo, created: r.status === 201 }),
    );
  }

  /** The secrets the caller may manage, by name. */
  async list(options: RequestOptions = {}): Promise<SecretInfo[]> {
    const body = await this.client.transport.json<{ secrets: SecretInfo[] }>({
      method: "GET",
      path: `${this.client.orgPath()}/secrets`,
      ...options,
    });
    return body.secrets;
  }

  /** Deletes a secret. */
  delete(name: string, options: RequestOptions = {}): Promise<void> {
    return this.client.transport.empty({ method: "DELETE", path: `${this.client.orgPath()}/secrets/${seg(name)}`, ...options });
  }
}

/** The org's webhook deliveries (service callers; the webhook is set with `sandlane org set`). */
export class WebhooksApi {
  /** @internal */
  constructor(private readonly client: Sandlane) {}

  /** One page of deliveries, newest first: `before` the previous page's `next`, `limit` 1 to 500 (default 50). */
  deliveries(options: RequestOptions & { before?: string; limit?: number } = {}): Promise<WebhookDeliveryPage> {
    const { before, limit, ...rest } = options;
    return this.client.transport.json({
      method: "GET",
      path: `${this.client.orgPath()}/webhooks/deliveries`,
      query: { before, limit },
      ...rest,
    });
  }
}

/** The org's audit log (service callers). */
export class AuditApi {
  /** @internal */
  constructor(private readonly client: Sandlane) {}

  /** One page: events after `after` (default 0), at most `limit` (1 to 1000, default 100), and `next`. */
  page(options: RequestOptions & { after?: number; limit?: number } = {}): Promise<AuditPage> {
    const { after, limit, ...rest } = options;
    return this.client.transport.json({
      method: "GET",
      path: `${this.client.orgPath()}/audit`,
      query: { after, limit },
      ...rest,
    });
  }

  /**
   * What `sandlane audit verify` says of the log now: `{verdict: "intact" | "tampered",
   * checked_at, message?}` (a verdict is reused by the server for up to 10 s).
   */
  verify(options: RequestOptions = {}): Promise<AuditVerdict> {
    return this.client.transport.json({ method: "GET", path: `${this.client.orgPath()}/audit/verify`, ...options });
  }

  /**
   * The audit tail: every event after `after`, oldest first, each exactly once, following
   * the server's `next` cursor page by page. With `follow` (the default) it then waits for
   * new events until `signal` aborts (the iteration then ends without an error); without,
   * it ends at the end of the log.
   */
  async *tail(options: AuditTailOptions = {}): AsyncGenerator<AuditEvent, void, undefined> {
    const follow = options.follow ?? true;
    const interval = options.pollIntervalMs ?? 1000;
    let after = options.after ?? 0;
    const signal = options.signal;
    for (;;) {
      let page: AuditPage;
      try {
        page = await this.page({ after, limit: options.pageSize ?? 100, signal, timeoutMs: options.timeoutMs });
      } catch (error) {
        if (signal?.aborted) return;
        throw error;
      }
      for (const event of page.events) yield event;
      // The server's cursor: never recomputed from the events (a page may end short of it).
      const moved = page.next !== after;
      after = page.next;
      if (page.events.length > 0 || moved) continue;
      if (!follow) return;
      if (!(await sleep(interval, signal))) return;
    }
  }
}

/** Waits `ms`; false when the signal aborted first. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A sandbox's interactive terminals (PTYs). Needs a server with the terminal routes
 * (`…/sandboxes/{id}/terminals`); an older server answers {@link NotFoundError}.
 */
export class TerminalsApi {
  /** @internal */
  constructor(private readonly sandbox: Sandbox) {}

  /** Starts a terminal: 201 `{id: "term_…"}`. */
  create(options: CreateTerminalOptions = {}): Promise<TerminalInfo> {
    const { argv, cols, rows, ...rest } = options;
    const body: Record<string, unknown> = { cols: cols ?? 80, rows: rows ?? 24 };
    if (argv !== undefined) body.argv = argv;
    return this.sandbox.client.transport.json({ method: "POST", path: `${this.sandbox.path}/terminals`, json: body, ...rest });
  }

  /** The sandbox's terminals. */
  async list(options: RequestOptions = {}): Promise<TerminalInfo[]> {
    const body = await this.sandbox.client.transport.json<{ terminals?: TerminalInfo[] } | TerminalInfo[]>({
      method: "GET",
      path: `${this.sandbox.path}/terminals`,
      ...options,
    });
    return Array.isArray(body) ? body : (body.terminals ?? []);
  }

  /** One terminal (its process: running, exit code, size). */
  get(terminalId: string, options: RequestOptions = {}): Promise<TerminalInfo> {
    return this.sandbox.client.transport.json({
      method: "GET",
      path: `${this.sandbox.path}/terminals/${seg(terminalId)}`,
      ...options,
    });
  }

  /** Ends a terminal. */
  delete(terminalId: string, options: RequestOptions = {}): Promise<void> {
    return this.sandbox.client.transport.empty({
      method: "DELETE",
      path: `${this.sandbox.path}/terminals/${seg(terminalId)}`,
      ...options,
    });
  }

  /**
   * A short-lived ticket for the terminal's WebSocket, usable as `?access_token=` where a
   * header cannot be set (a browser): hand it to a front end instead of the key.
   */
  ticket(terminalId: string, options: RequestOptions = {}): Promise<TerminalTicket> {
    return this.sandbox.client.transport.json({
      method: "POST",
      path: `${this.sandbox.path}/terminals/${seg(terminalId)}/tickets`,
      ...options,
    });
  }

  /**
   * The WebSocket URL of a terminal with a ticket as its `access_token` (`ws:` or `wss:`
   * as the base URL is `http:` or `https:`).
   */
  webSocketUrl(terminalId: string, ticket: string): string {
    const url = this.sandbox.client.transport.url(`${this.sandbox.path}/terminals/${seg(terminalId)}`, {
      access_token: ticket,
    });
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    return url.toString();
  }

  /**
   * Attaches to a terminal: mints a ticket, opens its WebSocket and answers a
   * {@link Terminal} once it is open (the last 64 KiB of output are replayed first).
   */
  async connect(terminalId: string, options: TerminalConnectOptions & RequestOptions = {}): Promise<Terminal> {
    const { ticket } = await this.ticket(terminalId, { signal: options.signal, timeoutMs: options.timeoutMs });
    return Terminal.open(this.webSocketUrl(terminalId, ticket), {
      ...options,
      WebSocket: options.WebSocket ?? this.sandbox.client.webSocket,
    });
  }
}

/**
 * A sandbox's preview links: URLs that reach a port a process in the sandbox listens on.
 * Needs a server with the preview-link routes; an older one answers {@link NotFoundError}.
 */
export class PreviewLinksApi {
  /** @internal */
  constructor(private readonly sandbox: Sandbox) {}

  /** Makes a link to `port` that works for `ttlS` seconds: 201 `{id, url, expires_at}`. */
  create(port: number, options: RequestOptions & { ttlS: number }): Promise<PreviewLink> {
    const { ttlS, ...rest } = options;
    return this.sandbox.client.transport.json({
      method: "POST",
      path: `${this.sandbox.path}/ports/${seg(port)}/links`,
      json: { ttl_s: ttlS },
      ...rest,
    });
  }

  /** The port's links, oldest first, revoked and expired ones too (their `url` without a token). */
  async list(port: number, options: RequestOptions = {}): Promise<PreviewLink[]> {
    const body = await this.sandbox.client.transport.json<{ links: PreviewLink[] }>({
      method: "GET",
      path: `${this.sandbox.path}/ports/${seg(port)}/links`,
      ...options,
    });
    return body.links;
  }

  /** Revokes a link at once. */
  delete(port: number, linkId: string, options: RequestOptions = {}): Promise<void> {
    return this.sandbox.client.transport.empty({
      method: "DELETE",
      path: `${this.sandbox.path}/ports/${seg(port)}/links/${seg(linkId)}`,
      ...options,
    });
  }
}

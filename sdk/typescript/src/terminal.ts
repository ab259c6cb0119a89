import { concatBytes } from "./streams.js";

/**
 * The WebSocket a terminal needs: the standard (WHATWG) interface, which the global
 * `WebSocket` of Node 22+ (Node 20 with `--experimental-websocket`), browsers, Deno and
 * Bun have, and so does the `ws` package's class.
 */
export interface WebSocketLike {
  /** Set to `"arraybuffer"` by the terminal, so binary messages arrive as bytes. */
  binaryType: string;
  /** The standard ready state (0 connecting, 1 open, 2 closing, 3 closed). */
  readonly readyState: number;
  /** Sends a text (string) or binary (bytes) message. */
  send(data: string | ArrayBuffer | Uint8Array): void;
  /** Closes the connection. */
  close(code?: number, reason?: string): void;
  /** Listens for `open`, `message` (`event.data`), `close` and `error`. */
  addEventListener(type: string, listener: (event: any) => void): void;
}

/** A WebSocket class (`globalThis.WebSocket`, or `ws`'s default export). */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

/** Options of a terminal's attachment. */
export interface TerminalConnectOptions {
  /** The WebSocket class to connect with (default: the global one, else the `ws` package). */
  WebSocket?: WebSocketConstructor | undefined;
  /** Called with each chunk of terminal output as it arrives (also readable by iterating). */
  onData?: ((bytes: Uint8Array) => void) | undefined;
  /** Aborts the connection attempt (and closes an open terminal connection). */
  signal?: AbortSignal | undefined;
}

/** A control message the server sends on a terminal's WebSocket (as text). */
export type TerminalServerMessage = { type: "exit"; exit_code: number } | { type: string; [field: string]: unknown };

/** A control message a client sends on a terminal's WebSocket (as text). */
export type TerminalClientMessage = { type: "resize"; cols: number; rows: number };

const encoder = new TextEncoder();

/** Encodes terminal input: bytes as they are, text as UTF-8 (sent as a binary message). */
export function encodeTerminalInput(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? encoder.encode(data) : data;
}

/** Encodes a resize as the text control message the server reads. */
export function encodeResize(cols: number, rows: number): string {
  if (!Number.isInteger(cols) || !Number.isInteger(rows) || cols < 1 || rows < 1) {
    throw new RangeError(`terminal size must be positive integers, got ${cols}x${rows}`);
  }
  const message: TerminalClientMessage = { type: "resize", cols, rows };
  return JSON.stringify(message);
}

/**
 * Decodes one message from a terminal's WebSocket: binary data is terminal output
 * (`{output}`), text is a JSON control message (`{control}`); text that is not JSON is
 * `{control: undefined}` and ignored.
 */
export function decodeTerminalMessage(data: unknown): { output: Uint8Array } | { control: TerminalServerMessage | undefined } {
  if (typeof data === "string") {
    try {
      const parsed = JSON.parse(data) as unknown;
      if (parsed && typeof parsed === "object" && typeof (parsed as { type?: unknown }).type === "string") {
        return { control: parsed as TerminalServerMessage };
      }
    } catch {
      // not a control message
    }
    return { control: undefined };
  }
  if (data instanceof ArrayBuffer) return { output: new Uint8Array(data) };
  if (ArrayBuffer.isView(data)) return { output: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) };
  if (Array.isArray(data)) {
    // `ws` with binaryType "fragments"
    return { output: concatBytes(data as Uint8Array[]) };
  }
  throw new TypeError(`unexpected terminal message of type ${Object.prototype.toString.call(data)}`);
}

async function resolveWebSocket(given: WebSocketConstructor | undefined): Promise<WebSocketConstructor> {
  if (given) return given;
  const global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  if (global) return global;
  try {
    const name = "ws"; // an optional peer dependency: resolved at run time only
    const mod = (await import(name)) as { default?: WebSocketConstructor; WebSocket?: WebSocketConstructor };
    const ctor = mod.WebSocket ?? mod.default;
    if (ctor) return ctor;
  } catch {
    // not installed
  }
  throw new TypeError(
    "sandlane: terminals need a WebSocket: run Node 22+ (or Node 20 with --experimental-websocket), " +
      "install the `ws` package, or pass options.WebSocket",
  );
}

/**
 * An attached terminal: write bytes in, read bytes out (iterate it, or `onData`), resize
 * it, and learn its exit status. Binary messages carry terminal bytes both ways; text
 * messages carry JSON control (`resize` in, `exit` out).
 */
export class Terminal implements AsyncIterable<Uint8Array> {
  private readonly queue: Uint8Array[] = [];
  private waiting: ((r: IteratorResult<Uint8Array>) => void) | undefined;
  private ended = false;
  private failure: unknown;
  private exitCode: number | null = null;
  private readonly done: Promise<number | null>;
  private resolveDone!: (code: number | null) => void;

  private constructor(
    private readonly socket: WebSocketLike,
    private readonly onData: ((bytes: Uint8Array) => void) | undefined,
  ) {
    this.done = new Promise((resolve) => (this.resolveDone = resolve));
    socket.addEventListener("message", (event: { data: unknown }) => this.receive(event.data));
    socket.addEventListener("close", () => this.finish());
    socket.addEventListener("error", (event: { error?: unknown; message?: string }) => {
      this.failure = event?.error ?? new Error(event?.message ?? "terminal WebSocket error");
      this.finish();
    });
  }

  /**
   * Opens a terminal's WebSocket at `url` (one {@link TerminalsApi.webSocketUrl} gives)
   * and answers once it is open.
   */
  static async open(url: string, options: TerminalConnectOptions = {}): Promise<Terminal> {
    const Ctor = await resolveWebSocket(options.WebSocket);
    if (options.signal?.aborted) throw options.signal.reason;
    const socket = new Ctor(url);
    socket.binaryType = "arraybuffer";
    const terminal = new Terminal(socket, options.onData);
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        socket.close();
        reject(options.signal?.reason);
      };
      options.signal?.addEventListener("abort", onAbort, { once: true });
      socket.addEventListener("open", () => {
        options.signal?.removeEventListener("abort", onAbort);
        resolve();
      });
      socket.addEventListener("error", (event: { error?: unknown; message?: string }) =>
        reject(event?.error ?? new Error(event?.message ?? `cannot open ${url.replace(/access_token=[^&]*/, "access_token=…")}`)),
      );
      socket.addEventListener("close", () => reject(new Error("the terminal's WebSocket closed before it opened")));
    });
    options.signal?.addEventListener("abort", () => terminal.close(), { once: true });
    return terminal;
  }

  /** Sends input (keystrokes, a command line): text is sent as its UTF-8 bytes. */
  write(data: string | Uint8Array): void {
    this.socket.send(encodeTerminalInput(data));
  }

  /** Resizes the terminal. */
  resize(cols: number, rows: number): void {
    this.socket.send(encodeResize(cols, rows));
  }

  /** The exit status once the program ended (`null` before, or when the socket closed without one). */
  get exit(): number | null {
    return this.exitCode;
  }

  /**
   * Answers the program's exit status once the connection ends (`null` when it ended
   * without an exit message: detached, or the server went away).
   */
  wait(): Promise<number | null> {
    return this.done;
  }

  /** Detaches (the terminal goes on running on the server; delete it to end it). */
  close(): void {
    try {
      this.socket.close(1000);
    } catch {
      // already closed
    }
    this.finish();
  }

  /**
   * The terminal's output, chunk by chunk, until the connection ends. Breaking out of a
   * loop does not detach: output goes on queueing for the next loop, so a program can
   * read up to a prompt, write, and read on. {@link close} detaches.
   */
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return {
      next: () => {
        const chunk = this.queue.shift();
        if (chunk) return Promise.resolve({ value: chunk, done: false });
        if (this.ended) {
          if (this.failure !== undefined) {
            const failure = this.failure;
            this.failure = undefined;
            return Promise.reject(failure);
          }
          return Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve) => (this.waiting = resolve));
      },
      // Leaving a loop early stops that loop only: the terminal stays attached and its
      // output keeps queueing for the next loop (detach with close()).
      return: () => Promise.resolve({ value: undefined, done: true }),
    };
  }

  private receive(data: unknown): void {
    const message = decodeTerminalMessage(data);
    if ("output" in message) {
      this.onData?.(message.output);
      if (this.waiting) {
        const resolve = this.waiting;
        this.waiting = undefined;
        resolve({ value: message.output, done: false });
      } else {
        this.queue.push(message.output);
      }
    } else if (message.control?.type === "exit" && typeof message.control.exit_code === "number") {
      this.exitCode = message.control.exit_code;
    }
  }

  private finish(): void {
    if (this.ended) return;
    this.ended = true;
    this.resolveDone(this.exitCode);
    if (this.waiting) {
      const resolve = this.waiting;
      this.waiting = undefined;
      resolve({ value: undefined, done: true });
    }
  }
}

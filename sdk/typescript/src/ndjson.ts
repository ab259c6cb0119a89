import type { components } from "./generated/openapi.js";
import { errorFor } from "./errors.js";
import { decodeBase64, iterateStream } from "./streams.js";

/** One NDJSON line of a streamed output as the API sends it (`StreamFrame`). */
export type WireStreamFrame = components["schemas"]["StreamFrame"];

/**
 * Bytes a command wrote to its standard output or error, decoded: `bytes` are exactly
 * what it wrote in this frame (from the line's `text`, UTF-8, or its `data`, base64).
 * Concatenating the `bytes` of every frame of one stream gives the command's output
 * byte for byte.
 */
export interface OutputFrame {
  /** Which stream. */
  type: "stdout" | "stderr";
  /** The bytes. */
  bytes: Uint8Array;
  /** The bytes as text, when the server sent them as text (valid UTF-8); else `undefined`. */
  text: string | undefined;
}

/** The last frame of a stream that ran to the end: how the command ended. */
export interface ExitFrame {
  type: "exit";
  /** The exit status (`128 + signal` when a signal ended it). */
  exit_code: number;
  /** Whether its timeout killed it. */
  timed_out: boolean;
  /** Whether output was left out (past the cap, or dropped from a process's buffer). */
  truncated: boolean;
}

/**
 * A decoded frame of a streamed exec or of a process's output. A stream's `error` line is
 * not a frame: the iterator throws it as the typed {@link SandlaneError} of its code.
 */
export type StreamFrame = OutputFrame | ExitFrame;

const encoder = new TextEncoder();

/**
 * Decodes one NDJSON line as the API defines it. Throws the line's typed error for an
 * `error` line, `InternalError` for a line that is not a frame.
 */
export function decodeFrame(line: string, request?: string): StreamFrame {
  let wire: WireStreamFrame;
  try {
    wire = JSON.parse(line) as WireStreamFrame;
  } catch (cause) {
    throw errorFor("internal", `a streamed output line is not JSON: ${line.slice(0, 200)}`, { request, cause });
  }
  switch (wire.type) {
    case "stdout":
    case "stderr": {
      if (typeof wire.text === "string") {
        return { type: wire.type, bytes: encoder.encode(wire.text), text: wire.text };
      }
      if (typeof wire.data === "string") {
        return { type: wire.type, bytes: decodeBase64(wire.data), text: undefined };
      }
      return { type: wire.type, bytes: new Uint8Array(0), text: "" };
    }
    case "exit":
      return { type: "exit", exit_code: wire.exit_code, timed_out: wire.timed_out, truncated: wire.truncated };
    case "error":
      throw errorFor(wire.error, wire.message, { request });
    default:
      throw errorFor("internal", `unknown stream frame: ${line.slice(0, 200)}`, { request });
  }
}

/**
 * Splits a byte stream into lines (on `\n`, decoding UTF-8 across chunk boundaries) and
 * yields each non-empty line.
 */
export async function* ndjsonLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string, void, undefined> {
  const decoder = new TextDecoder("utf-8");
  let pending = "";
  for await (const chunk of iterateStream(stream)) {
    pending += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline).trim();
      pending = pending.slice(newline + 1);
      if (line) yield line;
    }
  }
  pending += decoder.decode();
  const last = pending.trim();
  if (last) yield last;
}

/**
 * Decodes an NDJSON stream of frames. Ends after the `exit` frame; throws the typed error
 * of an `error` line, and `UnavailableError` when the stream ends with neither (the
 * connection broke off), so a cut stream is never taken for a whole one.
 */
export async function* decodeFrames(
  stream: ReadableStream<Uint8Array>,
  request?: string,
  options: { requireEnd?: boolean } = {},
): AsyncGenerator<StreamFrame, void, undefined> {
  const requireEnd = options.requireEnd ?? true;
  for await (const line of ndjsonLines(stream)) {
    const frame = decodeFrame(line, request);
    yield frame;
    if (frame.type === "exit") return;
  }
  if (requireEnd) {
    throw errorFor("unavailable", "the stream ended without an exit line (the connection broke off)", { request });
  }
}

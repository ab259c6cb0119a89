/**
 * What a file, an archive or a process's input may be sent as: bytes, text, a Blob, a web
 * `ReadableStream`, or any (async) iterable of byte chunks (a Node `Readable` is one).
 * Streams and iterables are sent as they are read, never collected first.
 */
export type BodyInput =
  | string
  | Uint8Array
  | ArrayBuffer
  | Blob
  | ReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array | string>
  | Iterable<Uint8Array>;

type FetchBody = NonNullable<RequestInit["body"]>;

const encoder = new TextEncoder();

function toBytes(chunk: unknown): Uint8Array {
  if (typeof chunk === "string") return encoder.encode(chunk);
  if (chunk instanceof Uint8Array) return chunk;
  if (chunk instanceof ArrayBuffer) return new Uint8Array(chunk);
  if (ArrayBuffer.isView(chunk)) return new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  throw new TypeError(`a body chunk must be bytes or a string, not ${typeof chunk}`);
}

/** Whether a body is a stream (then fetch needs `duplex: "half"`). */
export function isStreamBody(body: BodyInput): boolean {
  return (
    typeof body !== "string" &&
    !(body instanceof Uint8Array) &&
    !(body instanceof ArrayBuffer) &&
    !(typeof Blob !== "undefined" && body instanceof Blob)
  );
}

/**
 * A body for `fetch`: bytes and Blobs as they are; streams and iterables as a
 * `ReadableStream` pulled chunk by chunk as the connection takes them (back-pressure).
 */
export function toFetchBody(body: BodyInput): FetchBody {
  if (typeof body === "string" || body instanceof Uint8Array || body instanceof ArrayBuffer) {
    return body as FetchBody;
  }
  if (typeof Blob !== "undefined" && body instanceof Blob) return body;
  if (typeof ReadableStream !== "undefined" && body instanceof ReadableStream) return body as FetchBody;
  return iterableToStream(body as AsyncIterable<unknown> | Iterable<unknown>) as FetchBody;
}

/** Wraps an (async) iterable of chunks as a byte `ReadableStream`, pulled on demand. */
export function iterableToStream(source: AsyncIterable<unknown> | Iterable<unknown>): ReadableStream<Uint8Array> {
  const iterator =
    Symbol.asyncIterator in source
      ? (source as AsyncIterable<unknown>)[Symbol.asyncIterator]()
      : (source as Iterable<unknown>)[Symbol.iterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        for (;;) {
          const { value, done } = await iterator.next();
          if (done) {
            controller.close();
            return;
          }
          const bytes = toBytes(value);
          if (bytes.byteLength > 0) {
            controller.enqueue(bytes);
            return;
          }
        }
      } catch (error) {
        controller.error(error);
      }
    },
    async cancel(reason) {
      await iterator.return?.(reason);
    },
  });
}

/**
 * Reads a byte stream chunk by chunk. Stopping the loop early (break, throw) cancels the
 * stream, which ends the transfer.
 */
export async function* iterateStream(stream: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array, void, undefined> {
  const reader = stream.getReader();
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      yield value;
    }
  } finally {
    if (!finished) {
      await reader.cancel().catch(() => undefined);
    }
    reader.releaseLock();
  }
}

/** Joins byte chunks into one array. */
export function concatBytes(chunks: readonly Uint8Array[]): Uint8Array {
  let length = 0;
  for (const c of chunks) length += c.byteLength;
  const out = new Uint8Array(length);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

/** Decodes standard (padded) base64 into bytes, with Node's `Buffer` when there is one. */
export function decodeBase64(text: string): Uint8Array {
  const NodeBuffer = (globalThis as { Buffer?: { from(s: string, e: string): Uint8Array } }).Buffer;
  if (NodeBuffer) {
    const b = NodeBuffer.from(text, "base64");
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

import { errorFromResponse } from "./errors.js";
import { type BodyInput, isStreamBody, toFetchBody } from "./streams.js";

/** The `fetch` the client calls (the platform's, or one you hand it: a proxy, a test fake). */
export type FetchLike = (input: string | URL, init?: RequestInit) => Promise<Response>;

/** Options every call takes. */
export interface RequestOptions {
  /** Aborts the call (and, for a stream, the transfer): the promise or iterator rejects. */
  signal?: AbortSignal | undefined;
  /**
   * How long to wait, in milliseconds: for a JSON call, for the whole answer; for a
   * streamed answer (exec output, a download), for its status line and headers only, so a
   * long transfer is never cut. Defaults to the client's `timeoutMs`.
   */
  timeoutMs?: number | undefined;
}

/** @internal What one request needs. */
export interface CallSpec extends RequestOptions {
  method: "GET" | "PUT" | "POST" | "DELETE";
  path: string;
  query?: Record<string, string | number | boolean | undefined> | undefined;
  json?: unknown;
  body?: BodyInput | undefined;
  contentType?: string | undefined;
  form?: Record<string, string> | undefined;
  accept?: string | undefined;
  /** Whether the answer is read as a stream (the timeout then stops at the headers). */
  stream?: boolean;
  /** Whether to send the credential (false for the anonymous routes). */
  auth?: boolean;
}

/** @internal The transport shared by the client and its handles. */
export class Transport {
  constructor(
    readonly baseUrl: string,
    readonly apiKey: string | undefined,
    readonly fetchImpl: FetchLike,
    readonly timeoutMs: number,
    readonly headers: Record<string, string>,
  ) {}

  url(path: string, query?: CallSpec["query"]): URL {
    const url = new URL(this.baseUrl.replace(/\/+$/, "") + path);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    return url;
  }

  /**
   * Sends one request and hands a 2xx response to `consume`; any other status throws the
   * typed error. The timeout and the caller's signal abort the request and `consume`;
   * with `spec.stream` the timeout stops once the headers are in, and the answer's body
   * (returned as a stream) stays under the caller's signal until it is read or cancelled.
   */
  async send<T>(spec: CallSpec, consume: (response: Response) => Promise<T>): Promise<T> {
    if (spec.signal?.aborted) throw spec.signal.reason ?? new DOMException("aborted", "AbortError");
    const controller = new AbortController();
    const timeoutMs = spec.timeoutMs ?? this.timeoutMs;
    const request = `${spec.method} ${spec.path}`;
    const onAbort = () => controller.abort(spec.signal?.reason);
    spec.signal?.addEventListener("abort", onAbort, { once: true });
    const detach = () => spec.signal?.removeEventListener("abort", onAbort);
    const timer =
      timeoutMs > 0 && Number.isFinite(timeoutMs)
        ? setTimeout(
            () => controller.abort(new DOMException(`${request} took more than ${timeoutMs} ms`, "TimeoutError")),
            timeoutMs,
          )
        : undefined;
    const headers: Record<string, string> = { ...this.headers };
    if (spec.auth !== false && this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (spec.accept) headers.accept = spec.accept;
    const init: RequestInit & { duplex?: "half" } = { method: spec.method, headers, signal: controller.signal };
    if (spec.json !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(spec.json);
    } else if (spec.form !== undefined) {
      headers["content-type"] = "application/x-www-form-urlencoded";
      init.body = new URLSearchParams(spec.form).toString();
    } else if (spec.body !== undefined) {
      headers["content-type"] = spec.contentType ?? "application/octet-stream";
      init.body = toFetchBody(spec.body);
      if (isStreamBody(spec.body)) {
        // A streamed request body needs half duplex in fetch (Node's and the standard's).
        init.duplex = "half";
        // And no redirect following: a fetch that may follow one keeps a tee of the body
        // to send again, i.e. the whole upload in memory (Node's undici does). A stream
        // cannot be sent twice anyway, so a redirect fails the upload either way.
        init.redirect = "error";
      }
    }
    const aborted = (error: unknown) => (controller.signal.aborted ? (controller.signal.reason ?? error) : error);
    let handedOver = false;
    try {
      let response: Response;
      try {
        response = await this.fetchImpl(this.url(spec.path, spec.query), init);
      } catch (error) {
        throw aborted(error);
      }
      if (!response.ok) throw await errorFromResponse(response, request);
      if (spec.stream && response.body) {
        if (timer !== undefined) clearTimeout(timer);
        handedOver = true;
        return await consume(wrapBody(response, aborted, detach));
      }
      try {
        return await consume(response);
      } catch (error) {
        throw aborted(error);
      }
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      if (!handedOver) detach();
    }
  }

  /** Sends a request and parses its JSON answer (the whole call under the timeout). */
  json<T>(spec: CallSpec): Promise<T> {
    return this.send(spec, async (response) => {
      const text = await response.text();
      return (text ? JSON.parse(text) : undefined) as T;
    });
  }

  /** Sends a request whose answer has no body (204). */
  empty(spec: CallSpec): Promise<void> {
    return this.send(spec, async (response) => {
      await response.body?.cancel();
    });
  }

  /** Sends a request and answers its body as a stream (the timeout covers the headers only). */
  stream(spec: CallSpec): Promise<Response> {
    return this.send({ ...spec, stream: true }, async (response) => response);
  }
}

/** A response whose body reports an abort by its reason and lets go of the signal once read. */
function wrapBody(response: Response, aborted: (error: unknown) => unknown, detach: () => void): Response {
  const reader = (response.body as ReadableStream<Uint8Array>).getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(c) {
      try {
        const { value, done } = await reader.read();
        if (done) {
          detach();
          c.close();
        } else c.enqueue(value);
      } catch (error) {
        detach();
        c.error(aborted(error));
      }
    },
    async cancel(reason) {
      detach();
      await reader.cancel(reason).catch(() => undefined);
    },
  });
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
}

/** @internal A path segment, percent-encoded. */
export function seg(value: string | number): string {
  return encodeURIComponent(String(value));
}

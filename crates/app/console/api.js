// The console's one way to the server: its public API, with the signed-in service key as
// `Authorization: Bearer`. The key lives in this tab's sessionStorage and nowhere else.

const KEY = "sandlane.console.key";
const ORG = "sandlane.console.org";

/** An answer of the API that is not a success: its status, code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  /** Words for a person: what the server said, and what it means here. */
  describe() {
    if (this.status === 401) return `The key was not accepted (401 unauthenticated): ${this.message}`;
    if (this.status === 403) return `Not allowed (403 permission_denied): ${this.message}`;
    if (this.status === 0) return this.message;
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

/** The signed-in session of this tab, or null. */
export function saved() {
  const key = sessionStorage.getItem(KEY);
  const org = sessionStorage.getItem(ORG);
  return key && org ? new Api(org, key) : null;
}

export function forget() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(ORG);
}

export class Api {
  constructor(org, key) {
    this.org = org;
    this.key = key;
  }

  /** Keeps this session for the tab (and only the tab). */
  remember() {
    sessionStorage.setItem(KEY, this.key);
    sessionStorage.setItem(ORG, this.org);
  }

  /** A path under `/v1/orgs/{org}`. */
  orgPath(rest) {
    return `/v1/orgs/${encodeURIComponent(this.org)}${rest}`;
  }

  /** Sends a request; answers the response when it succeeded, throws ApiError otherwise. */
  async raw(method, path, { body, query, accept } = {}) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
    }
    const headers = { authorization: `Bearer ${this.key}` };
    if (accept) headers.accept = accept;
    let payload;
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      payload = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, { method, headers, body: payload, credentials: "omit", cache: "no-store" });
    } catch (e) {
      throw new ApiError(0, "network", `The server did not answer (${e.message}).`);
    }
    if (!response.ok) {
      let code = "error";
      let message = response.statusText;
      try {
        const error = await response.json();
        code = error.error ?? code;
        message = error.message ?? message;
      } catch {
        // not the API's JSON error: keep the status line
      }
      throw new ApiError(response.status, code, message);
    }
    return response;
  }

  /** As `raw`, the answer's JSON (null for 204). */
  async json(method, path, options) {
    const response = await this.raw(method, path, options);
    if (response.status === 204) return null;
    return response.json();
  }

  get(path, query) {
    return this.json("GET", path, { query });
  }

  post(path, body) {
    return this.json("POST", path, { body });
  }
}

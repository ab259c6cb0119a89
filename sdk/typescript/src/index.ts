/**
 * `@sandlane/sdk`: the TypeScript client of sandlane's HTTP API v1, and the ensure steps
 * for a TypeScript host's create chain.
 *
 * @packageDocumentation
 */
export * from "./client.js";
export * from "./errors.js";
export * from "./chain.js";
export * from "./ndjson.js";
export * from "./streams.js";
export * from "./terminal.js";
export * from "./types.js";
export type { FetchLike, RequestOptions } from "./http.js";

// Preview links against the real server: made and revoked.
import assert from "node:assert/strict";
import { it } from "node:test";
import { client, freshSandbox } from "./helpers.mjs";

it("a preview link is made and revoked", async () => {
  const sbx = await freshSandbox();
  await sbx.processes.start(["python3", "-m", "http.server", "8000"]);
  const link = await sbx.previewLinks.create(8000, { ttlS: 60 });
  assert.ok(link.url);
  await sbx.previewLinks.delete(8000, link.id);
});

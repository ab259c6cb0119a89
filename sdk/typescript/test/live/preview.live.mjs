// NOT RUN YET: preview links against a server with those routes (scripts/sdk-typescript.sh
// runs test/*.test.mjs only); move it into test/ once the server has them.
import assert from "node:assert/strict";
import { it } from "node:test";
import { client, freshSandbox } from "../helpers.mjs";

it("a preview link is made and revoked", async () => {
  const sbx = await freshSandbox();
  await sbx.processes.start(["python3", "-m", "http.server", "8000"]);
  const link = await sbx.previewLinks.create(8000, { ttlS: 60 });
  assert.ok(link.url);
  await sbx.previewLinks.delete(8000, link.id);
});

-- An org's sandboxes in id order, a page at a time (`GET /v1/orgs/{org}/sandboxes`, the
-- console's list): one index range per page, whatever the org holds.
CREATE INDEX sandboxes_org_id ON sandboxes (org, id);

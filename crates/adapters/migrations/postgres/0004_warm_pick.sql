-- The adoption takes an org's oldest ready warm sandbox (`ORDER BY created_at, id`). An
-- index in exactly that order lets it read the one row it takes; the index without `id`
-- left a sort on top, so each adoption read and sorted a group of warm sandboxes (32 or
-- more) to take one.
CREATE INDEX warm_sandboxes_pick ON warm_sandboxes (org, state, created_at, id);
DROP INDEX warm_sandboxes_org;

-- The deliveries that ended (delivered, or given up), by when: what the webhook pass
-- prunes once `webhooks.retention_ms` has passed. Pending deliveries are never in it.
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries (updated_at) WHERE status <> 'pending';

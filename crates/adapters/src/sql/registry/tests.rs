//! The claim's relaxed commit on Postgres: it holds for the claim's own transaction and
//! never outlives it on the connection. The request path keeps its connections, and every
//! later commit on them (an audit event's) must wait for the WAL flush again.

use sqlx::Row as _;

use super::{CLAIM_POSTGRES, RecordRow, claim_of};
use crate::sql::contract::{claim_request, fresh_postgres_url, session_key};
use crate::sql::{Backend, Store, StoreOptions};
use ports::{ClaimOutcome, ClaimRequest};

async fn synchronous_commit(conn: &mut sqlx::PgConnection) -> String {
    sqlx::query("SHOW synchronous_commit").fetch_one(conn).await.expect("show").get(0)
}

#[tokio::test]
async fn a_claim_relaxes_its_own_commit_and_leaves_the_connection_durable() {
    let Some(url) = fresh_postgres_url().await else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(StoreOptions::new(dir.path()).with_url(Some(&url))).await.expect("store");
    let Backend::Postgres(pool, _) = store.backend() else { unreachable!("a Postgres store") };
    let mut conn = pool.acquire().await.expect("connection");
    assert_eq!(synchronous_commit(&mut conn).await, "on", "the connection starts durable");

    // Created, then the same key claimed again (a re-ensure): each in a transaction of its
    // own, as the org's lock takes it, where the setting is visible before the commit.
    let key = session_key("acme", "s-relaxed");
    for (candidate, outcome) in [(1, ClaimOutcome::Created), (2, ClaimOutcome::Existing)] {
        let request = claim_request(&key, candidate, "replica-a", 1_000);
        let mut tx = sqlx::Connection::begin(&mut *conn).await.expect("begin");
        let row: RecordRow =
            bind_claim!(sqlx::query_as(CLAIM_POSTGRES), &request).fetch_one(&mut *tx).await.expect("claim");
        assert_eq!(claim_of(row, &request).expect("claim").outcome, outcome);
        assert_eq!(synchronous_commit(&mut tx).await, "off", "the claim's transaction is relaxed");
        tx.commit().await.expect("commit");
        assert_eq!(synchronous_commit(&mut conn).await, "on", "and only that transaction");
    }

    // Outside a transaction, as the request path runs it: the statement is its own
    // transaction, and the connection is durable again right after it.
    let request = claim_request(&key, 3, "replica-a", 1_000);
    let row: RecordRow =
        bind_claim!(sqlx::query_as(CLAIM_POSTGRES), &request).fetch_one(&mut *conn).await.expect("claim");
    assert_eq!(claim_of(row, &request).expect("claim").outcome, ClaimOutcome::Existing);
    assert_eq!(synchronous_commit(&mut conn).await, "on");
}

//! The fast path's pool against the test Postgres: a connection goes back after an answer
//! (rows or a database error) and is reused; one whose statement was dropped halfway, or
//! that died while idle, is never used again.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::FastPath;

/// A pool of `size` on the test cluster; `None` when the developer skips Postgres.
fn pool(size: u32) -> Option<FastPath> {
    let url = tests::services::postgres_admin_url()?;
    Some(FastPath::new(PgConnectOptions::from_str(&url).expect("test URL"), size))
}

/// The backend pid of a checkout's connection, the connection given back.
async fn backend_pid(fast: &FastPath) -> i32 {
    let mut held = fast.checkout().await.expect("checkout");
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *held).await;
    held.give_back(&pid);
    pid.expect("pid")
}

/// Whether a backend with `pid` still exists, asked on a connection of its own.
async fn backend_alive(fast: &FastPath, pid: i32) -> bool {
    let mut conn =
        <sqlx::PgConnection as sqlx::Connection>::connect_with(&fast.options).await.expect("connect");
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(&mut conn)
        .await
        .expect("pg_stat_activity")
}

#[tokio::test]
async fn an_answered_statement_gives_its_connection_back_and_an_error_from_postgres_too() {
    let Some(fast) = pool(2) else { return };
    let first = backend_pid(&fast).await;
    assert_eq!(fast.idle_count(), 1);
    assert_eq!(backend_pid(&fast).await, first, "the same connection, no new one");
    // An error Postgres sends leaves the protocol at a message boundary: kept, and usable.
    let mut held = fast.checkout().await.unwrap();
    let failed: Result<i32, _> = sqlx::query_scalar("SELECT 1 / 0").fetch_one(&mut *held).await;
    assert!(matches!(failed, Err(sqlx::Error::Database(_))), "{failed:?}");
    held.give_back(&failed);
    assert_eq!(fast.idle_count(), 1);
    assert_eq!(backend_pid(&fast).await, first);
    fast.close().await;
    assert!(matches!(fast.checkout().await, Err(sqlx::Error::PoolClosed)));
}

#[tokio::test]
async fn a_statement_dropped_halfway_closes_its_connection() {
    let Some(fast) = pool(1) else { return };
    let first = backend_pid(&fast).await;
    // A client that goes away mid-statement: the future is dropped while Postgres works.
    let abandoned = tokio::time::timeout(Duration::from_millis(200), async {
        let mut held = fast.checkout().await.unwrap();
        let slept = sqlx::query("SELECT pg_sleep(2)").execute(&mut *held).await;
        held.give_back(&slept);
    })
    .await;
    assert!(abandoned.is_err(), "the statement was still running");
    assert_eq!(fast.idle_count(), 0, "not given back");
    // Its slot is free again (a pool of one), and the next statement gets a new connection.
    let second = tokio::time::timeout(Duration::from_secs(2), backend_pid(&fast)).await.expect("a free slot");
    assert_ne!(second, first);
    // The abandoned connection's socket was closed: Postgres ends that backend.
    let start = std::time::Instant::now();
    while backend_alive(&fast, first).await {
        assert!(start.elapsed() < Duration::from_secs(10), "backend {first} still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_idle_connection_that_died_is_replaced_before_use() {
    let Some(mut fast) = pool(1) else { return };
    fast.ping_idle = Duration::ZERO;
    let first = backend_pid(&fast).await;
    // Postgres ends it while it is idle (a restart, an administrator).
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect_with(&fast.options).await.unwrap();
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(ended);
    // The next checkout pings it, finds it gone, and connects anew: the statement succeeds.
    let second = backend_pid(&fast).await;
    assert_ne!(second, first);
    assert_eq!(fast.idle_count(), 1);
}

#[tokio::test]
async fn a_connection_past_its_lifetime_is_closed_not_reused() {
    let Some(mut fast) = pool(1) else { return };
    fast.max_lifetime = Duration::ZERO;
    let first = backend_pid(&fast).await;
    assert_eq!(fast.idle_count(), 0, "closed, not kept");
    assert_ne!(backend_pid(&fast).await, first);
    let start = std::time::Instant::now();
    while backend_alive(&fast, first).await {
        assert!(start.elapsed() < Duration::from_secs(10), "backend {first} still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn warming_opens_every_connection_ahead_each_with_generic_plans() {
    let Some(fast) = pool(3) else { return };
    fast.warm().await;
    assert_eq!(fast.idle_count(), 3, "all of the pool's connections are open and idle");
    // Three checkouts at once take the three warmed connections: no new backend.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(fast.checkout().await.expect("checkout"));
    }
    assert_eq!(fast.idle_count(), 0);
    for mut checkout in held {
        let mode: Result<String, _> =
            sqlx::query_scalar("SELECT current_setting('plan_cache_mode')").fetch_one(&mut *checkout).await;
        assert_eq!(mode.as_deref().ok(), Some("force_generic_plan"));
        checkout.give_back(&mode);
    }
    assert_eq!(fast.idle_count(), 3);
    fast.close().await;
}

#[tokio::test]
async fn warming_a_pool_whose_database_refuses_leaves_it_empty_and_connecting_on_demand() {
    let Some(fast) = pool(2) else { return };
    let refused = FastPath::new(fast.options.clone().database("sandlane_no_such_database"), 2);
    refused.warm().await;
    assert_eq!(refused.idle_count(), 0);
    assert!(refused.checkout().await.is_err(), "the connect error, not a hang");
    // The permits of the failed attempts came back: the pool is not exhausted.
    assert_eq!(refused.slots.available_permits(), 2);
}

#[tokio::test]
async fn a_plan_made_while_a_table_is_tiny_still_takes_its_index_once_the_table_has_grown() {
    let Some(fast) = pool(1) else { return };
    let mut held = fast.checkout().await.expect("checkout");
    let result: Result<String, sqlx::Error> = async {
        let conn = &mut *held;
        sqlx::raw_sql(
            "CREATE TEMP TABLE plan_probe (id TEXT PRIMARY KEY, n BIGINT NOT NULL); \
             INSERT INTO plan_probe VALUES ('a', 1); ANALYZE plan_probe",
        )
        .execute(&mut *conn)
        .await?;
        // The first execution plans the statement (generic, and kept for the connection).
        let statement = "SELECT n FROM plan_probe WHERE id = $1";
        let n: i64 = sqlx::query_scalar(statement).bind("a").fetch_one(&mut *conn).await?;
        assert_eq!(n, 1);
        sqlx::raw_sql("INSERT INTO plan_probe SELECT 'k' || g, g FROM generate_series(1, 20000) g")
            .execute(&mut *conn)
            .await?;
        let name: String = sqlx::query_scalar("SELECT name FROM pg_prepared_statements WHERE statement = $1")
            .bind(statement)
            .fetch_one(&mut *conn)
            .await?;
        let plan: Vec<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE {name}('k7')")))
                .fetch_all(&mut *conn)
                .await?;
        Ok(plan.join("\n"))
    }
    .await;
    held.give_back(&result);
    let plan = result.expect("the probe");
    // A one-page table is cheapest to scan whole; planned then and kept, that scan would
    // read all 20,000 rows on every execution.
    assert!(plan.contains("Index Scan using plan_probe_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    fast.close().await;
}

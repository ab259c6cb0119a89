//! A small pool of Postgres connections for the statements on a request's path, taken
//! back without a round trip.
//!
//! sqlx's pool (0.9) pings every connection it takes back, unconditionally, in case a
//! cancelled query left it mid-protocol: one more exchange with Postgres, with a wake-up
//! on each side, per statement, off the request's path but on the machine's CPUs. On
//! the lane's hottest path (an ensure adopting a warm sandbox: the caller-key read, the
//! adoption, ready + audit) that costs throughput when the server and Postgres share a
//! few cores (docs/benchmarks/2026-12-04.md, "sqlx pings every connection").
//!
//! Here a connection goes back only when its statement ran to Postgres's answer (rows, or
//! an error Postgres sent); that leaves the protocol at a message boundary. A connection
//! whose statement's future was dropped halfway (a client gone away) is dropped with it,
//! unused again, and so is one that failed in any other way (I/O, TLS, protocol). As in
//! the main pool, a connection idle for [`PING_IDLE`] is pinged before it is used, so a
//! restarted database costs a reconnect, not a failed request; and, as sqlx's default, a
//! connection is closed after [`MAX_LIFETIME`] rather than reused.
//!
//! The store opens all of the pool's connections when it starts ([`FastPath::warm`]), and
//! each takes its statements' generic plans from their first execution: the first burst
//! of requests after a start pays for no new Postgres backend and no planning. Those plans
//! go by an index wherever one applies, so a plan kept from when a table was small does
//! not read the whole table once it has grown (see `FastPath::connect`).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::PING_IDLE;

/// How long a connection serves before it is closed (sqlx's pool's default), so that no
/// Postgres backend lives for ever.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// An idle connection: since when it is idle, since when it exists.
struct Idle {
    conn: PgConnection,
    since: Instant,
    born: Instant,
}

/// The pool: at most `size` connections at once, idle ones kept for the next statement.
pub(crate) struct FastPath {
    options: PgConnectOptions,
    size: usize,
    idle: Mutex<Vec<Idle>>,
    slots: Semaphore,
    /// [`PING_IDLE`] (shorter in tests).
    ping_idle: Duration,
    /// [`MAX_LIFETIME`] (shorter in tests).
    max_lifetime: Duration,
}

/// A connection taken from [`FastPath`]: use it through `&mut *checkout`, then hand the
/// statement's result to [`Checkout::give_back`]. Dropped any other way, its connection is
/// closed, not reused.
pub(crate) struct Checkout<'a> {
    conn: PgConnection,
    born: Instant,
    home: &'a FastPath,
    _slot: SemaphorePermit<'a>,
}

impl FastPath {
    /// A pool of at most `size` connections (at least one) to `options`.
    pub(crate) fn new(options: PgConnectOptions, size: u32) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        Self {
            options,
            size,
            idle: Mutex::new(Vec::with_capacity(size)),
            slots: Semaphore::new(size),
            ping_idle: PING_IDLE,
            max_lifetime: MAX_LIFETIME,
        }
    }

    /// A connection: an idle one (pinged first when idle for [`PING_IDLE`]; one that does
    /// not answer is dropped), else a new one. Waits while all are in use.
    ///
    /// # Errors
    /// [`sqlx::Error::PoolClosed`] after [`FastPath::close`]; the connect error.
    pub(crate) async fn checkout(&self) -> Result<Checkout<'_>, sqlx::Error> {
        let slot = self.slots.acquire().await.map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let Some(Idle { mut conn, since, born }) = idle else {
                let conn = self.connect().await?;
                return Ok(Checkout { conn, born: Instant::now(), home: self, _slot: slot });
            };
            if since.elapsed() < self.ping_idle || conn.ping().await.is_ok() {
                return Ok(Checkout { conn, born, home: self, _slot: slot });
            }
        }
    }

    /// Opens the pool's connections ahead of the requests that will need them (at start):
    /// a burst of requests then finds them open instead of waiting for new backends (a
    /// fork, the catalog caches, each statement's first plans: 1 to 5 ms of Postgres's time
    /// each, measured). Stops at the first connection that fails (logged); the pool then
    /// connects on demand, as it does without this.
    pub(crate) async fn warm(&self) {
        let mut opened = Vec::with_capacity(self.size);
        while opened.len() < self.size {
            match self.checkout().await {
                Ok(checkout) => opened.push(checkout),
                Err(e) => {
                    tracing::warn!(error = %e, opened = opened.len(), "postgres: cannot open the request path's connections ahead");
                    break;
                }
            }
        }
        for checkout in opened {
            checkout.give_back(&Ok::<(), sqlx::Error>(()));
        }
    }

    /// A new connection whose prepared statements take their generic plan from the first
    /// execution, and whose plans go by an index wherever one applies.
    ///
    /// - `plan_cache_mode = force_generic_plan`: the statements on this path are fixed OLTP
    ///   statements; Postgres plans each anew for its first five executions on a connection
    ///   (0.2 to 1 ms at bind, measured here for the adoption), then keeps the generic plan
    ///   for them anyway.
    /// - `enable_seqscan = off`: a plan is made once per connection and kept while the
    ///   connection lives, so it must not depend on how large a table was at that moment.
    ///   Every statement here finds its rows by a key, and a table of one page (the warm
    ///   pools while they are small, the first callers) is cheapest to read whole: planned
    ///   then, the adoption went on reading and sorting the whole pool for every warm
    ///   sandbox it took (1.0 ms of execution each in a burst of 1,000, against 0.3 ms with
    ///   this setting; measured). A statement no index serves still scans; the setting
    ///   only makes that the planner's last resort.
    ///
    /// A server that rejects a setting (`plan_cache_mode` came in Postgres 12) keeps its
    /// default, logged at debug.
    async fn connect(&self) -> Result<PgConnection, sqlx::Error> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        for setting in ["SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off"] {
            if let Err(e) = sqlx::raw_sql(setting).execute(&mut conn).await {
                tracing::debug!(error = %e, setting, "postgres: a request-path setting left at its default");
            }
        }
        Ok(conn)
    }

    /// Closes the idle connections and refuses checkouts from now on.
    pub(crate) async fn close(&self) {
        self.slots.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        for Idle { conn, .. } in idle {
            let _ = conn.close().await;
        }
    }

    /// How many connections are idle (for tests).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl std::fmt::Debug for FastPath {
    // Not the connect options: they hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastPath").field("available", &self.slots.available_permits()).finish_non_exhaustive()
    }
}

impl Checkout<'_> {
    /// Ends the use of the connection: back to the pool when the statement ran to
    /// Postgres's answer (`result` is rows, no row, or an error Postgres sent) and the
    /// connection is younger than [`MAX_LIFETIME`], else closed.
    pub(crate) fn give_back<T>(self, result: &Result<T, sqlx::Error>) {
        let answered = matches!(result, Ok(_) | Err(sqlx::Error::Database(_) | sqlx::Error::RowNotFound));
        if answered && self.born.elapsed() < self.home.max_lifetime && !self.home.slots.is_closed() {
            let idle = Idle { conn: self.conn, since: Instant::now(), born: self.born };
            self.home.idle.lock().unwrap_or_else(PoisonError::into_inner).push(idle);
        } else if answered {
            // Closed politely (Terminate) off the request's path.
            tokio::spawn(async move {
                let _ = self.conn.close().await;
            });
        }
    }
}

impl std::ops::Deref for Checkout<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Checkout<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

#[cfg(test)]
mod tests;

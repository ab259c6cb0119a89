//! The sandlane server as a library: [`Server::build`] composes the adapters from the
//! settings and binds the listener; [`Server::run_until`] serves the HTTP API and runs every
//! background task (the audit sealer, the credential refresher, the reconciler, the key
//! reloader, the org policy's passes) until a shutdown future completes, then lets in-flight requests finish,
//! stops the tasks, flushes the sealer and closes the store.
//!
//! The `sandlane serve` binary is this plus argument parsing, logging and signals; the
//! end-to-end tests, the benches and a host that embeds the lane start it in-process.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapters::jwt::KeyStore;
use adapters::sql::{Store, spawn_sealer};
use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::background::{
    PolicyIntervals, every, flush_activity_once, reconcile_once, refresh_once, spawn_policy_passes,
};
use crate::compose::{Composition, Overrides, compose_with};
use crate::config::Settings;
use crate::http::{AppState, ListenerLimits};
use crate::usecase::egress::EgressService;

/// A composed server with its listener bound, not yet serving.
pub struct Server {
    settings: Settings,
    listener: TcpListener,
    address: SocketAddr,
    limits: ListenerLimits,
    store: Store,
    keys: Arc<KeyStore>,
    state: Arc<AppState>,
    egress: Arc<EgressService>,
}

impl Server {
    /// Prepares the data dir (absolute and private: see [`adapters::datadir`]), composes
    /// the adapters, binds `settings.listen` (port 0 picks a free port: see
    /// [`Server::local_addr`]) and logs `sandlane listening` with the driver's health:
    /// from then on connections queue, and [`Server::run_until`] serves them at once.
    ///
    /// # Errors
    /// When the data dir, the store, the keys or the driver cannot be set up, or the
    /// address cannot be bound; the message says which.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, Overrides::default()).await
    }

    /// [`Server::build`] with `overrides` in place of production adapters (tests: the
    /// egress proxy's resolver).
    ///
    /// # Errors
    /// As [`Server::build`].
    pub async fn build_with(mut settings: Settings, overrides: Overrides) -> anyhow::Result<Self> {
        adapters::datadir::restrict_umask();
        settings.data_dir = adapters::datadir::prepare(&settings.data_dir)?;
        let Composition { store, keys, state, egress } = compose_with(&settings, overrides).await?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let address = listener.local_addr()?;
        let open_files = open_file_limit();
        let limits = ListenerLimits {
            header_timeout: Duration::from_millis(settings.http.header_timeout_ms),
            idle_timeout: Duration::from_millis(settings.http.idle_timeout_ms),
            max_connections: settings.http.effective_max_connections(open_files),
        };
        if u64::from(limits.max_connections) * 2 > open_files {
            warn!(
                max_connections = limits.max_connections,
                open_files,
                "http.max_connections is over half the open-file limit: connections could take the descriptors the database and the sandboxes need"
            );
        }
        // Said once the server is ready to serve: `run_until` starts accepting at once.
        let deps = &state.deps;
        let health = deps.driver.health().await;
        info!(
            %address,
            max_connections = limits.max_connections,
            database = store.backend_name(),
            driver = deps.driver.name(),
            driver_usable = health.usable,
            driver_detail = %health.detail,
            lane_enabled = settings.lane_enabled,
            "sandlane listening"
        );
        Ok(Self { settings, listener, address, limits, store, keys, state, egress })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// What the HTTP listener holds clients to (the cap on connections resolved).
    pub fn listener_limits(&self) -> ListenerLimits {
        self.limits
    }

    /// What the handlers share (the lane's ports among it).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The settings, with the data dir made absolute.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Serves until `shutdown` completes, then stops gracefully: in-flight requests
    /// finish, the background tasks stop, the sealer seals what is left, the store closes.
    ///
    /// # Errors
    /// When the HTTP server fails.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Self { settings, listener, limits, store, keys, state, egress, .. } = self;
        let deps = state.deps.clone();

        let (stop_tx, stop_rx) = watch::channel(false);
        let mut sealer_stop = stop_rx.clone();
        let background = &settings.background;
        let sealer =
            spawn_sealer(store.audit(), Duration::from_millis(background.seal_interval_ms), async move {
                let _ = sealer_stop.changed().await;
            });
        let margin = Duration::from_secs(settings.token.refresh_margin_secs);
        let refresher = tokio::spawn({
            let deps = deps.clone();
            every(Duration::from_millis(background.refresh_interval_ms), stop_rx.clone(), move || {
                let deps = deps.clone();
                async move {
                    let r = refresh_once(&deps, margin).await;
                    if r.refreshed + r.failed + r.skipped_revoked + r.retired > 0 {
                        info!(
                            refreshed = r.refreshed,
                            failed = r.failed,
                            skipped_revoked = r.skipped_revoked,
                            retired = r.retired,
                            "credential refresh pass"
                        );
                    }
                }
            })
        });
        let reconciler = tokio::spawn({
            let deps = deps.clone();
            every(Duration::from_millis(background.reconcile_interval_ms), stop_rx.clone(), move || {
                let deps = deps.clone();
                async move {
                    let r = reconcile_once(&deps).await;
                    if r.expired_claims + r.orphans_removed + r.skipped_unreadable > 0 {
                        info!(
                            expired = r.expired_claims,
                            orphans = r.orphans_removed,
                            skipped_unreadable = r.skipped_unreadable,
                            "reconcile pass"
                        );
                    }
                }
            })
        });
        let key_reloader = tokio::spawn({
            let keys = keys.clone();
            every(Duration::from_secs(5), stop_rx.clone(), move || {
                let keys = keys.clone();
                async move {
                    if let Err(e) = keys.reload() {
                        error!(error = %e, "cannot reload the signing keys");
                    }
                }
            })
        });

        if settings.driver == crate::config::DriverKind::Kubernetes {
            warn!(
                "the kubernetes driver cannot suspend a sandbox: org idle timeouts are not applied (maximum lifetimes, quotas and warm pools are)"
            );
        }
        let policy_passes = spawn_policy_passes(
            deps.clone(),
            PolicyIntervals {
                policy: Duration::from_millis(background.policy_interval_ms),
                activity: Duration::from_millis(background.activity_interval_ms),
                idle_suspension: settings.driver != crate::config::DriverKind::Kubernetes,
            },
            &stop_rx,
        );
        let egress_server = tokio::spawn(crate::background::serve_egress(
            deps.clone(),
            egress,
            Duration::from_millis(settings.egress.scan_interval_ms),
            stop_rx.clone(),
        ));

        // Webhooks: every replica turns new audit events into deliveries and sends what is
        // due (leased: one replica per delivery at a time).
        let webhook_pass = state.webhooks.clone().map(|webhooks| {
            tokio::spawn(every(
                Duration::from_millis(settings.webhooks.interval_ms),
                stop_rx.clone(),
                move || {
                    let webhooks = webhooks.clone();
                    async move {
                        let r = crate::usecase::webhooks::webhook_pass(&webhooks).await;
                        if r.delivered + r.failed + r.running + r.deferred > 0 {
                            info!(
                                queued = r.queued,
                                delivered = r.delivered,
                                failed = r.failed,
                                running = r.running,
                                deferred = r.deferred,
                                "webhook pass"
                            );
                        }
                    }
                },
            ))
        });

        // ... and deletes the deliveries that ended past their retention.
        let webhook_prune = state.webhooks.clone().map(|webhooks| {
            tokio::spawn(every(crate::usecase::webhooks::PRUNE_INTERVAL, stop_rx.clone(), move || {
                let webhooks = webhooks.clone();
                async move {
                    let pruned = crate::usecase::webhooks::prune_pass(&webhooks).await;
                    if pruned > 0 {
                        info!(pruned, "webhook deliveries pruned past their retention");
                    }
                }
            }))
        });

        let served = crate::http::serve(listener, state, limits, shutdown).await;
        info!("shutting down: in-flight requests finished; flushing the audit sealer");
        let _ = stop_tx.send(true);
        for task in [refresher, reconciler, key_reloader, egress_server]
            .into_iter()
            .chain(policy_passes)
            .chain(webhook_pass)
            .chain(webhook_prune)
        {
            let _ = task.await;
        }
        // What this replica noted last is reported before it goes.
        flush_activity_once(&deps).await;
        // Sandboxes stay; what the driver runs for none of them goes.
        deps.driver.stand_down().await;
        let _ = sealer.await;
        store.close().await;
        served.context("the HTTP server failed")?;
        info!("sandlane stopped");
        Ok(())
    }
}

/// The process's soft limit on open files (`RLIMIT_NOFILE`), from `/proc/self/limits`;
/// 1024 (the usual default) when it cannot be read, `u64::MAX` when unlimited.
fn open_file_limit() -> u64 {
    const FALLBACK: u64 = 1024;
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else { return FALLBACK };
    parse_open_file_limit(&limits).unwrap_or(FALLBACK)
}

/// The soft limit of the `Max open files` line of a `/proc/<pid>/limits` text.
fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line["Max open files".len()..].split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_the_soft_one() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63476                63476                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_file_limit(limits), Some(1024));
        assert_eq!(
            parse_open_file_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(u64::MAX)
        );
        assert_eq!(parse_open_file_limit("Max processes 5 5 processes"), None);
        assert!(open_file_limit() > 0);
    }
}

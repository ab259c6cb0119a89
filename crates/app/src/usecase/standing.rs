//! Who an open connection acts for (an upgraded preview, a streamed answer, an attached
//! terminal), asked again while it lasts: a credential checked once at the start would
//! otherwise outlive its revocation for as long as the connection stays open.

use std::sync::Arc;

use domain::{IdentityId, PreviewHost};
use tracing::{info, warn};

use super::LaneDeps;
use super::preview::{PreviewError, link_for};

/// Who an open connection acts for: asked again every [`RECHECK`] while it lasts, so that a
/// revocation ends it too, not only the requests after it.
#[derive(Debug, Clone)]
pub enum Standing {
    /// A caller (a key, a ticket, a preview opened with a key): it stands while the caller
    /// is not revoked.
    Caller(IdentityId),
    /// A preview link's token: it stands while the link opens the host (not
    /// revoked, not expired, its creator not revoked).
    Link {
        /// The token.
        token: String,
        /// The host it opened.
        host: PreviewHost,
    },
}

/// How often an open connection's [`Standing`] is asked again.
pub const RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `standing` still holds. A store that cannot be read now counts as holding (the
/// next check asks again): a database's blip does not cut every open connection.
pub async fn stands(deps: &LaneDeps, standing: &Standing) -> bool {
    let asked = match standing {
        Standing::Caller(identity) => {
            deps.directory.is_revoked(identity).await.map(|revoked| !revoked).map_err(PreviewError::Directory)
        }
        Standing::Link { token, host } => match link_for(deps, token, host).await {
            Ok(_) => Ok(true),
            Err(PreviewError::Link(_)) => Ok(false),
            Err(e) => Err(e),
        },
    };
    asked.unwrap_or_else(|e| {
        warn!(error = %e, "an open connection's standing cannot be checked now; it goes on");
        true
    })
}

/// Returns once `standing` no longer holds (asked every [`RECHECK`]); never otherwise.
pub async fn lapsed(deps: Arc<LaneDeps>, standing: Standing) {
    loop {
        tokio::time::sleep(RECHECK).await;
        if !stands(&deps, &standing).await {
            info!("an open connection ends: the link or caller it was opened for no longer stands");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use domain::{CallerClass, PreviewLink, PreviewLinkId, SandboxCaller, SandboxId, Timestamp};
    use ports::MockPreviewLinkStore;

    use super::*;
    use crate::test_support::{Mocks, org};

    /// A caller revoked while its connection is open: the connection's `lapsed` returns at
    /// the next check, not before; a store that cannot be read keeps it open.
    #[tokio::test(start_paused = true)]
    async fn a_callers_connection_lapses_at_the_check_after_its_revocation() {
        let mut m = Mocks::new(true);
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        m.directory.expect_is_revoked().returning(move |_| match count.fetch_add(1, Ordering::SeqCst) {
            0 => Ok(false),
            1 => Err(ports::DirectoryError::Store(ports::Cause::msg("down"))),
            _ => Ok(true),
        });
        let deps = Arc::new(m.deps());
        let started = tokio::time::Instant::now();
        lapsed(deps, Standing::Caller(IdentityId::parse("ada").unwrap())).await;
        assert_eq!(asked.load(Ordering::SeqCst), 3, "asked until it said revoked");
        assert_eq!(started.elapsed(), RECHECK * 3);
    }

    /// A link revoked while a visitor's connection is open: the connection lapses.
    #[tokio::test(start_paused = true)]
    async fn a_links_connection_lapses_once_the_link_is_revoked() {
        let sandbox = SandboxId::generate(1, 7);
        let link = move |revoked: bool| PreviewLink {
            id: PreviewLinkId::generate(1, 1),
            org: org(),
            sandbox: sandbox.clone(),
            port: 3000,
            created_by: SandboxCaller::from_record(IdentityId::parse("creator").unwrap(), CallerClass::User),
            created_at: Timestamp::from_unix_millis(0),
            expires_at: Timestamp::from_unix_millis(i64::MAX),
            revoked_at: revoked.then(|| Timestamp::from_unix_millis(1)),
            token_sha256: domain::preview::token_digest("token"),
        };
        let mut m = Mocks::new(true);
        m.directory.expect_is_revoked().returning(|_| Ok(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let count = reads.clone();
        let mut store = MockPreviewLinkStore::new();
        store.expect_by_token().returning(move |_| Ok(Some(link(count.fetch_add(1, Ordering::SeqCst) >= 1))));
        let mut deps = m.deps();
        deps.preview_links = Arc::new(store);
        let host = PreviewHost { port: 3000, sandbox: SandboxId::generate(1, 7) };
        assert!(stands(&deps, &Standing::Link { token: "token".into(), host: host.clone() }).await);
        let started = tokio::time::Instant::now();
        lapsed(Arc::new(deps), Standing::Link { token: "token".into(), host }).await;
        assert_eq!(started.elapsed(), RECHECK, "at the first check after the revocation");
    }
}

//! Why an ensure failed, typed: the step that failed with the port's error as its source.
//! The posture's prefixed message ([`domain::SANDBOX_PROVISIONING_FAILED_PREFIX`] and the
//! whole chain) is rendered by [`ProvisionFailure::message`] for the audit log, the server
//! log and the edges (the HTTP API, the chain steps).

use std::error::Error;

use domain::posture::provisioning_failed_message;
use domain::{SandboxId, SandboxKey};
use ports::{AuditError, DriverError, MintError, RegistryError};

use super::DeprovisionError;

/// The step of an ensure that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    /// No random bits for a sandbox id.
    #[error("no entropy for a sandbox id")]
    Entropy(#[source] getrandom::Error),
    /// The key could not be claimed.
    #[error("could not claim {key}")]
    Claim {
        /// The key.
        key: SandboxKey,
        /// The registry's error.
        #[source]
        source: RegistryError,
    },
    /// The org's quota of running sandboxes is used up (nothing was provisioned).
    #[error("{key} would take org {org} past its quota of running sandboxes", org = key.org())]
    Quota {
        /// The key.
        key: SandboxKey,
        /// The registry's refusal.
        #[source]
        source: RegistryError,
    },
    /// The org's policy could not be read.
    #[error("cannot apply the org's policy")]
    Policy(#[source] super::policy::PolicyReadError),
    /// A suspended sandbox could not be resumed.
    #[error("could not resume the suspended sandbox")]
    Resume(#[source] RegistryError),
    /// A warm sandbox could not be bound to the key.
    #[error("could not bind the warm sandbox")]
    Adopt(#[source] DriverError),
    /// Other holders kept winning the claim.
    #[error("{key} is contended: gave up after {rounds} claims")]
    Contended {
        /// The key.
        key: SandboxKey,
        /// How many claims were tried.
        rounds: usize,
    },
    /// The record another holder provisions could not be read while waiting.
    #[error("could not read the claim another holder provisions")]
    Wait(#[source] RegistryError),
    /// No credential could be minted.
    #[error("could not mint a credential")]
    Mint(#[source] MintError),
    /// The driver could not provision the sandbox.
    #[error("the driver could not provision the sandbox")]
    Driver(#[source] DriverError),
    /// The audit event could not be written (the sandbox is rolled back).
    #[error("the audit event could not be written")]
    Audit(#[source] AuditError),
    /// The fresh credential could not be delivered into a reused sandbox.
    #[error("could not deliver the credential")]
    Deliver(#[source] DriverError),
    /// The fresh credential could not be recorded.
    #[error("could not record the credential")]
    Record(#[source] RegistryError),
    /// The provisioned sandbox could not be marked ready.
    #[error("could not mark the sandbox ready")]
    MarkReady(#[source] RegistryError),
    /// A sandbox gone from the driver could not be retired.
    #[error("could not retire the sandbox gone from the driver")]
    Retire(#[source] RegistryError),
    /// The previous sandbox of a recovered execution could not be retired.
    #[error("could not retire the previous sandbox")]
    RetirePrevious(#[source] DeprovisionError),
    /// The caller's deadline passed; the work goes on and audits its outcome.
    #[error("not ready after {0} ms; provisioning goes on and its outcome is audited")]
    Deadline(u128),
    /// The provisioning task failed unexpectedly (logged).
    #[error("the provisioning task failed; see the server log")]
    Task,
}

/// A failed ensure: the step that failed, and the sandbox it concerned (when one was
/// claimed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox provisioning failed")]
pub struct ProvisionFailure {
    /// The sandbox claimed for it, if any.
    pub sandbox_id: Option<SandboxId>,
    /// What failed.
    #[source]
    pub error: ProvisionError,
}

impl ProvisionFailure {
    /// A failure with no sandbox claimed.
    pub fn new(error: ProvisionError) -> Self {
        Self { sandbox_id: None, error }
    }

    /// The posture's message: the prefix, then the failed step and every cause below it.
    pub fn message(&self) -> String {
        provisioning_failed_message(&chain(&self.error))
    }
}

/// An error and its sources, joined by `": "`. A source whose text the chain already holds
/// (a port error that shows its cause, like `registry store: …`, or an adapter's error
/// that names its own cause mid-sentence) is not repeated.
pub fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use domain::{OrgId, SANDBOX_PROVISIONING_FAILED_PREFIX, SessionId};

    use super::*;

    #[test]
    fn the_message_is_the_prefix_then_the_step_then_every_cause() {
        let key = SandboxKey::Session {
            org: OrgId::parse("acme").unwrap(),
            session_id: SessionId::parse("s1").unwrap(),
        };
        let failure = ProvisionFailure::new(ProvisionError::Claim {
            key,
            source: RegistryError::Store("connection refused".into()),
        });
        assert_eq!(
            failure.message(),
            format!(
                "{SANDBOX_PROVISIONING_FAILED_PREFIX}could not claim acme/session/s1: registry store: \
                 connection refused"
            )
        );
        // The chain is walked through #[source], down to the store's own error.
        let source = std::error::Error::source(&failure).unwrap();
        assert_eq!(source.to_string(), "could not claim acme/session/s1");
        let port = source.source().unwrap();
        assert_eq!(port.to_string(), "registry store: connection refused");
        assert_eq!(port.source().unwrap().to_string(), "connection refused");
    }

    #[test]
    fn a_source_the_text_already_names_mid_sentence_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot reach the engine: {0} (start it)")]
        struct Unreachable(#[source] std::io::Error);
        let failure = ProvisionFailure::new(ProvisionError::Driver(DriverError::Unavailable(
            ports::Cause::new(Unreachable(std::io::Error::other("refused"))),
        )));
        assert_eq!(
            failure.message(),
            format!(
                "{SANDBOX_PROVISIONING_FAILED_PREFIX}the driver could not provision the sandbox: driver \
                 unavailable: cannot reach the engine: refused (start it)"
            )
        );
    }
}

//! sandlane's ports: the traits the use cases are written against.
//!
//! Each port is an `async_trait` used as `Arc<dyn Port>`; each has a mockall mock
//! (`MockX`) behind the `mocks` feature. Ports speak only in domain types; adapters
//! translate their infrastructure errors into the errors declared here.

pub mod audit;
pub mod cause;
pub mod clock;
pub mod directory;
pub mod driver;
pub mod egress;
pub mod lane;
pub mod minter;
pub mod policy;
pub mod preview;
pub mod registry;
pub mod secrets;
pub mod snapshots;
pub mod tickets;
pub mod webhooks;

pub use audit::{
    AuditEntry, AuditError, AuditLog, AuditPage, BadRecord, SealReport, SealStatus, VerifyReport,
};
pub use cause::Cause;
pub use clock::{Clock, SystemClock};
pub use directory::{CallerDirectory, CallerEntry, DirectoryError};
pub use driver::{
    ByteSource, ByteStream, DriverError, DriverHealth, EntryStream, OutputStream, PortStream, ProcessInput,
    ProvisionSpec, ReadOutcome, SandboxDriver, SnapshotBudget, SnapshotRef, SourceError, Unpacked,
};
pub use egress::{
    BrokerAudit, BrokerUse, Brokered, EgressBudget, EgressGate, EgressGrant, EgressKind, EgressRefusal,
    EgressRequest, ResolveError, Resolver,
};
pub use lane::{SandboxLane, StaticLane};
pub use minter::{
    CredentialMinter, CredentialVerifier, MintError, MintedCredential, TokenClaims, VerifyError,
};
pub use policy::{PolicyOverrides, PolicyStore, PolicyStoreError, QuotaLeases};
pub use preview::{PreviewLinkStore, PreviewLinkStoreError};
pub use registry::{
    Claim, ClaimOutcome, ClaimRequest, KeyOwner, LiveId, OrgListing, RegistryError, ResumeRequest,
    SandboxRegistry, StateCount, TokenGrant, WarmMatch, WarmSandbox, WarmSlotRequest,
};
pub use secrets::{PutOutcome, SecretEntry, SecretGuard, SecretLimits, SecretStore, SecretStoreError};
pub use snapshots::{SnapshotLimits, SnapshotStore, SnapshotStoreError, SnapshotUsage};
pub use tickets::{TerminalTickets, TicketGrant, TicketStoreError};
pub use webhooks::{
    AttemptResult, DeliveryRecord, DeliveryStatus, DueDelivery, NewDelivery, SendError, WebhookEntry,
    WebhookSender, WebhookStore, WebhookStoreError,
};

#[cfg(any(test, feature = "mocks"))]
pub use audit::MockAuditLog;
#[cfg(any(test, feature = "mocks"))]
pub use clock::MockClock;
#[cfg(any(test, feature = "mocks"))]
pub use directory::MockCallerDirectory;
#[cfg(any(test, feature = "mocks"))]
pub use driver::MockSandboxDriver;
#[cfg(any(test, feature = "mocks"))]
pub use egress::{MockBrokerAudit, MockEgressGate, MockResolver};
#[cfg(any(test, feature = "mocks"))]
pub use lane::MockSandboxLane;
#[cfg(any(test, feature = "mocks"))]
pub use minter::{MockCredentialMinter, MockCredentialVerifier};
#[cfg(any(test, feature = "mocks"))]
pub use policy::{MockPolicyStore, MockQuotaLeases};
#[cfg(any(test, feature = "mocks"))]
pub use preview::MockPreviewLinkStore;
#[cfg(any(test, feature = "mocks"))]
pub use registry::MockSandboxRegistry;
#[cfg(any(test, feature = "mocks"))]
pub use secrets::MockSecretStore;
#[cfg(any(test, feature = "mocks"))]
pub use snapshots::MockSnapshotStore;
#[cfg(any(test, feature = "mocks"))]
pub use tickets::MockTerminalTickets;
#[cfg(any(test, feature = "mocks"))]
pub use webhooks::{MockWebhookSender, MockWebhookStore};

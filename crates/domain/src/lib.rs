//! sandlane's pure core: the lane's vocabulary (`ARCHITECTURE.md`, `docs/`) as types, and the
//! rules over them.
//!
//! Nothing here does I/O, awaits, or reads the environment: every fact (the time, random
//! bits) comes in as an argument, so every rule is a plain function that property tests
//! can drive.

pub mod access;
pub mod audit;
pub mod broker;
pub mod caller;
pub mod durability;
pub mod egress;
pub mod exec;
pub mod execution;
pub mod files;
pub mod id;
pub mod key;
pub mod lifecycle;
pub mod policy;
pub mod posture;
pub mod preview;
pub mod process;
pub mod sandbox;
pub mod secret;
pub mod snapshot;
pub mod split;
pub mod terminal;
pub mod time;

pub use access::{Actor, Denial, Operation, Target, authorize, authorize_org_read};
pub use audit::{AuditAction, AuditEvent, AuditOutcome};
pub use caller::{CallerClass, CallerIdentity, SandboxCaller};
pub use durability::{Durability, DurabilityPolicy};
pub use exec::{ExecOutput, ExecRequest, ExitStatus, OutputEvent};
pub use execution::{AgentExecution, Phase, WorkflowExecution};
pub use files::{DirEntry, EntryKind, PathError, Root, SandboxPath};
pub use id::{
    ExecutionId, IdError, IdentityId, OrgId, PreviewLinkId, SandboxId, SessionId, SnapshotId, TerminalId,
    TokenId,
};
pub use key::{SandboxKey, SandboxKind};
pub use lifecycle::{LifecycleError, SandboxEffect};
pub use policy::{EgressRule, OrgPolicy, PolicyError, PolicyField, PolicyPatch, StoredPolicy};
pub use posture::{Posture, SANDBOX_PROVISIONING_FAILED_PREFIX};
pub use preview::{LinkRefusal, PreviewHost, PreviewLink};
pub use process::{ProcessCaps, ProcessInfo, ProcessRequest, Signal};
pub use sandbox::{SandboxRecord, SandboxState};
pub use secret::{CallerKey, SandboxToken, SecretValue};
pub use snapshot::{Snapshot, SnapshotName, SnapshotQuotaError};
pub use split::{DriverEnvironment, MintRequest, split_caller};
pub use terminal::{TerminalError, TerminalInfo, TerminalInput, TerminalRequest, TerminalSize};
pub use time::Timestamp;

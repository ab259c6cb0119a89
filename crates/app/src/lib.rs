//! sandlane's application layer: the lane's use cases over the ports, the chain steps a
//! host server composes into its create chain, and (in the binary) the HTTP API and the
//! composition root.

pub mod background;
pub mod chain;
pub mod compose;
pub mod config;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod server;
pub mod usecase;

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod test_support;

pub use chain::{CreateContext, CreateStep, EnsureSessionSandboxStep, EnsureWorkflowSandboxStep, StepError};
pub use usecase::{
    DeprovisionError, DeprovisionOutcome, EnsureError, LaneDeps, SandboxView, SessionEnsureOutcome,
    WorkflowEnsureOutcome,
};

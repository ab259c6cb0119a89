//! Lifecycle rules: what an execution's phase move does to its sandbox.
//!
//! A move to FAILED deprovisions. Recovering a FAILED workflow execution (FAILED →
//! PENDING) provisions a fresh sandbox before its fresh workflow starts. Every other
//! allowed move leaves the sandbox alone; impossible moves are rejected.

use crate::execution::Phase;
use crate::key::SandboxKind;

/// What a phase move does to the execution's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxEffect {
    /// Nothing.
    None,
    /// Deprovision it (the execution reached the terminal FAILED phase).
    Deprovision,
    /// Provision a fresh one (a failed workflow execution is being recovered).
    Reprovision,
}

/// A phase move that cannot happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// The move is not allowed from this phase.
    #[error("a {kind} execution cannot move from {from} to {to}")]
    Impossible {
        /// The execution kind.
        kind: SandboxKind,
        /// The phase it is in.
        from: Phase,
        /// The phase asked for.
        to: Phase,
    },
}

/// The sandbox effect of moving a `kind` execution from `from` to `to`.
///
/// Allowed: staying put (no effect); PENDING → IN_PROGRESS; PENDING or IN_PROGRESS →
/// COMPLETED or CANCELLED (no effect) or FAILED (deprovision); FAILED → PENDING for a
/// workflow execution (recovery: re-provision).
///
/// # Errors
/// [`LifecycleError::Impossible`] for anything else: out of COMPLETED or CANCELLED,
/// backwards, or recovering an agent execution.
pub fn transition(kind: SandboxKind, from: Phase, to: Phase) -> Result<SandboxEffect, LifecycleError> {
    use Phase::{Cancelled, Completed, Failed, InProgress, Pending};
    match (from, to) {
        (a, b) if a == b => Ok(SandboxEffect::None),
        (Pending, InProgress) | (Pending | InProgress, Completed | Cancelled) => Ok(SandboxEffect::None),
        (Pending | InProgress, Failed) => Ok(SandboxEffect::Deprovision),
        (Failed, Pending) if kind == SandboxKind::Workflow => Ok(SandboxEffect::Reprovision),
        _ => Err(LifecycleError::Impossible { kind, from, to }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn phase() -> impl Strategy<Value = Phase> {
        prop::sample::select(Phase::ALL.to_vec())
    }

    #[test]
    fn the_rules() {
        use Phase::*;
        let w = SandboxKind::Workflow;
        let s = SandboxKind::Session;
        assert_eq!(transition(s, InProgress, Failed), Ok(SandboxEffect::Deprovision));
        assert_eq!(transition(w, Failed, Pending), Ok(SandboxEffect::Reprovision));
        assert_eq!(transition(w, Pending, InProgress), Ok(SandboxEffect::None));
        assert_eq!(transition(w, InProgress, Completed), Ok(SandboxEffect::None));
        let err = transition(w, Completed, InProgress).unwrap_err();
        assert_eq!(err.to_string(), "a workflow execution cannot move from completed to in_progress");
        assert!(transition(s, Failed, Pending).is_err(), "agent executions are not recovered");
        assert!(transition(w, Cancelled, Pending).is_err());
        assert!(transition(w, InProgress, Pending).is_err());
    }

    proptest! {
        /// Drive an execution through any sequence of moves, applying each accepted
        /// move's effect to a model sandbox: a failed execution never has a live one.
        #[test]
        fn no_sequence_leaves_a_failed_execution_with_a_live_sandbox(
            workflow: bool, moves in prop::collection::vec(phase(), 0..40)
        ) {
            let kind = if workflow { SandboxKind::Workflow } else { SandboxKind::Session };
            let mut phase = Phase::Pending;
            let mut live = true; // ensured at creation
            for to in moves {
                match transition(kind, phase, to) {
                    Ok(effect) => {
                        match effect {
                            SandboxEffect::None => {}
                            SandboxEffect::Deprovision => live = false,
                            SandboxEffect::Reprovision => live = true,
                        }
                        phase = to;
                    }
                    Err(LifecycleError::Impossible { from, to: t, .. }) => {
                        prop_assert_eq!(from, phase);
                        prop_assert_eq!(t, to);
                    }
                }
                prop_assert!(!(phase == Phase::Failed && live));
            }
        }

        #[test]
        fn terminal_success_is_final(kind_w: bool, to in phase()) {
            let kind = if kind_w { SandboxKind::Workflow } else { SandboxKind::Session };
            for from in [Phase::Completed, Phase::Cancelled] {
                prop_assert_eq!(transition(kind, from, to).is_ok(), from == to);
            }
        }
    }
}

//! Durability of a workspace, decided from the caller class by a policy.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::caller::CallerClass;

/// Whether a workspace outlives its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Survives deprovision and comes back for the same key.
    Durable,
    /// Wiped at deprovision.
    Ephemeral,
}

impl Durability {
    /// `durable` or `ephemeral`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Durable => "durable",
            Self::Ephemeral => "ephemeral",
        }
    }

    /// Parses `durable` or `ephemeral`.
    ///
    /// # Errors
    /// [`UnknownDurability`] naming the input.
    pub fn parse(input: &str) -> Result<Self, UnknownDurability> {
        match input {
            "durable" => Ok(Self::Durable),
            "ephemeral" => Ok(Self::Ephemeral),
            other => Err(UnknownDurability(other.to_owned())),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a durability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability {0:?}; expected \"durable\" or \"ephemeral\"")]
pub struct UnknownDurability(pub String);

/// Caller class → durability. Total: every class has an answer, by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurabilityPolicy {
    /// For `user` callers.
    pub user: Durability,
    /// For `service` callers.
    pub service: Durability,
    /// For the server's own `internal` calls.
    pub internal: Durability,
}

impl Default for DurabilityPolicy {
    /// user → durable; service and internal → ephemeral.
    fn default() -> Self {
        Self { user: Durability::Durable, service: Durability::Ephemeral, internal: Durability::Ephemeral }
    }
}

impl DurabilityPolicy {
    /// The durability for a caller of `class`.
    pub const fn decide(&self, class: CallerClass) -> Durability {
        match class {
            CallerClass::User => self.user,
            CallerClass::Service => self.service,
            CallerClass::Internal => self.internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy() {
        let p = DurabilityPolicy::default();
        assert_eq!(p.decide(CallerClass::User), Durability::Durable);
        assert_eq!(p.decide(CallerClass::Service), Durability::Ephemeral);
        assert_eq!(p.decide(CallerClass::Internal), Durability::Ephemeral);
    }

    /// A policy as (users, services, internal callers), and what it answers each class.
    type Row = ((Durability, Durability, Durability), [(CallerClass, Durability); 3]);

    /// The oracle, written out: every policy and what it answers each class.
    #[rustfmt::skip]
    const ANSWERS: [Row; 8] = {
        use CallerClass::{Internal as I, Service as S, User as U};
        use Durability::{Durable as D, Ephemeral as E};
        [
            ((D, D, D), [(U, D), (S, D), (I, D)]),
            ((D, D, E), [(U, D), (S, D), (I, E)]),
            ((D, E, D), [(U, D), (S, E), (I, D)]),
            ((D, E, E), [(U, D), (S, E), (I, E)]),
            ((E, D, D), [(U, E), (S, D), (I, D)]),
            ((E, D, E), [(U, E), (S, D), (I, E)]),
            ((E, E, D), [(U, E), (S, E), (I, D)]),
            ((E, E, E), [(U, E), (S, E), (I, E)]),
        ]
    };

    #[test]
    fn every_policy_answers_every_class_as_configured() {
        for ((user, service, internal), answers) in ANSWERS {
            let p = DurabilityPolicy { user, service, internal };
            for (class, want) in answers {
                assert_eq!(p.decide(class), want, "{p:?} asked by {class:?}");
            }
        }
    }
}

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
    use proptest::prelude::*;

    use super::*;

    fn durability() -> impl Strategy<Value = Durability> {
        prop_oneof![Just(Durability::Durable), Just(Durability::Ephemeral)]
    }

    #[test]
    fn default_policy() {
        let p = DurabilityPolicy::default();
        assert_eq!(p.decide(CallerClass::User), Durability::Durable);
        assert_eq!(p.decide(CallerClass::Service), Durability::Ephemeral);
        assert_eq!(p.decide(CallerClass::Internal), Durability::Ephemeral);
    }

    proptest! {
        #[test]
        fn every_policy_answers_every_class_as_configured(
            user in durability(), service in durability(), internal in durability()
        ) {
            let p = DurabilityPolicy { user, service, internal };
            for class in CallerClass::ALL {
                let expected = match class {
                    CallerClass::User => user,
                    CallerClass::Service => service,
                    CallerClass::Internal => internal,
                };
                prop_assert_eq!(p.decide(class), expected);
            }
        }
    }
}

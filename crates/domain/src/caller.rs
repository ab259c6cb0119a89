//! Who asked: the caller identity a request chain carries, and the sandbox caller cut
//! from it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{IdentityId, OrgId};

/// The class of a caller. `Internal` exists only for the server's own calls: it is made
/// by [`CallerIdentity::internal`] and by nothing a wire request can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallerClass {
    /// A person.
    User,
    /// A service account of a platform team.
    Service,
    /// The server itself (sweeps, recovery, refresh).
    Internal,
}

impl CallerClass {
    /// Every class, for exhaustive checks.
    pub const ALL: [CallerClass; 3] = [Self::User, Self::Service, Self::Internal];

    /// The lowercase wire name: `user`, `service` or `internal`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Service => "service",
            Self::Internal => "internal",
        }
    }

    /// Parses a class a wire caller may hold: `user` or `service`.
    ///
    /// # Errors
    /// [`CallerError::InternalFromWire`] for `internal`, [`CallerError::UnknownClass`]
    /// for anything else.
    pub fn parse_wire(input: &str) -> Result<Self, CallerError> {
        match input {
            "user" => Ok(Self::User),
            "service" => Ok(Self::Service),
            "internal" => Err(CallerError::InternalFromWire),
            other => Err(CallerError::UnknownClass(other.to_owned())),
        }
    }

    /// Parses any stored class name, `internal` included (for records the server wrote).
    ///
    /// # Errors
    /// [`CallerError::UnknownClass`] naming the input.
    pub fn parse_stored(input: &str) -> Result<Self, CallerError> {
        match input {
            "internal" => Ok(Self::Internal),
            other => Self::parse_wire(other),
        }
    }
}

impl fmt::Display for CallerClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a caller identity could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerError {
    /// A wire caller asked to be `internal`.
    #[error("caller class \"internal\" is reserved for the server's own calls")]
    InternalFromWire,
    /// Not a class name.
    #[error("unknown caller class {0:?}; expected \"user\" or \"service\"")]
    UnknownClass(String),
    /// A wire caller asked for an identity id reserved for the server's own identities.
    #[error("identity id {0} is reserved: ids starting \"sandlane:\" belong to the server's own identities")]
    ReservedId(IdentityId),
    /// A display name that is empty, too long or holds control characters.
    #[error("display name {0:?} must be 1-200 printable characters")]
    BadDisplayName(String),
}

/// Who made a request, as the request chain knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerIdentity {
    identity_id: IdentityId,
    class: CallerClass,
    orgs: Vec<OrgId>,
    display_name: Option<String>,
}

/// The identity id of the server's own in-process caller.
pub const INTERNAL_IDENTITY: &str = "sandlane:internal";

impl CallerIdentity {
    /// A caller authenticated from the wire: `user` or `service`, never `internal`.
    ///
    /// # Errors
    /// [`CallerError::InternalFromWire`] when `class` is `Internal`;
    /// [`CallerError::ReservedId`] for an id starting `sandlane:`;
    /// [`CallerError::BadDisplayName`] for an unprintable or over-long name.
    pub fn from_wire(
        identity_id: IdentityId,
        class: CallerClass,
        orgs: Vec<OrgId>,
        display_name: Option<String>,
    ) -> Result<Self, CallerError> {
        if class == CallerClass::Internal {
            return Err(CallerError::InternalFromWire);
        }
        if identity_id.is_reserved() {
            return Err(CallerError::ReservedId(identity_id));
        }
        if let Some(name) = &display_name {
            let n = name.chars().count();
            if n == 0 || n > 200 || name.chars().any(char::is_control) {
                return Err(CallerError::BadDisplayName(name.clone()));
            }
        }
        let mut orgs = orgs;
        orgs.sort();
        orgs.dedup();
        Ok(Self { identity_id, class, orgs, display_name })
    }

    /// The in-process transport's caller for the server's own calls (sweeps, recovery,
    /// token refresh). The only way to make an `internal` caller. It acts in every org.
    pub fn internal() -> Self {
        Self {
            identity_id: IdentityId::parse(INTERNAL_IDENTITY)
                .unwrap_or_else(|_| unreachable!("the internal identity id is a valid id")),
            class: CallerClass::Internal,
            orgs: Vec::new(),
            display_name: Some("sandlane".to_owned()),
        }
    }

    /// The caller's identity id.
    pub fn identity_id(&self) -> &IdentityId {
        &self.identity_id
    }

    /// The caller's class.
    pub fn class(&self) -> CallerClass {
        self.class
    }

    /// The orgs the caller may act in (empty for `internal`, which acts in all).
    pub fn orgs(&self) -> &[OrgId] {
        &self.orgs
    }

    /// The display name, if the chain carries one.
    pub fn display_name(&self) -> Option<&str> {
        self.display_name.as_deref()
    }

    /// Whether the caller may act in `org`.
    pub fn may_act_in(&self, org: &OrgId) -> bool {
        self.class == CallerClass::Internal || self.orgs.binary_search(org).is_ok()
    }

    /// The two facts a sandbox ensure reads.
    pub fn sandbox_caller(&self) -> SandboxCaller {
        SandboxCaller { identity_id: self.identity_id.clone(), class: self.class }
    }
}

/// The two facts about the requesting caller a sandbox ensure carries, cut from the
/// chain's [`CallerIdentity`]: the id rides into the credential mint, the class rides onto
/// the driver's environment (see [`crate::split::split_caller`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCaller {
    identity_id: IdentityId,
    class: CallerClass,
}

impl SandboxCaller {
    /// The caller's identity id.
    pub fn identity_id(&self) -> &IdentityId {
        &self.identity_id
    }

    /// The caller's class.
    pub fn class(&self) -> CallerClass {
        self.class
    }

    /// Rebuilds the caller recorded on a sandbox (for the server's refresher, which mints
    /// again FOR the caller who asked). Only records written by the lane reach here.
    pub fn from_record(identity_id: IdentityId, class: CallerClass) -> Self {
        Self { identity_id, class }
    }
}

impl From<&CallerIdentity> for SandboxCaller {
    fn from(identity: &CallerIdentity) -> Self {
        identity.sandbox_caller()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_callers_are_never_internal() {
        let id = IdentityId::parse("u-1").unwrap();
        assert_eq!(
            CallerIdentity::from_wire(id, CallerClass::Internal, vec![], None),
            Err(CallerError::InternalFromWire)
        );
        assert_eq!(CallerClass::parse_wire("internal"), Err(CallerError::InternalFromWire));
        assert!(
            matches!(CallerClass::parse_wire("admin"), Err(CallerError::UnknownClass(s)) if s == "admin")
        );
    }

    #[test]
    fn wire_callers_never_take_a_reserved_id() {
        for reserved in ["sandlane:internal", "sandlane:", "sandlane:svc-x"] {
            let id = IdentityId::parse(reserved).unwrap();
            assert!(id.is_reserved());
            for class in [CallerClass::User, CallerClass::Service] {
                assert_eq!(
                    CallerIdentity::from_wire(id.clone(), class, vec![], None),
                    Err(CallerError::ReservedId(id.clone()))
                );
            }
        }
        // Only the exact prefix is reserved.
        for free in ["sandlane", "Sandlane:x", "xsandlane:y", "sandlane-x"] {
            let id = IdentityId::parse(free).unwrap();
            assert!(!id.is_reserved(), "{free}");
            assert!(CallerIdentity::from_wire(id, CallerClass::User, vec![], None).is_ok(), "{free}");
        }
        assert!(CallerIdentity::internal().identity_id().is_reserved());
    }

    #[test]
    fn internal_acts_everywhere_and_wire_only_in_its_orgs() {
        let acme = OrgId::parse("acme").unwrap();
        let other = OrgId::parse("other").unwrap();
        assert!(CallerIdentity::internal().may_act_in(&acme));
        let u = CallerIdentity::from_wire(
            IdentityId::parse("u-1").unwrap(),
            CallerClass::User,
            vec![acme.clone()],
            Some("Ada".into()),
        )
        .unwrap();
        assert!(u.may_act_in(&acme));
        assert!(!u.may_act_in(&other));
        let cut = u.sandbox_caller();
        assert_eq!(cut.identity_id().as_str(), "u-1");
        assert_eq!(cut.class(), CallerClass::User);
    }
}

//! Validated identifiers: one rule set for every id the lane handles.
//!
//! An id is 1–128 characters of `A-Z a-z 0-9 . _ : @ -`. Ids are built only through
//! [`parse`](IdentityId::parse) (serde goes through it too), so a value of an id type is
//! always valid. Sandbox ids are generated: `sbx_` and 26 characters of Crockford base32
//! holding 48 bits of milliseconds then 80 random bits, so they sort by creation time.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest id accepted, in characters.
pub const MAX_ID_LEN: usize = 128;

/// Why a string was refused as an id. Each variant names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The input was empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which id was being parsed.
        kind: &'static str,
    },
    /// The input was longer than [`MAX_ID_LEN`].
    #[error("{kind} {input:?} is {len} characters long; at most {MAX_ID_LEN} are allowed")]
    TooLong {
        /// Which id was being parsed.
        kind: &'static str,
        /// The first characters of the rejected input.
        input: String,
        /// Its length.
        len: usize,
    },
    /// The input held a character outside the allowed set.
    #[error("{kind} {input:?} contains {bad:?}; only A-Z a-z 0-9 . _ : @ - are allowed")]
    BadChar {
        /// Which id was being parsed.
        kind: &'static str,
        /// The rejected input.
        input: String,
        /// The first offending character.
        bad: char,
    },
    /// A sandbox id did not have the generated shape.
    #[error("sandbox id {input:?} is not of the form sbx_ followed by 26 base32 characters")]
    NotASandboxId {
        /// The rejected input.
        input: String,
    },
    /// A snapshot id did not have the generated shape.
    #[error("snapshot id {input:?} is not of the form snp_ followed by 26 base32 characters")]
    NotASnapshotId {
        /// The rejected input.
        input: String,
    },
    /// A terminal id did not have the generated shape.
    #[error("terminal id {input:?} is not of the form term_ followed by 26 base32 characters")]
    NotATerminalId {
        /// The rejected input.
        input: String,
    },
    /// A preview link id did not have the generated shape.
    #[error("preview link id {input:?} is not of the form pvl_ followed by 26 base32 characters")]
    NotAPreviewLinkId {
        /// The rejected input.
        input: String,
    },
}

/// The characters an id may hold besides ASCII letters and digits.
pub const ID_PUNCTUATION: [char; 5] = ['.', '_', ':', '@', '-'];

/// Whether `c` may appear in an id.
pub fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || ID_PUNCTUATION.contains(&c)
}

/// The id rule as a regular expression that every common dialect reads the same way
/// (ECMA-262 with or without the `u` flag, Python, Rust's `regex`), for schemas that
/// describe the API: `^[A-Za-z0-9._:@-]{1,128}$`. Built from [`ID_PUNCTUATION`] and
/// [`MAX_ID_LEN`], so it cannot drift from [`is_id_char`]; a test holds the two together.
pub fn id_pattern() -> String {
    // Inside a class only `-` needs care: it goes last, where it is a literal.
    let (dash, others): (Vec<char>, Vec<char>) = ID_PUNCTUATION.iter().partition(|c| **c == '-');
    let punctuation: String = others.into_iter().chain(dash).collect();
    format!("^[A-Za-z0-9{punctuation}]{{1,{MAX_ID_LEN}}}$")
}

fn check(kind: &'static str, input: &str) -> Result<(), IdError> {
    if input.is_empty() {
        return Err(IdError::Empty { kind });
    }
    let len = input.chars().count();
    if len > MAX_ID_LEN {
        return Err(IdError::TooLong {
            kind, input: input.chars().take(32).collect::<String>() + "…", len
        });
    }
    if let Some(bad) = input.chars().find(|c| !is_id_char(*c)) {
        return Err(IdError::BadChar { kind, input: input.to_owned(), bad });
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Parses `input`, accepting it exactly when it follows the id rules.
            ///
            /// # Errors
            /// [`IdError`] naming the input when it is empty, too long or holds a
            /// character outside the allowed set.
            pub fn parse(input: impl Into<String>) -> Result<Self, IdError> {
                let input = input.into();
                Self::validate(&input)?;
                Ok(Self(input))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// Who made a request: the id of a caller identity.
    IdentityId,
    "identity id"
);
id_type!(
    /// An organisation; sandbox keys are unique within one.
    OrgId,
    "org"
);
id_type!(
    /// An agent session: all agent executions of one session share a sandbox.
    SessionId,
    "session id"
);
id_type!(
    /// An agent execution or a workflow execution.
    ExecutionId,
    "execution id"
);
id_type!(
    /// A sandbox, generated by [`SandboxId::generate`].
    SandboxId,
    "sandbox id"
);
id_type!(
    /// A snapshot of a sandbox's workspace, generated by [`SnapshotId::generate`].
    SnapshotId,
    "snapshot id"
);
id_type!(
    /// A terminal in a sandbox, generated by [`TerminalId::generate`].
    TerminalId,
    "terminal id"
);
id_type!(
    /// A preview link of a sandbox's port, generated by [`PreviewLinkId::generate`].
    PreviewLinkId,
    "preview link id"
);
id_type!(
    /// The `jti` of one minted credential.
    TokenId,
    "token id"
);

macro_rules! plain_validate {
    ($($name:ident => $kind:literal),*) => {$(
        impl $name {
            fn validate(input: &str) -> Result<(), IdError> {
                check($kind, input)
            }
        }
    )*};
}

plain_validate!(
    IdentityId => "identity id",
    OrgId => "org",
    SessionId => "session id",
    ExecutionId => "execution id",
    TokenId => "token id"
);

/// The prefix of identity ids reserved for the server's own identities
/// (`sandlane:internal`, …): no caller key may be issued for one.
pub const RESERVED_IDENTITY_PREFIX: &str = "sandlane:";

impl IdentityId {
    /// Whether the id is reserved for the server's own identities (starts with
    /// [`RESERVED_IDENTITY_PREFIX`]).
    pub fn is_reserved(&self) -> bool {
        self.0.starts_with(RESERVED_IDENTITY_PREFIX)
    }
}

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const SANDBOX_PREFIX: &str = "sbx_";
const SANDBOX_BODY_LEN: usize = 26;
/// The first body character holds only 3 bits (26 × 5 = 130 bits carry 128): at most `7`.
const SANDBOX_FIRST_MAX: u8 = b'7';

/// The length of every sandbox id, in characters.
pub const SANDBOX_ID_LEN: usize = SANDBOX_PREFIX.len() + SANDBOX_BODY_LEN;

/// The sandbox id rule as a regular expression (same dialects as [`id_pattern`]):
/// `^sbx_[01234567][0123456789ABCDEFGHJKMNPQRSTVWXYZ]{25}$`, spelled out from the alphabet.
pub fn sandbox_id_pattern() -> String {
    let first: String =
        CROCKFORD.iter().take_while(|c| **c <= SANDBOX_FIRST_MAX).map(|c| char::from(*c)).collect();
    let rest: String = CROCKFORD.iter().map(|c| char::from(*c)).collect();
    format!("^{SANDBOX_PREFIX}[{first}][{rest}]{{{}}}$", SANDBOX_BODY_LEN - 1)
}

/// Whether `body` is a generated id's body: 26 base32 characters whose first leaves the
/// top 2 of its 130 bits clear.
fn is_generated_body(body: Option<&str>) -> bool {
    body.is_some_and(|b| {
        b.len() == SANDBOX_BODY_LEN
            && b.bytes().all(|c| CROCKFORD.contains(&c))
            && b.as_bytes()[0] <= SANDBOX_FIRST_MAX
    })
}

/// A generated id: `prefix`, then 48 bits of milliseconds and 80 random bits in Crockford
/// base32, so ids made at later milliseconds sort after earlier ones.
fn generated(prefix: &str, unix_millis: u64, random: u128) -> String {
    let value: u128 = (u128::from(unix_millis & 0xFFFF_FFFF_FFFF) << 80) | (random & ((1u128 << 80) - 1));
    let mut out = String::with_capacity(prefix.len() + SANDBOX_BODY_LEN);
    out.push_str(prefix);
    for i in (0..SANDBOX_BODY_LEN).rev() {
        let digit = ((value >> (i * 5)) & 0x1F) as usize;
        out.push(char::from(CROCKFORD[digit]));
    }
    out
}

impl SandboxId {
    fn validate(input: &str) -> Result<(), IdError> {
        check("sandbox id", input)?;
        if is_generated_body(input.strip_prefix(SANDBOX_PREFIX)) {
            Ok(())
        } else {
            Err(IdError::NotASandboxId { input: input.to_owned() })
        }
    }

    /// A new sandbox id from the time in milliseconds since the epoch and 80 random bits
    /// (the caller supplies both: the domain has no clock and no entropy). Ids made at
    /// later milliseconds sort after earlier ones.
    pub fn generate(unix_millis: u64, random: u128) -> Self {
        Self(generated(SANDBOX_PREFIX, unix_millis, random))
    }

    /// The millisecond timestamp the id was generated at.
    pub fn unix_millis(&self) -> u64 {
        let mut value: u128 = 0;
        for c in self.0[SANDBOX_PREFIX.len()..].bytes() {
            let digit = CROCKFORD.iter().position(|d| *d == c).unwrap_or(0);
            value = (value << 5) | digit as u128;
        }
        (value >> 80) as u64
    }
}

const SNAPSHOT_PREFIX: &str = "snp_";

/// The snapshot id rule as a regular expression, as [`sandbox_id_pattern`] with `snp_`.
pub fn snapshot_id_pattern() -> String {
    sandbox_id_pattern().replacen(SANDBOX_PREFIX, SNAPSHOT_PREFIX, 1)
}

impl SnapshotId {
    fn validate(input: &str) -> Result<(), IdError> {
        check("snapshot id", input)?;
        if is_generated_body(input.strip_prefix(SNAPSHOT_PREFIX)) {
            Ok(())
        } else {
            Err(IdError::NotASnapshotId { input: input.to_owned() })
        }
    }

    /// A new snapshot id, made as [`SandboxId::generate`] makes a sandbox id.
    pub fn generate(unix_millis: u64, random: u128) -> Self {
        Self(generated(SNAPSHOT_PREFIX, unix_millis, random))
    }
}

const TERMINAL_PREFIX: &str = "term_";

/// The terminal id rule as a regular expression, as [`sandbox_id_pattern`] with `term_`.
pub fn terminal_id_pattern() -> String {
    sandbox_id_pattern().replacen(SANDBOX_PREFIX, TERMINAL_PREFIX, 1)
}

impl TerminalId {
    fn validate(input: &str) -> Result<(), IdError> {
        check("terminal id", input)?;
        if is_generated_body(input.strip_prefix(TERMINAL_PREFIX)) {
            Ok(())
        } else {
            Err(IdError::NotATerminalId { input: input.to_owned() })
        }
    }

    /// A new terminal id, made as [`SandboxId::generate`] makes a sandbox id.
    pub fn generate(unix_millis: u64, random: u128) -> Self {
        Self(generated(TERMINAL_PREFIX, unix_millis, random))
    }
}

const PREVIEW_LINK_PREFIX: &str = "pvl_";

/// The preview link id rule as a regular expression, as [`sandbox_id_pattern`] with `pvl_`.
pub fn preview_link_id_pattern() -> String {
    sandbox_id_pattern().replacen(SANDBOX_PREFIX, PREVIEW_LINK_PREFIX, 1)
}

impl PreviewLinkId {
    fn validate(input: &str) -> Result<(), IdError> {
        check("preview link id", input)?;
        if is_generated_body(input.strip_prefix(PREVIEW_LINK_PREFIX)) {
            Ok(())
        } else {
            Err(IdError::NotAPreviewLinkId { input: input.to_owned() })
        }
    }

    /// A new preview link id, made as [`SandboxId::generate`] makes a sandbox id.
    pub fn generate(unix_millis: u64, random: u128) -> Self {
        Self(generated(PREVIEW_LINK_PREFIX, unix_millis, random))
    }
}

#[cfg(test)]
mod tests;

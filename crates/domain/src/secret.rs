//! Secrets: values whose `Debug` and `Display` never show them.

use std::fmt;

macro_rules! secret_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            /// Wraps a secret value.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The secret itself, for the one place that must send or compare it.
            pub fn expose(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(<redacted>)", stringify!($name))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("<redacted>")
            }
        }
    };
}

secret_type!(
    /// A sandbox credential: a compact JWS minted for one caller and one sandbox.
    SandboxToken
);
secret_type!(
    /// A caller's API key, shown once at creation and stored only as a hash.
    CallerKey
);
secret_type!(
    /// A brokered secret's value (or the header value made from it): what the egress
    /// proxy adds to a sandbox's requests, and what the sandbox never holds.
    SecretValue
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let t = SandboxToken::new("eyJhbGciOi.secret.sig");
        assert_eq!(format!("{t}"), "<redacted>");
        assert_eq!(format!("{t:?}"), "SandboxToken(<redacted>)");
        assert_eq!(format!("{:?}", Some(&t)), "Some(SandboxToken(<redacted>))");
        assert_eq!(t.expose(), "eyJhbGciOi.secret.sig");
        let k = CallerKey::new("sk_live_abc");
        assert!(!format!("{k:?}{k}").contains("abc"));
    }
}

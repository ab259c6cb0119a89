//! Brokered secrets: a secret's binding ([`binding`]: its name, hosts, header, format,
//! scope, methods and paths), the choice among an org's secrets for a caller and a host
//! ([`choose`]), what one connection of a sandbox has added to its requests
//! ([`Injection`]), and which of its requests may carry it ([`Injection::permits`]).
//!
//! The secrets are chosen before a connection is let through; what reaches the proxy is the list of
//! injections for that connection's host, each with the value already rendered. A request
//! outside an injection's methods or paths is refused rather than sent without it, so a
//! sandbox cannot learn which requests carry a secret by watching which ones fail upstream.

pub mod binding;
mod choose;

pub use binding::{
    BindingError, BindingInput, HeaderName, SecretBinding, SecretHost, SecretName, SecretScope, ValueFormat,
    check_value,
};
pub use choose::choose;

use crate::secret::SecretValue;

/// One header the proxy sets on the requests of a brokered connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// The secret's name (for the audit; never its value).
    pub secret: String,
    /// The header to set, lower case (any the sandbox sent under that name is replaced).
    pub header: String,
    /// The header's value, rendered from the secret's format.
    pub value: SecretValue,
    /// The methods allowed, upper case; empty: any.
    pub methods: Vec<String>,
    /// The path prefixes allowed (each starts with `/`); empty: any.
    pub paths: Vec<String>,
}

impl Injection {
    /// Whether a request `method path` may be sent with this secret. `path` is the
    /// request target's path (a query after `?` is ignored). A path with a `.` or `..`
    /// segment, an encoded dot or slash, or a backslash is never permitted when the
    /// binding names paths: upstream servers normalise those differently, and a prefix
    /// check on the raw text would let `/allowed/../admin` through.
    pub fn permits(&self, method: &str, path: &str) -> bool {
        let method_ok =
            self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method));
        method_ok && (self.paths.is_empty() || path_within(path, &self.paths))
    }
}

/// Whether `path` (query ignored) lies under one of `prefixes`, segment-wise.
fn path_within(path: &str, prefixes: &[String]) -> bool {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if !path.starts_with('/') || !plain_path(path) {
        return false;
    }
    prefixes.iter().any(|prefix| {
        path.strip_prefix(prefix.as_str())
            .is_some_and(|rest| prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'))
    })
}

/// No dot segment, no encoded dot, slash or backslash, no backslash, no `#`.
fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") || path.contains(['\\', '#']) {
        return false;
    }
    path.split('/').all(|segment| segment != "." && segment != "..")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn injection(methods: &[&str], paths: &[&str]) -> Injection {
        Injection {
            secret: "gh".into(),
            header: "authorization".into(),
            value: SecretValue::new("Bearer x"),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    #[test]
    fn empty_lists_permit_everything_plain() {
        let i = injection(&[], &[]);
        assert!(i.permits("DELETE", "/anything?x=1"));
    }

    #[test]
    fn methods_and_prefixes_are_enforced_segment_wise() {
        let i = injection(&["GET", "post"], &["/repos/acme", "/user/"]);
        assert!(i.permits("get", "/repos/acme"));
        assert!(i.permits("POST", "/repos/acme/x/pulls?state=open"));
        assert!(i.permits("GET", "/user/emails"));
        assert!(!i.permits("DELETE", "/repos/acme"));
        assert!(!i.permits("GET", "/repos/acmecorp"));
        assert!(!i.permits("GET", "/user"));
        assert!(!i.permits("GET", "/"));
    }

    #[test]
    fn traversal_and_encodings_are_refused_when_paths_are_named() {
        let i = injection(&[], &["/repos/acme"]);
        for path in [
            "/repos/acme/../../admin",
            "/repos/acme/./x",
            "/repos/acme/%2e%2e/admin",
            "/repos/acme/%2F..",
            "/repos/acme\\..\\admin",
            "repos/acme",
            "*",
        ] {
            assert!(!i.permits("GET", path), "{path}");
        }
    }

    proptest! {
        #[test]
        fn a_permitted_path_has_the_prefix_and_no_dot_segment(path in "(/[a-z.%2]{0,4}){0,5}") {
            let i = injection(&[], &["/a"]);
            if i.permits("GET", &path) {
                prop_assert!(path == "/a" || path.starts_with("/a/"));
                prop_assert!(!path.split('/').any(|s| s == ".." || s == "."));
            }
        }
    }
}

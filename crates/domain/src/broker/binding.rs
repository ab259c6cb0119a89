//! A brokered secret's binding: its name, the hosts it is for, the header it becomes, who
//! it is for (its scope) and which requests may carry it. Every part is checked here, so a
//! binding that exists is one the proxy can apply without further checks.

use std::fmt;

use crate::caller::CallerClass;
use crate::egress::{Allowlist, HostRule, normalize_host};
use crate::id::IdentityId;
use crate::secret::SecretValue;

/// The longest secret name.
pub const MAX_NAME_LEN: usize = 64;
/// The longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 8 * 1024;
/// The longest format, in bytes.
pub const MAX_FORMAT_LEN: usize = 256;
/// The most hosts, methods or paths one binding names (each).
pub const MAX_ITEMS: usize = 32;
/// The longest path prefix, in bytes.
pub const MAX_PATH_LEN: usize = 512;
/// The ports a host named without one covers: HTTPS. (A secret goes in clear, over plain
/// HTTP, only to a port its binding names: [`SecretHost::covers_in_clear`].)
pub const DEFAULT_PORTS: [u16; 1] = [443];
/// The placeholder a format holds exactly once.
pub const VALUE_PLACEHOLDER: &str = "{value}";

/// Why a binding, or a value, is refused. The messages never hold a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// The name breaks the rules.
    #[error(
        "secret name {0:?} is invalid: 1-{MAX_NAME_LEN} of a-z A-Z 0-9 . _ -, starting with a letter or digit"
    )]
    Name(String),
    /// A host breaks the rules.
    #[error("host {0:?} is invalid: {1}")]
    Host(String, &'static str),
    /// The header breaks the rules.
    #[error("header {0:?} is not allowed: {1}")]
    Header(String, &'static str),
    /// The format breaks the rules.
    #[error("the format is invalid: {0}")]
    Format(&'static str),
    /// The value breaks the rules.
    #[error("the value is invalid: {0}")]
    Value(&'static str),
    /// A method breaks the rules.
    #[error("method {0:?} is not an HTTP method token")]
    Method(String),
    /// A path breaks the rules.
    #[error("path {0:?} is invalid: {1}")]
    Path(String, &'static str),
    /// Too many hosts, methods or paths, or none where one is needed.
    #[error("{0}")]
    Count(String),
}

/// A secret's name: unique within its org.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    /// Checks a name: 1 to [`MAX_NAME_LEN`] of `a-z A-Z 0-9 . _ -`, the first a letter or
    /// digit.
    ///
    /// # Errors
    /// [`BindingError::Name`].
    pub fn parse(input: impl Into<String>) -> Result<Self, BindingError> {
        let input = input.into();
        let ok = (1..=MAX_NAME_LEN).contains(&input.len())
            && input.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && input.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok { Ok(Self(input)) } else { Err(BindingError::Name(input.chars().take(80).collect())) }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One host a secret is for: a name (`api.example.com`), or every name under one
/// (`*.example.com`), on one port, or, without a port, on 443 ([`DEFAULT_PORTS`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretHost {
    wildcard: bool,
    host: String,
    port: Option<u16>,
}

impl SecretHost {
    /// Parses `host`, `*.host`, either with `:port`; an IPv6 literal in brackets.
    ///
    /// # Errors
    /// [`BindingError::Host`].
    pub fn parse(input: &str) -> Result<Self, BindingError> {
        let bad = |why| BindingError::Host(input.chars().take(80).collect(), why);
        let (wildcard, rest) = match input.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, input),
        };
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (literal, after) = inner.split_once(']').ok_or_else(|| bad("an unclosed '['"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("text after ']'"))?),
            };
            (literal, port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => return Err(bad("the port must be 1-65535")),
            },
        };
        if host.contains('*') {
            return Err(bad("'*' only as a whole first label ('*.example.com')"));
        }
        let normal = normalize_host(host).map_err(|_| bad("not a host name or address"))?;
        let is_ip = normal.parse::<std::net::IpAddr>().is_ok();
        if wildcard && (is_ip || !normal.contains('.')) {
            return Err(bad("a wildcard needs a name of two labels or more under it"));
        }
        Ok(Self { wildcard, host: normal, port })
    }

    /// The ports it covers.
    pub fn ports(&self) -> Vec<u16> {
        self.port.map_or_else(|| DEFAULT_PORTS.to_vec(), |p| vec![p])
    }

    /// Whether it covers `host` (as [`normalize_host`] gives it) on `port`.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        self.ports().into_iter().any(|p| HostRule::new(self.wildcard, &self.host, Some(p)).covers(host, port))
    }

    /// Whether it covers a request sent in clear (plain HTTP) to `host` on `port`: only
    /// when it names that port itself, and never 443 (a port for TLS, which a sandbox
    /// could otherwise ask to have its secret sent to in clear: `http://host:443/`).
    pub fn covers_in_clear(&self, host: &str, port: u16) -> bool {
        self.port == Some(port) && port != 443 && self.covers(host, port)
    }

    /// Whether `allowlist` lets a sandbox reach every host and port this covers; `Err`
    /// names the first `host:port` it does not.
    ///
    /// # Errors
    /// The `host:port` (or `*.host:port`) the allowlist does not allow.
    pub fn allowed_by(&self, allowlist: &Allowlist) -> Result<(), String> {
        for port in self.ports() {
            let allowed = if self.wildcard {
                allowlist.allows_all_under(&self.host, port).is_some()
            } else {
                allowlist.allows_host(&self.host, port).is_some()
            };
            if !allowed {
                let star = if self.wildcard { "*." } else { "" };
                let host =
                    if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
                return Err(format!("{star}{host}:{port}"));
            }
        }
        Ok(())
    }
}

impl fmt::Display for SecretHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Headers a secret may never become: hop-by-hop headers, and the ones that frame or
/// route a request (the proxy owns those).
const REFUSED_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "forwarded",
    "via",
    "http2-settings",
];

/// The header a secret is sent in: an HTTP token, lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderName(String);

impl HeaderName {
    /// Checks and lower-cases a header name: an RFC 9110 token of at most 64 characters,
    /// not hop-by-hop, not one that frames or routes the request (`host`,
    /// `content-length`, `transfer-encoding`, `connection`, …), not `proxy-*`, not an
    /// HTTP/2 pseudo-header.
    ///
    /// # Errors
    /// [`BindingError::Header`].
    pub fn parse(input: &str) -> Result<Self, BindingError> {
        let bad = |why| BindingError::Header(input.chars().take(80).collect(), why);
        if input.is_empty() || input.len() > 64 {
            return Err(bad("1-64 characters"));
        }
        if !input.bytes().all(is_tchar) {
            return Err(bad("not an HTTP token"));
        }
        let lower = input.to_ascii_lowercase();
        if REFUSED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
            return Err(bad("the proxy owns this header"));
        }
        Ok(Self(lower))
    }

    /// `authorization`.
    pub fn authorization() -> Self {
        Self("authorization".to_owned())
    }

    /// The name, lower case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `text` may stand in a header value: no control character (CR, LF, NUL and the
/// rest) but tab.
fn header_safe(text: &str) -> bool {
    text.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// How a value becomes the header's value: a text with `{value}` exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueFormat(String);

impl ValueFormat {
    /// Checks a format: `{value}` exactly once, at most [`MAX_FORMAT_LEN`] bytes, no
    /// control character.
    ///
    /// # Errors
    /// [`BindingError::Format`].
    pub fn parse(input: &str) -> Result<Self, BindingError> {
        if input.len() > MAX_FORMAT_LEN {
            return Err(BindingError::Format("at most 256 bytes"));
        }
        if input.matches(VALUE_PLACEHOLDER).count() != 1 {
            return Err(BindingError::Format("it must hold {value} exactly once"));
        }
        if !header_safe(input) {
            return Err(BindingError::Format("no control characters (CR, LF, NUL, …)"));
        }
        Ok(Self(input.to_owned()))
    }

    /// The default for `header`: `Bearer {value}` for `authorization`, `{value}` otherwise.
    pub fn default_for(header: &HeaderName) -> Self {
        if header.as_str() == "authorization" {
            Self("Bearer {value}".to_owned())
        } else {
            Self(VALUE_PLACEHOLDER.to_owned())
        }
    }

    /// The format's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The header value for `value`.
    pub fn render(&self, value: &SecretValue) -> SecretValue {
        SecretValue::new(self.0.replacen(VALUE_PLACEHOLDER, value.expose(), 1))
    }
}

/// Checks a secret's value: 1 to [`MAX_VALUE_LEN`] bytes, no control character (CR, LF,
/// NUL, …) but tab, no leading or trailing space.
///
/// # Errors
/// [`BindingError::Value`] (never holding the value).
pub fn check_value(value: &SecretValue) -> Result<(), BindingError> {
    let v = value.expose();
    if v.is_empty() || v.len() > MAX_VALUE_LEN {
        return Err(BindingError::Value("1 to 8192 bytes"));
    }
    if !header_safe(v) {
        return Err(BindingError::Value("no control characters (CR, LF, NUL, …)"));
    }
    if v.trim() != v {
        return Err(BindingError::Value("no leading or trailing white space"));
    }
    Ok(())
}

/// Whose secret it is: the callers a sandbox may act for and have it used.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SecretScope {
    /// One caller (`{"identity": ID}`).
    Identity(IdentityId),
    /// Every caller of a class, `user` or `service` (`{"class": …}`).
    Class(CallerClass),
    /// Every caller of the org (`{"org": true}`).
    Org,
}

impl SecretScope {
    /// A class scope: `user` or `service` only.
    ///
    /// # Errors
    /// [`BindingError::Count`] for `internal`.
    pub fn class(class: CallerClass) -> Result<Self, BindingError> {
        match class {
            CallerClass::User | CallerClass::Service => Ok(Self::Class(class)),
            CallerClass::Internal => Err(BindingError::Count("a class scope is user or service".to_owned())),
        }
    }

    /// `identity`, `class` or `org`.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Identity(_) => "identity",
            Self::Class(_) => "class",
            Self::Org => "org",
        }
    }

    /// How well it fits `identity` of `class`: 0 (its identity), 1 (its class), 2 (the
    /// org); `None`: not in scope. The server's own (`internal`) callers are in no scope.
    pub fn rank(&self, identity: &IdentityId, class: CallerClass) -> Option<u8> {
        if class == CallerClass::Internal {
            return None;
        }
        match self {
            Self::Identity(id) if id == identity => Some(0),
            Self::Class(c) if *c == class => Some(1),
            Self::Org => Some(2),
            Self::Identity(_) | Self::Class(_) => None,
        }
    }
}

impl fmt::Display for SecretScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identity(id) => write!(f, "identity {id}"),
            Self::Class(c) => write!(f, "class {c}"),
            Self::Org => f.write_str("org"),
        }
    }
}

/// What a secret is for: everything about it but its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretBinding {
    /// Its name.
    pub name: SecretName,
    /// The hosts it is sent to (at least one).
    pub hosts: Vec<SecretHost>,
    /// The header it is sent in.
    pub header: HeaderName,
    /// How its value becomes the header's.
    pub format: ValueFormat,
    /// Who it is for.
    pub scope: SecretScope,
    /// The methods allowed, upper case; empty: any.
    pub methods: Vec<String>,
    /// The path prefixes allowed (each starts with `/`); empty: any.
    pub paths: Vec<String>,
}

/// A binding as given, before it is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindingInput<'a> {
    /// The hosts.
    pub hosts: &'a [String],
    /// The header (`None`: `authorization`).
    pub header: Option<&'a str>,
    /// The format (`None`: the header's default).
    pub format: Option<&'a str>,
    /// The methods.
    pub methods: &'a [String],
    /// The paths.
    pub paths: &'a [String],
}

impl SecretBinding {
    /// Checks a binding.
    ///
    /// # Errors
    /// [`BindingError`] naming the first part that breaks the rules.
    pub fn new(name: SecretName, scope: SecretScope, input: &BindingInput<'_>) -> Result<Self, BindingError> {
        if input.hosts.is_empty() || input.hosts.len() > MAX_ITEMS {
            return Err(BindingError::Count(format!("a secret names 1 to {MAX_ITEMS} hosts")));
        }
        if input.methods.len() > MAX_ITEMS || input.paths.len() > MAX_ITEMS {
            return Err(BindingError::Count(format!("at most {MAX_ITEMS} methods and {MAX_ITEMS} paths")));
        }
        let mut hosts = Vec::with_capacity(input.hosts.len());
        for h in input.hosts {
            let host = SecretHost::parse(h)?;
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        let header = input.header.map_or_else(|| Ok(HeaderName::authorization()), HeaderName::parse)?;
        let format =
            input.format.map_or_else(|| Ok(ValueFormat::default_for(&header)), ValueFormat::parse)?;
        let mut methods: Vec<String> = Vec::with_capacity(input.methods.len());
        for m in input.methods {
            if m.is_empty() || m.len() > 32 || !m.bytes().all(is_tchar) {
                return Err(BindingError::Method(m.chars().take(40).collect()));
            }
            let upper = m.to_ascii_uppercase();
            if !methods.contains(&upper) {
                methods.push(upper);
            }
        }
        let mut paths: Vec<String> = Vec::with_capacity(input.paths.len());
        for p in input.paths {
            check_path(p)?;
            if !paths.contains(p) {
                paths.push(p.clone());
            }
        }
        Ok(Self { name, hosts, header, format, scope, methods, paths })
    }

    /// Whether it is for `host` on `port`.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|h| h.covers(host, port))
    }

    /// Whether it is for a request sent in clear to `host` on `port`
    /// ([`SecretHost::covers_in_clear`]).
    pub fn covers_in_clear(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|h| h.covers_in_clear(host, port))
    }
}

/// A path prefix: starts with `/`, no query or fragment, no dot segment, no encoded dot,
/// slash or backslash, no control character (the proxy's check is segment-wise).
fn check_path(path: &str) -> Result<(), BindingError> {
    let bad = |why| BindingError::Path(path.chars().take(80).collect(), why);
    if !path.starts_with('/') {
        return Err(bad("it must start with '/'"));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(bad("at most 512 bytes"));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains(['?', '#', '\\']) {
        return Err(bad("printable ASCII without '?', '#' or '\\'"));
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") {
        return Err(bad("no encoded '.', '/' or '\\'"));
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return Err(bad("no '.' or '..' segment"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

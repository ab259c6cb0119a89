//! Egress: the rules the server's proxy applies to every destination a sandbox asks for.
//!
//! A destination is a host name (or an address literal) and a port, as the sandbox's
//! `CONNECT` or absolute-form request names it. It may pass only when a host rule of the
//! sandbox's allowlist covers the name and the port ([`Allowlist::allows_host`]); then the
//! proxy resolves the name itself and connects only to addresses outside the ranges no
//! sandbox reaches by default ([`refused_range`]) — loopback, link-local, private, CGNAT,
//! multicast, unspecified, reserved and broadcast, documentation, the IPv6 forms that embed
//! such an IPv4 address, and IPv6's own special-purpose blocks (unique local, site-local,
//! discard, local-use NAT64 `64:ff9b:1::/48`, IETF protocol assignments `2001::/23`,
//! documentation `2001:db8::/32` and `3fff::/20`) — unless the
//! allowlist names the address's range explicitly ([`Allowlist::allows_address`]). So a sandbox cannot reach the server's own network by
//! pointing an allowed name (or an address literal) at it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The loopback port inside every sandbox where its supervisor serves the egress proxy.
pub const PROXY_PORT: u16 = 3128;

/// The proxy's URL as processes inside the sandbox see it (`HTTP_PROXY`, `HTTPS_PROXY`).
pub const PROXY_URL: &str = "http://127.0.0.1:3128";

/// The names that bypass the proxy (`NO_PROXY`): the sandbox's own loopback.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The environment every command gets so HTTP clients use the proxy (`NODE_USE_ENV_PROXY`:
/// Node's own `fetch` and `https` follow `HTTPS_PROXY` from Node 24 and 22.21 on; older Node
/// ignores every proxy variable).
pub fn proxy_vars() -> [(&'static str, String); 7] {
    [
        ("HTTP_PROXY", PROXY_URL.to_owned()),
        ("HTTPS_PROXY", PROXY_URL.to_owned()),
        ("http_proxy", PROXY_URL.to_owned()),
        ("https_proxy", PROXY_URL.to_owned()),
        ("NO_PROXY", NO_PROXY.to_owned()),
        ("no_proxy", NO_PROXY.to_owned()),
        ("NODE_USE_ENV_PROXY", "1".to_owned()),
    ]
}

/// The sandbox's own CA certificate inside it (brokered TLS: the proxy ends TLS for hosts
/// a secret names with a leaf this CA issued).
pub const CA_FILE_PATH: &str = "/run/sandlane/ca.pem";

/// The bundle the sandbox's TLS clients trust: the host's system roots, then its CA.
pub const CA_BUNDLE_PATH: &str = "/run/sandlane/ca-bundle.pem";

/// The environment every command gets so TLS clients trust the bundle (`NODE_EXTRA_CA_CERTS`:
/// the CA alone, added by Node to its own roots).
pub fn ca_vars() -> [(&'static str, String); 5] {
    [
        ("SSL_CERT_FILE", CA_BUNDLE_PATH.to_owned()),
        ("REQUESTS_CA_BUNDLE", CA_BUNDLE_PATH.to_owned()),
        ("CURL_CA_BUNDLE", CA_BUNDLE_PATH.to_owned()),
        ("GIT_SSL_CAINFO", CA_BUNDLE_PATH.to_owned()),
        ("NODE_EXTRA_CA_CERTS", CA_FILE_PATH.to_owned()),
    ]
}

/// One host rule: a name (`api.example.com`), or every name under one (`*.example.com`),
/// on one port or on any.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRule {
    wildcard: bool,
    host: String,
    port: Option<u16>,
}

impl HostRule {
    /// A rule for `host` (lower case, without `*.`; `wildcard`: every name under it, not
    /// the name itself) on `port` (none: any).
    pub fn new(wildcard: bool, host: &str, port: Option<u16>) -> Self {
        Self { wildcard, host: host.trim_end_matches('.').to_ascii_lowercase(), port }
    }

    /// Whether the rule covers `host` (a name as [`normalize_host`] gives it) on `port`.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        if self.wildcard {
            host.len() > self.host.len() + 1
                && host.ends_with(&self.host)
                && host.as_bytes()[host.len() - self.host.len() - 1] == b'.'
        } else {
            host == self.host
        }
    }

    /// Whether the rule covers every name under `suffix` (`*.suffix`) on `port`: a
    /// wildcard rule for `suffix` or for a name `suffix` lies under.
    pub fn covers_all_under(&self, suffix: &str, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
            && self.wildcard
            && (suffix == self.host
                || (suffix.len() > self.host.len() + 1
                    && suffix.ends_with(&self.host)
                    && suffix.as_bytes()[suffix.len() - self.host.len() - 1] == b'.'))
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// A block of addresses (`10.0.0.0/8`, `127.0.0.1/32`, `fd00::/8`) an allowlist names
/// explicitly, so the proxy may connect into it although it is refused by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressRange {
    network: IpAddr,
    prefix: u8,
}

/// A range that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an address range (ADDRESS/PREFIX, such as 10.0.0.0/8 or fd00::/8): {reason}")]
pub struct RangeError {
    /// The input (its first 64 characters).
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl AddressRange {
    /// Parses `ADDRESS/PREFIX`; the address must have no bits set past the prefix.
    ///
    /// # Errors
    /// [`RangeError`] naming the input.
    pub fn parse(input: &str) -> Result<Self, RangeError> {
        let bad = |reason| RangeError { input: input.chars().take(64).collect(), reason };
        let (addr, prefix) = input.split_once('/').ok_or_else(|| bad("no /PREFIX"))?;
        let network: IpAddr = addr.parse().map_err(|_| bad("not an IPv4 or IPv6 address"))?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the prefix is a number"));
        }
        let prefix: u8 = prefix.parse().map_err(|_| bad("the prefix is a number"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad("the prefix is longer than the address"));
        }
        let range = Self { network, prefix };
        if range.mask(network) != network {
            return Err(bad("the address has bits set past the prefix"));
        }
        Ok(range)
    }

    fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(bits & mask))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(bits & mask))
            }
        }
    }

    /// Whether `ip` is in the range (an IPv4 range never holds an IPv6 address, and the
    /// reverse).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.network.is_ipv4() && self.mask(ip) == self.network
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Serialize for AddressRange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AddressRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Why an address is refused by default: the name of its range.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_unspecified() || a == 0 {
        "unspecified (0.0.0.0/8)"
    } else if ip.is_loopback() {
        "loopback (127.0.0.0/8)"
    } else if ip.is_private() {
        "private (10/8, 172.16/12, 192.168/16)"
    } else if ip.is_link_local() {
        "link-local (169.254.0.0/16)"
    } else if a == 100 && (64..128).contains(&b) {
        "CGNAT (100.64.0.0/10)"
    } else if ip.is_multicast() {
        "multicast (224.0.0.0/4)"
    } else if ip.is_broadcast() || a >= 240 {
        "reserved (240.0.0.0/4)"
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        "IETF protocol assignments (192.0.0.0/24)"
    } else if a == 198 && (b == 18 || b == 19) {
        "benchmarking (198.18.0.0/15)"
    } else if matches!(ip.octets(), [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _]) {
        // RFC 5737: never routed on the Internet; a network may still use them inside.
        "documentation (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24)"
    } else {
        return None;
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // IPv6 forms that carry an IPv4 address: the IPv4 address decides.
    if let Some(v4) = embedded_v4(ip) {
        return refused_v4(v4).map(|_| "an IPv6 form of a refused IPv4 address");
    }
    Some(if ip.is_unspecified() {
        "unspecified (::)"
    } else if ip.is_loopback() {
        "loopback (::1)"
    } else if segments[0] & 0xffc0 == 0xfe80 {
        "link-local (fe80::/10)"
    } else if segments[0] & 0xffc0 == 0xfec0 {
        "site-local (fec0::/10)"
    } else if segments[0] & 0xfe00 == 0xfc00 {
        "unique local (fc00::/7)"
    } else if ip.is_multicast() {
        "multicast (ff00::/8)"
    } else if segments[0] == 0x100 && segments[1..4] == [0, 0, 0] {
        "discard (100::/64)"
    } else if segments[..3] == [0x64, 0xff9b, 1] {
        // RFC 8215: a network's own NAT64 prefixes, which may carry any IPv4 address
        // (its own internal ones included) at any position.
        "local-use NAT64 (64:ff9b:1::/48)"
    } else if segments[..2] == [0x2001, 0xdb8] || (segments[0] == 0x3fff && segments[1] < 0x1000) {
        // RFC 3849 and RFC 9637: documentation, never routed on the Internet.
        "documentation (2001:db8::/32, 3fff::/20)"
    } else if segments[0] == 0x2001 && segments[1] < 0x200 {
        // RFC 2928: Teredo (which carries an IPv4 address, obfuscated), benchmarking,
        // ORCHID and the other special-purpose blocks.
        "IETF protocol assignments (2001::/23)"
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if s[..5] == [0, 0, 0, 0, 0]
        && (s[5] == 0xffff || (s[5] == 0 && !ip.is_loopback() && !ip.is_unspecified()))
    {
        return Some(tail(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(tail(s[1], s[2]));
    }
    None
}

/// A block of addresses an allowlist names explicitly, on one port or on any: the proxy
/// may connect into it (although it may be refused by default), and an address literal in
/// it is a destination the list covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RangeRule {
    range: AddressRange,
    port: Option<u16>,
}

impl RangeRule {
    /// `range`, on `port` (none: any).
    pub fn new(range: AddressRange, port: Option<u16>) -> Self {
        Self { range, port }
    }

    /// Whether the rule covers `ip` on `port`.
    pub fn covers(&self, ip: IpAddr, port: u16) -> bool {
        self.port.is_none_or(|p| p == port) && self.range.contains(ip)
    }
}

impl fmt::Display for RangeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.range)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// What a sandbox may reach: host rules and the address ranges named explicitly. Empty by
/// default: no egress at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    hosts: Vec<HostRule>,
    ranges: Vec<RangeRule>,
}

impl Allowlist {
    /// A list of host rules and explicitly named address ranges.
    pub fn new(hosts: Vec<HostRule>, ranges: Vec<RangeRule>) -> Self {
        Self { hosts, ranges }
    }

    /// The list an org's rules make for a sandbox whose token is for a caller of `class`:
    /// the rules for every class and those for `class`.
    pub fn from_rules(rules: &[crate::policy::EgressRule], class: crate::CallerClass) -> Self {
        let mut list = Self::default();
        for rule in rules.iter().filter(|r| r.class().is_none_or(|c| c == class)) {
            match rule.range() {
                Some(range) => list.ranges.push(RangeRule::new(range, rule.port())),
                None => list.hosts.push(HostRule::new(rule.is_wildcard(), rule.host(), rule.port())),
            }
        }
        list
    }

    /// Whether the list is empty (no egress at all).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.ranges.is_empty()
    }

    /// The rule (as text) that covers `host` (as [`normalize_host`] gives it) on `port`, if
    /// any: a host rule; for an address literal, a range rule holding it.
    pub fn allows_host(&self, host: &str, port: u16) -> Option<String> {
        if let Some(rule) = self.hosts.iter().find(|r| r.covers(host, port)) {
            return Some(rule.to_string());
        }
        let ip = host.parse::<IpAddr>().ok()?;
        self.ranges.iter().find(|r| r.covers(ip, port)).map(ToString::to_string)
    }

    /// The rule (as text) that covers every name under `suffix` (`*.suffix`) on `port`.
    pub fn allows_all_under(&self, suffix: &str, port: u16) -> Option<String> {
        self.hosts.iter().find(|r| r.covers_all_under(suffix, port)).map(ToString::to_string)
    }

    /// Whether the proxy may connect to `ip` on `port`: it is outside every refused range,
    /// or a range rule of the list covers it (an IPv6 form of an IPv4 address is allowed
    /// when a rule covers either form). `Err` names the refused range.
    ///
    /// # Errors
    /// The name of the refused range `ip` is in.
    pub fn allows_address(&self, ip: IpAddr, port: u16) -> Result<(), &'static str> {
        let Some(range) = refused_range(ip) else { return Ok(()) };
        let inner = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let named =
            self.ranges.iter().any(|r| r.covers(ip, port) || inner.is_some_and(|v4| r.covers(v4, port)));
        if named { Ok(()) } else { Err(range) }
    }
}

/// Why a destination is refused before anything is resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Not a host name or address literal.
    #[error("{0:?} is not a host name")]
    Invalid(String),
}

/// The host as the proxy compares it: lower case, without a trailing dot, an IPv6
/// literal without brackets. Only names of `a-z 0-9 - .` (and `_`, which some services
/// use) and address literals pass; at most 253 characters.
///
/// # Errors
/// [`HostError::Invalid`] naming the input (its first 64 characters).
pub fn normalize_host(input: &str) -> Result<String, HostError> {
    let bad = || HostError::Invalid(input.chars().take(64).collect());
    let trimmed = input.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(input);
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let host = trimmed.strip_suffix('.').unwrap_or(trimmed).to_ascii_lowercase();
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        });
    if ok { Ok(host) } else { Err(bad()) }
}

#[cfg(test)]
mod tests;

/// One destination decision as the audit throttle counts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination<S> {
    /// The sandbox.
    pub sandbox: S,
    /// The host (`*` in a sandbox-wide summary: the decisions past its cap).
    pub host: String,
    /// The port (0 in a sandbox-wide summary).
    pub port: u16,
    /// Whether it was allowed.
    pub allowed: bool,
}

/// Decisions counted rather than written one by one in a window: of one destination, or
/// (host `*`) of one sandbox past its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary<S> {
    /// What was counted.
    pub destination: Destination<S>,
    /// How many decisions were not written one by one.
    pub count: u64,
    /// When the window started (milliseconds since the epoch).
    pub since_ms: i64,
}

/// Decisions in one window: of one destination, or of one sandbox of one kind (allowed,
/// or refused) whatever the destination.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: i64,
    /// Written one by one.
    written: u32,
    /// Counted, for the window's summary.
    counted: u64,
}

impl Window {
    fn new(start_ms: i64) -> Self {
        Self { start_ms, written: 0, counted: 0 }
    }

    fn ended(&self, now_ms: i64, window_ms: i64) -> bool {
        now_ms.saturating_sub(self.start_ms) >= window_ms
    }
}

/// What the throttle holds of one sandbox.
#[derive(Debug, Clone)]
struct SandboxWindows {
    /// Per decision kind (refused, allowed): the sandbox-wide window; its `counted` are
    /// the decisions past the cap, whatever their destination.
    kinds: [Option<Window>; 2],
    /// The destinations (host, port, allowed) with a decision written one by one in their
    /// current window: an entry is made only then, so at most the cap per kind in a
    /// sandbox-wide window, and (ended ones being swept when that window ends) at most
    /// twice the cap per kind, whatever names the sandbox asks for.
    destinations: std::collections::HashMap<(String, u16, bool), Window>,
}

/// Keeps the audit log (and the log lines that follow it) from being flooded, in memory
/// that no sandbox can grow: per window, at most `burst` decisions of one sandbox for one
/// destination (host, port, decision) are written one by one, and at most `sandbox_cap`
/// of one sandbox of each decision (allowed, refused) in all; the rest are counted, and
/// written as one summary per destination, plus one sandbox-wide summary (host `*`) for
/// what passed the cap, when their window ends.
///
/// A destination is remembered only when one of its decisions is written one by one, so
/// a decision for any other (a new name past the cap) adds only to the sandbox-wide
/// count: what the throttle holds per sandbox is bounded by the cap, not by the names
/// asked for ([`Self::held`]). Nothing is lost: every decision is written one by one or
/// counted in exactly one summary. Pure: the time comes in as an argument.
#[derive(Debug, Clone)]
pub struct AuditThrottle<S> {
    burst: u32,
    sandbox_cap: u32,
    window_ms: i64,
    sandboxes: std::collections::HashMap<S, SandboxWindows>,
}

impl<S: Clone + Eq + std::hash::Hash> AuditThrottle<S> {
    /// A throttle writing `burst` decisions per destination and `sandbox_cap` per sandbox
    /// one by one in each window of `window_ms`.
    pub fn new(burst: u32, sandbox_cap: u32, window_ms: i64) -> Self {
        Self { burst, sandbox_cap, window_ms: window_ms.max(1), sandboxes: std::collections::HashMap::new() }
    }

    /// Whether the decision about `destination` at `now_ms` is written one by one
    /// (`true`) or counted; and the summaries of its sandbox's windows that have ended, to
    /// write now (the other sandboxes' come from [`Self::flush`]).
    pub fn admit(&mut self, destination: &Destination<S>, now_ms: i64) -> (bool, Vec<Summary<S>>) {
        let (burst, cap, window_ms) = (self.burst, self.sandbox_cap, self.window_ms);
        let sandbox = &destination.sandbox;
        let mut due = Vec::new();
        let windows = self
            .sandboxes
            .entry(sandbox.clone())
            .or_insert_with(|| SandboxWindows { kinds: [None, None], destinations: Default::default() });
        let kind = usize::from(destination.allowed);
        let sandbox_window = match windows.kinds[kind] {
            Some(w) if !w.ended(now_ms, window_ms) => w,
            ended => {
                // A new sandbox-wide window: the last one's summary is due, and so are
                // the destinations whose windows ended (so entries of old windows never
                // pile up, whether or not anyone flushes).
                if let Some(w) = ended {
                    push_wide(&mut due, sandbox, destination.allowed, w);
                }
                sweep(sandbox, &mut windows.destinations, |w| w.ended(now_ms, window_ms), &mut due);
                Window::new(now_ms)
            }
        };
        let mut sandbox_window = sandbox_window;
        let key = (destination.host.clone(), destination.port, destination.allowed);
        if windows.destinations.get(&key).is_some_and(|w| w.ended(now_ms, window_ms))
            && let Some((key, w)) = windows.destinations.remove_entry(&key)
        {
            push_one(&mut due, sandbox, key, w);
        }
        let under_cap = sandbox_window.written < cap;
        let written = match windows.destinations.get_mut(&key) {
            Some(w) if w.written < burst && under_cap => {
                w.written += 1;
                true
            }
            // Within its burst but past the sandbox's cap: the sandbox-wide count.
            Some(w) if w.written < burst => false,
            Some(w) => {
                w.counted += 1;
                windows.kinds[kind] = Some(sandbox_window);
                return (false, due);
            }
            None if under_cap && burst > 0 => {
                windows.destinations.insert(key, Window { start_ms: now_ms, written: 1, counted: 0 });
                true
            }
            // Not remembered: past the cap, nothing is held per name.
            None => false,
        };
        if written {
            sandbox_window.written += 1;
        } else {
            sandbox_window.counted += 1;
        }
        windows.kinds[kind] = Some(sandbox_window);
        (written, due)
    }

    /// The summaries of every window that has ended by `now_ms` (ended windows are
    /// forgotten, so the throttle holds only current windows).
    pub fn flush(&mut self, now_ms: i64) -> Vec<Summary<S>> {
        let window_ms = self.window_ms;
        let mut due = Vec::new();
        self.sandboxes.retain(|sandbox, windows| {
            for (kind, allowed) in [false, true].into_iter().enumerate() {
                if let Some(w) = windows.kinds[kind].filter(|w| w.ended(now_ms, window_ms)) {
                    push_wide(&mut due, sandbox, allowed, w);
                    windows.kinds[kind] = None;
                }
            }
            sweep(sandbox, &mut windows.destinations, |w| w.ended(now_ms, window_ms), &mut due);
            windows.kinds.iter().any(Option::is_some) || !windows.destinations.is_empty()
        });
        due.sort_by_key(|s| s.since_ms);
        due
    }

    /// Every summary still open, whatever its window (at shutdown).
    pub fn drain(&mut self) -> Vec<Summary<S>> {
        self.flush(i64::MAX)
    }

    /// Every summary still open of `sandbox` (when it ends), its windows forgotten.
    pub fn drain_sandbox(&mut self, sandbox: &S) -> Vec<Summary<S>> {
        let mut due = Vec::new();
        if let Some(mut windows) = self.sandboxes.remove(sandbox) {
            for (kind, allowed) in [false, true].into_iter().enumerate() {
                if let Some(w) = windows.kinds[kind] {
                    push_wide(&mut due, sandbox, allowed, w);
                }
            }
            sweep(sandbox, &mut windows.destinations, |_| true, &mut due);
        }
        due
    }

    /// How many destinations the throttle remembers, over every sandbox: at most twice
    /// `sandbox_cap` of each decision per sandbox, whatever names were asked for.
    pub fn held(&self) -> usize {
        self.sandboxes.values().map(|w| w.destinations.len()).sum()
    }
}

/// Removes the destinations whose windows are `done`, their summaries (if they counted
/// any) pushed onto `due`.
fn sweep<S: Clone>(
    sandbox: &S,
    destinations: &mut std::collections::HashMap<(String, u16, bool), Window>,
    done: impl Fn(&Window) -> bool,
    due: &mut Vec<Summary<S>>,
) {
    destinations.retain(|(host, port, allowed), w| {
        if !done(w) {
            return true;
        }
        push_one(due, sandbox, (host.clone(), *port, *allowed), *w);
        false
    });
}

/// A destination's summary, when its window counted any decision.
fn push_one<S: Clone>(due: &mut Vec<Summary<S>>, sandbox: &S, key: (String, u16, bool), w: Window) {
    if w.counted > 0 {
        let (host, port, allowed) = key;
        let destination = Destination { sandbox: sandbox.clone(), host, port, allowed };
        due.push(Summary { destination, count: w.counted, since_ms: w.start_ms });
    }
}

/// A sandbox-wide summary (host `*`), when its window counted any decision.
fn push_wide<S: Clone>(due: &mut Vec<Summary<S>>, sandbox: &S, allowed: bool, w: Window) {
    if w.counted > 0 {
        let destination = Destination { sandbox: sandbox.clone(), host: "*".to_owned(), port: 0, allowed };
        due.push(Summary { destination, count: w.counted, since_ms: w.start_ms });
    }
}

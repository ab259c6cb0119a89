//! Org policy: what one org may do on the lane, and the rules that read it.
//!
//! Per org: the lane per key kind; quotas (live sandboxes, concurrent commands per org and
//! per sandbox, workspace bytes per sandbox); the idle timeout (an idle sandbox is
//! suspended) and the maximum lifetime (an older one is deprovisioned); the warm pool size
//! for ephemeral sandboxes; the egress allowlist. Every value is validated here, and every
//! error names the field it is about (`max_sandboxes: …`).
//!
//! The text forms the CLI takes are parsed here too: SIZE (`64MiB`, `1GiB`, `4096`), DUR
//! (`90s`, `15m`, `500ms`), a count (`10`), a switch (`on`/`off`), an egress rule
//! (`api.example.com:443`, `*.pypi.org`), and the words `unlimited` (a quota) and `off` (a
//! timeout) for "none". A change is a [`PolicyPatch`]: the fields it names, nothing else,
//! so a flag not given keeps its value.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::key::SandboxKind;
use crate::time::Timestamp;

/// The most any count quota may be.
pub const MAX_COUNT: u32 = 1_000_000;
/// The smallest workspace quota: 1 MiB.
pub const MIN_WORKSPACE_BYTES: u64 = 1 << 20;
/// The largest workspace quota: 16 TiB.
pub const MAX_WORKSPACE_BYTES: u64 = 16 << 40;
/// The largest `snapshot_bytes` (1 PiB).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 50;
/// The shortest idle timeout or lifetime: one second.
pub const MIN_DURATION_MS: u64 = 1_000;
/// The longest idle timeout: 30 days.
pub const MAX_IDLE_TIMEOUT_MS: u64 = 30 * DAY_MS;
/// The longest lifetime: 366 days.
pub const MAX_LIFETIME_MS: u64 = 366 * DAY_MS;
/// The largest warm pool of one org.
pub const MAX_WARM_POOL: u32 = 1_000;
/// The most egress rules of one org.
pub const MAX_EGRESS_RULES: usize = 256;

const DAY_MS: u64 = 86_400_000;

/// The execution id of a warm sandbox's key until a claim adopts it (ids starting
/// `sandlane:` are the server's own).
pub const WARM_EXECUTION_ID: &str = "sandlane:warm";

/// The key a warm sandbox of `org` is provisioned under: its org's pool. No record holds
/// it; a claim adopts the sandbox under the claiming key.
pub fn warm_key(org: &crate::OrgId) -> crate::SandboxKey {
    crate::SandboxKey::Workflow {
        org: org.clone(),
        execution_id: crate::ExecutionId::parse(WARM_EXECUTION_ID)
            .unwrap_or_else(|_| unreachable!("the warm execution id is a valid id")),
    }
}

/// Whether `org`/`kind`/`key` (as a driver records them) is the warm pool's key: a sandbox
/// provisioned under it may be taken over by any key of the same org (its adoption).
pub fn is_warm_key(kind: SandboxKind, key: &str) -> bool {
    kind == SandboxKind::Workflow && key == WARM_EXECUTION_ID
}

/// A field of the policy, as the JSON and the errors name it (the CLI flag is the same
/// name with dashes: `max_sandboxes` is `--max-sandboxes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyField {
    /// `lane_session`.
    LaneSession,
    /// `lane_workflow`.
    LaneWorkflow,
    /// `max_sandboxes`.
    MaxSandboxes,
    /// `max_commands`.
    MaxCommands,
    /// `max_commands_per_sandbox`.
    MaxCommandsPerSandbox,
    /// `workspace_bytes`.
    WorkspaceBytes,
    /// `idle_timeout`.
    IdleTimeout,
    /// `max_lifetime`.
    MaxLifetime,
    /// `warm_pool`.
    WarmPool,
    /// `egress_allow`.
    EgressAllow,
    /// `max_snapshots`.
    MaxSnapshots,
    /// `snapshot_bytes`.
    SnapshotBytes,
}

impl PolicyField {
    /// Every field.
    pub const ALL: [Self; 12] = [
        Self::LaneSession,
        Self::LaneWorkflow,
        Self::MaxSandboxes,
        Self::MaxCommands,
        Self::MaxCommandsPerSandbox,
        Self::WorkspaceBytes,
        Self::IdleTimeout,
        Self::MaxLifetime,
        Self::WarmPool,
        Self::EgressAllow,
        Self::MaxSnapshots,
        Self::SnapshotBytes,
    ];

    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LaneSession => "lane_session",
            Self::LaneWorkflow => "lane_workflow",
            Self::MaxSandboxes => "max_sandboxes",
            Self::MaxCommands => "max_commands",
            Self::MaxCommandsPerSandbox => "max_commands_per_sandbox",
            Self::WorkspaceBytes => "workspace_bytes",
            Self::IdleTimeout => "idle_timeout",
            Self::MaxLifetime => "max_lifetime",
            Self::WarmPool => "warm_pool",
            Self::EgressAllow => "egress_allow",
            Self::MaxSnapshots => "max_snapshots",
            Self::SnapshotBytes => "snapshot_bytes",
        }
    }
}

impl fmt::Display for PolicyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused policy value: the field, the input as given, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason} (got {input:?})")]
pub struct PolicyError {
    /// The field the value was for.
    pub field: PolicyField,
    /// The rejected input (its first 64 characters).
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl PolicyError {
    fn new(field: PolicyField, input: impl fmt::Display, reason: impl Into<String>) -> Self {
        let input = input.to_string();
        let input = if input.chars().count() > 64 {
            input.chars().take(64).collect::<String>() + "…"
        } else {
            input
        };
        Self { field, input, reason: reason.into() }
    }
}

/// One egress rule: what processes in the org's sandboxes may reach through the egress
/// proxy ([`crate::egress`] applies the list).
///
/// - A host: `api.example.com`, or `*.example.com` for every name under it.
/// - An address range, `10.1.0.0/16` or `fd00::/8`: its addresses are named explicitly,
///   so the proxy may connect into it although the range is refused by default (a name
///   another rule allows may resolve there), and an address literal in it is a
///   destination the list covers.
///
/// Either may end in `:PORT` (any port otherwise), then `@user` or `@service`: the rule
/// holds only for sandboxes whose token is for a caller of that class (any class
/// otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EgressRule {
    wildcard: bool,
    host: String,
    port: Option<u16>,
    range: Option<crate::egress::AddressRange>,
    class: Option<crate::caller::CallerClass>,
}

impl EgressRule {
    /// Parses `TARGET[:PORT][@CLASS]`: TARGET is a DNS name (labels of `a-z 0-9 -`, 1 to 63
    /// characters, not starting or ending with `-`, the last not all digits; at most 253
    /// characters; upper case is lowered), `*.` and such a name of at least two labels, or
    /// an address range `ADDRESS/PREFIX`; PORT is 1 to 65535; CLASS is `user` or `service`.
    ///
    /// A rule that could never match is refused, naming the form that works: an address
    /// written alone (`127.0.0.1:8080`, `::1`, `[fd00::1]:443`) rather than as a range
    /// (`127.0.0.1/32:8080`), and a name that only an address could be (`10.1`, `*.0.1`).
    ///
    /// # Errors
    /// [`PolicyError`] on [`PolicyField::EgressAllow`], naming the input.
    pub fn parse(input: &str) -> Result<Self, PolicyError> {
        Self::parse_as(input, false)
    }

    /// [`Self::parse`]; `stored`: a rule read back from the store, where a host that is an
    /// IPv4 address (or looks like one) is still read as the host rule an earlier version
    /// stored, so an org's stored policy stays readable (such a rule is refused when set).
    fn parse_as(input: &str, stored: bool) -> Result<Self, PolicyError> {
        let bad = |reason: &str| PolicyError::new(PolicyField::EgressAllow, input, reason);
        let (rest, class) = match input.rsplit_once('@') {
            Some((rest, class)) => match class {
                "user" => (rest, Some(crate::caller::CallerClass::User)),
                "service" => (rest, Some(crate::caller::CallerClass::Service)),
                _ => return Err(bad("the class after @ is user or service")),
            },
            None => (input, None),
        };
        let port_of = |port: &str| {
            parse_digits(port)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("the port must be a number from 1 to 65535"))
        };
        if let Some((address, after)) = rest.split_once('/') {
            // A range: the prefix's digits, then perhaps `:PORT` (an IPv6 address has its
            // colons before the slash).
            let (prefix, port) = match after.split_once(':') {
                Some((prefix, port)) => (prefix, Some(port_of(port)?)),
                None => (after, None),
            };
            let range = crate::egress::AddressRange::parse(&format!("{address}/{prefix}"))
                .map_err(|e| bad(&format!("not an address range: {}", e.reason)))?;
            return Ok(Self { wildcard: false, host: range.to_string(), port, range: Some(range), class });
        }
        // An address alone is a host no request names as a rule would (the proxy compares
        // an address literal with the ranges): the range of that one address works.
        let as_range = |address: IpAddr, port: Option<&str>| {
            let width = if address.is_ipv4() { 32 } else { 128 };
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let class = class.map(|c| format!("@{}", c.as_str())).unwrap_or_default();
            bad(&format!(
                "an address is written as a range ADDRESS/PREFIX, or it never matches: {address}/{width}{port}{class}"
            ))
        };
        if let Ok(v6) = rest.parse::<std::net::Ipv6Addr>() {
            return Err(as_range(IpAddr::V6(v6), None));
        }
        if let Some((inside, after)) = rest.strip_prefix('[').and_then(|r| r.split_once(']'))
            && let Ok(v6) = inside.parse::<std::net::Ipv6Addr>()
        {
            let port = match after.strip_prefix(':') {
                Some(port) => Some(port_of(port)?.to_string()),
                None if after.is_empty() => None,
                None => return Err(bad("an address in brackets is followed by :PORT or nothing")),
            };
            return Err(as_range(IpAddr::V6(v6), port.as_deref()));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port_of(port)?)),
            None => (rest, None),
        };
        if !stored {
            if let Ok(v4) = host.parse::<std::net::Ipv4Addr>() {
                return Err(as_range(IpAddr::V4(v4), port.map(|p| p.to_string()).as_deref()));
            }
            let last = host.rsplit('.').next().unwrap_or(host);
            if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(
                    "a host name's last label is not all digits (a client reads such a name as an \
                     address); an address is written as a range ADDRESS/PREFIX, such as 127.0.0.1/32:8080",
                ));
            }
        }
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let name = name.to_ascii_lowercase();
        if name.is_empty() || name.len() > 253 {
            return Err(bad("a host name is 1 to 253 characters"));
        }
        for label in name.split('.') {
            let ok = (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(bad(
                    "each label of a host name is 1 to 63 of a-z 0-9 -, not starting or ending with -",
                ));
            }
        }
        if wildcard && !name.contains('.') {
            return Err(bad("a wildcard covers a name of at least two labels (*.example.com, not *.com)"));
        }
        Ok(Self { wildcard, host: name, port, range: None, class })
    }

    /// Whether the rule covers every name under its host (`*.example.com`).
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }

    /// The host name (without the `*.`), lower case; for a range, the range as text.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, when the rule names one (any port otherwise).
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The address range, when the rule names one rather than a host.
    pub fn range(&self) -> Option<crate::egress::AddressRange> {
        self.range
    }

    /// The caller class the rule holds for, when it names one (every class otherwise).
    pub fn class(&self) -> Option<crate::caller::CallerClass> {
        self.class
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        if let Some(class) = self.class {
            write!(f, "@{}", class.as_str())?;
        }
        Ok(())
    }
}

impl Serialize for EgressRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EgressRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse_as(&String::deserialize(d)?, true).map_err(serde::de::Error::custom)
    }
}

/// An org's policy. Every value is within its bounds: it is built only from
/// [`OrgPolicy::builtin`] and validated [`PolicyPatch`]es (deserialisation goes through
/// the same checks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrgPolicy {
    lane_session: bool,
    lane_workflow: bool,
    max_sandboxes: Option<u32>,
    max_commands: Option<u32>,
    max_commands_per_sandbox: Option<u32>,
    workspace_bytes: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_lifetime_ms: Option<u64>,
    warm_pool: u32,
    egress_allow: Vec<EgressRule>,
    max_snapshots: Option<u32>,
    snapshot_bytes: Option<u64>,
}

impl OrgPolicy {
    /// The built-in policy, before the config file's defaults: both lanes on, no count
    /// quota, 1 GiB of workspace per sandbox, no idle timeout, no lifetime, no warm pool,
    /// no egress, no snapshot quota.
    pub fn builtin() -> Self {
        Self {
            lane_session: true,
            lane_workflow: true,
            max_sandboxes: None,
            max_commands: None,
            max_commands_per_sandbox: None,
            workspace_bytes: Some(1 << 30),
            idle_timeout_ms: None,
            max_lifetime_ms: None,
            warm_pool: 0,
            egress_allow: Vec::new(),
            max_snapshots: None,
            snapshot_bytes: None,
        }
    }

    /// This policy with the fields `patch` names changed, checked.
    ///
    /// # Errors
    /// [`PolicyError`] naming the first field whose value is out of bounds.
    pub fn apply(&self, patch: &PolicyPatch) -> Result<Self, PolicyError> {
        let mut next = self.clone();
        if let Some(v) = patch.lane_session {
            next.lane_session = v;
        }
        if let Some(v) = patch.lane_workflow {
            next.lane_workflow = v;
        }
        if let Some(v) = patch.max_sandboxes {
            next.max_sandboxes = v;
        }
        if let Some(v) = patch.max_commands {
            next.max_commands = v;
        }
        if let Some(v) = patch.max_commands_per_sandbox {
            next.max_commands_per_sandbox = v;
        }
        if let Some(v) = patch.workspace_bytes {
            next.workspace_bytes = v;
        }
        if let Some(v) = patch.idle_timeout_ms {
            next.idle_timeout_ms = v;
        }
        if let Some(v) = patch.max_lifetime_ms {
            next.max_lifetime_ms = v;
        }
        if let Some(v) = patch.warm_pool {
            next.warm_pool = v;
        }
        if let Some(v) = &patch.egress_allow {
            next.egress_allow.clone_from(v);
        }
        if let Some(v) = patch.max_snapshots {
            next.max_snapshots = v;
        }
        if let Some(v) = patch.snapshot_bytes {
            next.snapshot_bytes = v;
        }
        next.check()?;
        Ok(next)
    }

    /// Checks every bound (the one place they are written down).
    fn check(&self) -> Result<(), PolicyError> {
        for (field, value) in [
            (PolicyField::MaxSandboxes, self.max_sandboxes),
            (PolicyField::MaxCommands, self.max_commands),
            (PolicyField::MaxCommandsPerSandbox, self.max_commands_per_sandbox),
            (PolicyField::MaxSnapshots, self.max_snapshots),
        ] {
            if let Some(n) = value
                && !(1..=MAX_COUNT).contains(&n)
            {
                return Err(PolicyError::new(
                    field,
                    n,
                    format!("must be from 1 to {MAX_COUNT}, or unlimited"),
                ));
            }
        }
        if let Some(b) = self.workspace_bytes
            && !(MIN_WORKSPACE_BYTES..=MAX_WORKSPACE_BYTES).contains(&b)
        {
            return Err(PolicyError::new(
                PolicyField::WorkspaceBytes,
                b,
                "must be from 1MiB to 16TiB, or unlimited",
            ));
        }
        if let Some(b) = self.snapshot_bytes
            && !(MIN_WORKSPACE_BYTES..=MAX_SNAPSHOT_BYTES).contains(&b)
        {
            return Err(PolicyError::new(
                PolicyField::SnapshotBytes,
                b,
                "must be from 1MiB to 1PiB, or unlimited",
            ));
        }
        for (field, value, max, max_text) in [
            (PolicyField::IdleTimeout, self.idle_timeout_ms, MAX_IDLE_TIMEOUT_MS, "30d"),
            (PolicyField::MaxLifetime, self.max_lifetime_ms, MAX_LIFETIME_MS, "366d"),
        ] {
            if let Some(ms) = value
                && !(MIN_DURATION_MS..=max).contains(&ms)
            {
                return Err(PolicyError::new(
                    field,
                    format_duration_ms(ms),
                    format!("must be from 1s to {max_text}, or off"),
                ));
            }
        }
        if self.warm_pool > MAX_WARM_POOL {
            return Err(PolicyError::new(
                PolicyField::WarmPool,
                self.warm_pool,
                format!("must be from 0 to {MAX_WARM_POOL}"),
            ));
        }
        if self.egress_allow.len() > MAX_EGRESS_RULES {
            return Err(PolicyError::new(
                PolicyField::EgressAllow,
                format!("{} rules", self.egress_allow.len()),
                format!("at most {MAX_EGRESS_RULES} rules"),
            ));
        }
        Ok(())
    }

    /// Whether sandboxes of `kind` are provisioned for the org.
    pub fn lane(&self, kind: SandboxKind) -> bool {
        match kind {
            SandboxKind::Session => self.lane_session,
            SandboxKind::Workflow => self.lane_workflow,
        }
    }

    /// The most sandboxes the org may have running (provisioning or ready) at once.
    pub fn max_sandboxes(&self) -> Option<u32> {
        self.max_sandboxes
    }

    /// The most commands the org may run at once, over all its sandboxes.
    pub fn max_commands(&self) -> Option<u32> {
        self.max_commands
    }

    /// The most commands one sandbox of the org may run at once.
    pub fn max_commands_per_sandbox(&self) -> Option<u32> {
        self.max_commands_per_sandbox
    }

    /// The most bytes a sandbox may write into its workspace (`None`: no quota).
    pub fn workspace_bytes(&self) -> Option<u64> {
        self.workspace_bytes
    }

    /// How long a sandbox may be idle before it is suspended, in ms (`None`: never).
    pub fn idle_timeout_ms(&self) -> Option<u64> {
        self.idle_timeout_ms
    }

    /// How long a sandbox may live before it is deprovisioned, in ms (`None`: forever).
    pub fn max_lifetime_ms(&self) -> Option<u64> {
        self.max_lifetime_ms
    }

    /// How many ephemeral sandboxes to keep provisioned ahead for the org.
    pub fn warm_pool(&self) -> u32 {
        self.warm_pool
    }

    /// The most snapshots the org may hold (`None`: no quota).
    pub fn max_snapshots(&self) -> Option<u32> {
        self.max_snapshots
    }

    /// The most bytes the org's snapshots may hold together (`None`: no quota).
    pub fn snapshot_bytes(&self) -> Option<u64> {
        self.snapshot_bytes
    }

    /// The hosts processes in the org's sandboxes may reach through the egress proxy.
    pub fn egress_allow(&self) -> &[EgressRule] {
        &self.egress_allow
    }

    /// Whether a sandbox last active at `last_active` is idle past the timeout at `now`.
    pub fn is_idle(&self, last_active: Timestamp, now: Timestamp) -> bool {
        self.idle_timeout_ms.is_some_and(|ms| now >= last_active.plus_millis(clamp_i64(ms)))
    }

    /// Whether a sandbox created at `created_at` has outlived the maximum lifetime at
    /// `now`.
    pub fn outlived(&self, created_at: Timestamp, now: Timestamp) -> bool {
        self.max_lifetime_ms.is_some_and(|ms| now >= created_at.plus_millis(clamp_i64(ms)))
    }
}

impl Default for OrgPolicy {
    fn default() -> Self {
        Self::builtin()
    }
}

impl<'de> Deserialize<'de> for OrgPolicy {
    /// Through the same checks as [`OrgPolicy::apply`]: every field must be present.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            lane_session: bool,
            lane_workflow: bool,
            max_sandboxes: Option<u32>,
            max_commands: Option<u32>,
            max_commands_per_sandbox: Option<u32>,
            workspace_bytes: Option<u64>,
            idle_timeout_ms: Option<u64>,
            max_lifetime_ms: Option<u64>,
            warm_pool: u32,
            egress_allow: Vec<EgressRule>,
            // Policies written before snapshots have neither.
            #[serde(default)]
            max_snapshots: Option<u32>,
            #[serde(default)]
            snapshot_bytes: Option<u64>,
        }
        let r = Raw::deserialize(d)?;
        let policy = OrgPolicy {
            lane_session: r.lane_session,
            lane_workflow: r.lane_workflow,
            max_sandboxes: r.max_sandboxes,
            max_commands: r.max_commands,
            max_commands_per_sandbox: r.max_commands_per_sandbox,
            workspace_bytes: r.workspace_bytes,
            idle_timeout_ms: r.idle_timeout_ms,
            max_lifetime_ms: r.max_lifetime_ms,
            warm_pool: r.warm_pool,
            egress_allow: r.egress_allow,
            max_snapshots: r.max_snapshots,
            snapshot_bytes: r.snapshot_bytes,
        };
        policy.check().map_err(serde::de::Error::custom)?;
        Ok(policy)
    }
}

/// A change to a policy: the fields to set, each already parsed (a `Some(None)` sets
/// `unlimited` or `off`). Fields left `None` keep their value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyPatch {
    /// `lane_session`.
    pub lane_session: Option<bool>,
    /// `lane_workflow`.
    pub lane_workflow: Option<bool>,
    /// `max_sandboxes`.
    pub max_sandboxes: Option<Option<u32>>,
    /// `max_commands`.
    pub max_commands: Option<Option<u32>>,
    /// `max_commands_per_sandbox`.
    pub max_commands_per_sandbox: Option<Option<u32>>,
    /// `workspace_bytes`.
    pub workspace_bytes: Option<Option<u64>>,
    /// `idle_timeout`, in ms.
    pub idle_timeout_ms: Option<Option<u64>>,
    /// `max_lifetime`, in ms.
    pub max_lifetime_ms: Option<Option<u64>>,
    /// `warm_pool`.
    pub warm_pool: Option<u32>,
    /// `egress_allow`: the whole new list.
    pub egress_allow: Option<Vec<EgressRule>>,
    /// `max_snapshots`.
    pub max_snapshots: Option<Option<u32>>,
    /// `snapshot_bytes`.
    pub snapshot_bytes: Option<Option<u64>>,
}

impl PolicyPatch {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// This patch with `later`'s fields laid over it (a field `later` names takes its
    /// value).
    #[must_use]
    pub fn merged(&self, later: &PolicyPatch) -> Self {
        Self {
            lane_session: later.lane_session.or(self.lane_session),
            lane_workflow: later.lane_workflow.or(self.lane_workflow),
            max_sandboxes: later.max_sandboxes.or(self.max_sandboxes),
            max_commands: later.max_commands.or(self.max_commands),
            max_commands_per_sandbox: later.max_commands_per_sandbox.or(self.max_commands_per_sandbox),
            workspace_bytes: later.workspace_bytes.or(self.workspace_bytes),
            idle_timeout_ms: later.idle_timeout_ms.or(self.idle_timeout_ms),
            max_lifetime_ms: later.max_lifetime_ms.or(self.max_lifetime_ms),
            warm_pool: later.warm_pool.or(self.warm_pool),
            egress_allow: later.egress_allow.clone().or_else(|| self.egress_allow.clone()),
            max_snapshots: later.max_snapshots.or(self.max_snapshots),
            snapshot_bytes: later.snapshot_bytes.or(self.snapshot_bytes),
        }
    }

    /// The fields the patch names.
    pub fn fields(&self) -> Vec<PolicyField> {
        let named = [
            self.lane_session.is_some(),
            self.lane_workflow.is_some(),
            self.max_sandboxes.is_some(),
            self.max_commands.is_some(),
            self.max_commands_per_sandbox.is_some(),
            self.workspace_bytes.is_some(),
            self.idle_timeout_ms.is_some(),
            self.max_lifetime_ms.is_some(),
            self.warm_pool.is_some(),
            self.egress_allow.is_some(),
            self.max_snapshots.is_some(),
            self.snapshot_bytes.is_some(),
        ];
        PolicyField::ALL.into_iter().zip(named).filter(|(_, n)| *n).map(|(f, _)| f).collect()
    }
}

/// The JSON form of a patch: an object with the fields it names, `null` for `unlimited`
/// or `off` (how the store keeps an org's changes).
impl Serialize for PolicyPatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        if let Some(v) = self.lane_session {
            map.serialize_entry("lane_session", &v)?;
        }
        if let Some(v) = self.lane_workflow {
            map.serialize_entry("lane_workflow", &v)?;
        }
        if let Some(v) = self.max_sandboxes {
            map.serialize_entry("max_sandboxes", &v)?;
        }
        if let Some(v) = self.max_commands {
            map.serialize_entry("max_commands", &v)?;
        }
        if let Some(v) = self.max_commands_per_sandbox {
            map.serialize_entry("max_commands_per_sandbox", &v)?;
        }
        if let Some(v) = self.workspace_bytes {
            map.serialize_entry("workspace_bytes", &v)?;
        }
        if let Some(v) = self.idle_timeout_ms {
            map.serialize_entry("idle_timeout_ms", &v)?;
        }
        if let Some(v) = self.max_lifetime_ms {
            map.serialize_entry("max_lifetime_ms", &v)?;
        }
        if let Some(v) = self.warm_pool {
            map.serialize_entry("warm_pool", &v)?;
        }
        if let Some(v) = &self.egress_allow {
            map.serialize_entry("egress_allow", v)?;
        }
        if let Some(v) = self.max_snapshots {
            map.serialize_entry("max_snapshots", &v)?;
        }
        if let Some(v) = self.snapshot_bytes {
            map.serialize_entry("snapshot_bytes", &v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PolicyPatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A present field, `null` included (as `Some(None)`).
        fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
            d: D,
        ) -> Result<Option<T>, D::Error> {
            T::deserialize(d).map(Some)
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            lane_session: Option<bool>,
            #[serde(default)]
            lane_workflow: Option<bool>,
            #[serde(default, deserialize_with = "present")]
            max_sandboxes: Option<Option<u32>>,
            #[serde(default, deserialize_with = "present")]
            max_commands: Option<Option<u32>>,
            #[serde(default, deserialize_with = "present")]
            max_commands_per_sandbox: Option<Option<u32>>,
            #[serde(default, deserialize_with = "present")]
            workspace_bytes: Option<Option<u64>>,
            #[serde(default, deserialize_with = "present")]
            idle_timeout_ms: Option<Option<u64>>,
            #[serde(default, deserialize_with = "present")]
            max_lifetime_ms: Option<Option<u64>>,
            #[serde(default)]
            warm_pool: Option<u32>,
            #[serde(default)]
            egress_allow: Option<Vec<EgressRule>>,
            #[serde(default, deserialize_with = "present")]
            max_snapshots: Option<Option<u32>>,
            #[serde(default, deserialize_with = "present")]
            snapshot_bytes: Option<Option<u64>>,
        }
        let r = Raw::deserialize(d)?;
        Ok(Self {
            lane_session: r.lane_session,
            lane_workflow: r.lane_workflow,
            max_sandboxes: r.max_sandboxes,
            max_commands: r.max_commands,
            max_commands_per_sandbox: r.max_commands_per_sandbox,
            workspace_bytes: r.workspace_bytes,
            idle_timeout_ms: r.idle_timeout_ms,
            max_lifetime_ms: r.max_lifetime_ms,
            warm_pool: r.warm_pool,
            egress_allow: r.egress_allow,
            max_snapshots: r.max_snapshots,
            snapshot_bytes: r.snapshot_bytes,
        })
    }
}

/// A stored policy: the org's, with its version (1 for the first stored change, one more
/// for each change after) and when it was last changed. An org never changed has the
/// defaults at version 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    /// The policy.
    pub policy: OrgPolicy,
    /// Its version.
    pub version: i64,
    /// When it was last changed (`None` for the defaults).
    pub updated_at: Option<Timestamp>,
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The digits of `text` as a number: ASCII digits only, no sign, no spaces; `None` on
/// anything else or overflow.
fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The units SIZE takes, with their factors. A bare number is bytes.
pub const SIZE_UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

/// The units DUR takes, with their length in ms. A unit is required.
pub const DURATION_UNITS: [(&str, u64); 5] =
    [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", DAY_MS)];

/// Parses SIZE: digits, then optionally one of [`SIZE_UNITS`] (`64MiB`, `1GB`, `4096`);
/// or `unlimited` (`Ok(None)`). The bounds are [`OrgPolicy::apply`]'s.
///
/// # Errors
/// [`PolicyError`] on `field`, naming the input.
pub fn parse_size(field: PolicyField, input: &str) -> Result<Option<u64>, PolicyError> {
    if input == "unlimited" {
        return Ok(None);
    }
    let split = input.find(|c: char| !c.is_ascii_digit()).unwrap_or(input.len());
    let (digits, unit) = input.split_at(split);
    let bad = || {
        PolicyError::new(
            field,
            input,
            "a size is a whole number with an optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB \
             (64MiB), or unlimited",
        )
    };
    let number = parse_digits(digits).ok_or_else(bad)?;
    let factor = if unit.is_empty() {
        1
    } else {
        SIZE_UNITS.iter().find(|(u, _)| *u == unit).map(|(_, f)| *f).ok_or_else(bad)?
    };
    number.checked_mul(factor).map(Some).ok_or_else(|| PolicyError::new(field, input, "too large"))
}

/// Parses DUR: digits and one of [`DURATION_UNITS`] (`90s`, `15m`, `500ms`), in ms; or
/// `off` (`Ok(None)`).
///
/// # Errors
/// [`PolicyError`] on `field`, naming the input.
pub fn parse_duration(field: PolicyField, input: &str) -> Result<Option<u64>, PolicyError> {
    if input == "off" {
        return Ok(None);
    }
    let split = input.find(|c: char| !c.is_ascii_digit()).unwrap_or(input.len());
    let (digits, unit) = input.split_at(split);
    let bad = || {
        PolicyError::new(
            field,
            input,
            "a duration is a whole number and a unit ms, s, m, h or d (90s, 15m), or off",
        )
    };
    let number = parse_digits(digits).ok_or_else(bad)?;
    let factor = DURATION_UNITS.iter().find(|(u, _)| *u == unit).map(|(_, f)| *f).ok_or_else(bad)?;
    number.checked_mul(factor).map(Some).ok_or_else(|| PolicyError::new(field, input, "too long"))
}

/// Parses a count quota: digits, or `unlimited` (`Ok(None)`).
///
/// # Errors
/// [`PolicyError`] on `field`, naming the input.
pub fn parse_limit(field: PolicyField, input: &str) -> Result<Option<u32>, PolicyError> {
    if input == "unlimited" {
        return Ok(None);
    }
    parse_count(field, input).map(Some)
}

/// Parses a plain count (digits).
///
/// # Errors
/// [`PolicyError`] on `field`, naming the input.
pub fn parse_count(field: PolicyField, input: &str) -> Result<u32, PolicyError> {
    parse_digits(input)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| PolicyError::new(field, input, "must be a whole number"))
}

/// Parses a switch: `on` or `off`.
///
/// # Errors
/// [`PolicyError`] on `field`, naming the input.
pub fn parse_switch(field: PolicyField, input: &str) -> Result<bool, PolicyError> {
    match input {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(PolicyError::new(field, input, "must be on or off")),
    }
}

/// Parses the egress list of a change: each rule as [`EgressRule::parse`], or the single
/// word `none` for an empty list.
///
/// # Errors
/// [`PolicyError`] on [`PolicyField::EgressAllow`], naming the first bad rule.
pub fn parse_egress(inputs: &[String]) -> Result<Vec<EgressRule>, PolicyError> {
    if inputs.len() == 1 && inputs[0] == "none" {
        return Ok(Vec::new());
    }
    let mut rules: Vec<EgressRule> = inputs.iter().map(|i| EgressRule::parse(i)).collect::<Result<_, _>>()?;
    rules.sort();
    rules.dedup();
    Ok(rules)
}

/// A duration in ms as DUR, in the largest unit that divides it (`90000` → `90s`).
pub fn format_duration_ms(ms: u64) -> String {
    let (unit, factor) = DURATION_UNITS
        .iter()
        .rev()
        .find(|(_, f)| ms.is_multiple_of(*f) && ms >= *f)
        .copied()
        .unwrap_or(("ms", 1));
    format!("{}{unit}", ms / factor)
}

/// A byte count as SIZE, in the largest binary unit that divides it (`67108864` → `64MiB`).
pub fn format_size(bytes: u64) -> String {
    let (unit, factor) = [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find(|(_, f)| bytes.is_multiple_of(*f) && bytes >= *f)
        .unwrap_or(("B", 1));
    format!("{}{unit}", bytes / factor)
}

#[cfg(test)]
mod tests;

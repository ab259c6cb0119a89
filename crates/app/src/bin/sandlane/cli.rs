//! The command line: `serve`, `caller add|list|revoke`, `keys rotate`, `audit verify`, and
//! the hidden `supervise` the drivers start inside each sandbox.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use domain::{CallerClass, IdentityId, OrgId};

/// sandlane: the sandbox lane of an agent-execution server.
#[derive(Debug, Parser)]
#[command(name = "sandlane", version, about, propagate_version = true)]
pub struct Cli {
    /// A TOML config file (settings: defaults, then this file, then SANDLANE_* variables).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (HTTP API, audit sealer, credential refresher, reconciler).
    Serve,
    /// Manage caller keys.
    #[command(subcommand)]
    Caller(CallerCommand),
    /// Manage the credential signing keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Work with the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Run as a sandbox's supervisor (PID 1 inside it; started by the drivers).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
}

/// `sandlane supervise` (hidden): what the drivers pass.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// An inherited listening unix socket.
    #[arg(long)]
    pub listen_fd: Option<i32>,
    /// A path to listen on instead.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// `uid:gid` the commands run as (the supervisor then needs CAP_SETUID/CAP_SETGID).
    #[arg(long, value_parser = parse_user)]
    pub user: Option<(u32, u32)>,
    /// Install the sandbox's seccomp filter before serving.
    #[arg(long)]
    pub seccomp: bool,
}

fn parse_user(s: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = s.split_once(':').ok_or_else(|| format!("expected uid:gid, got {s:?}"))?;
    Ok((
        uid.parse().map_err(|e| format!("uid {uid:?}: {e}"))?,
        gid.parse().map_err(|e| format!("gid {gid:?}: {e}"))?,
    ))
}

/// `sandlane caller …`.
#[derive(Debug, Subcommand)]
pub enum CallerCommand {
    /// Add a caller; prints its new key alone on one line (the only time it is shown).
    Add(AddCaller),
    /// List callers (never their keys).
    List,
    /// Revoke a caller: its key stops authenticating and every token minted for it stops
    /// verifying, at once on every replica (its sandboxes stay).
    Revoke {
        /// The caller's identity id.
        #[arg(long, value_parser = parse_identity)]
        id: IdentityId,
    },
}

/// `sandlane caller add`.
#[derive(Debug, Args)]
pub struct AddCaller {
    /// The caller's identity id (1-128 of A-Z a-z 0-9 . _ : @ -).
    #[arg(long, value_parser = parse_identity)]
    pub id: IdentityId,
    /// `user` or `service` (`internal` is reserved for the server itself).
    #[arg(long, value_parser = parse_class)]
    pub class: CallerClass,
    /// An org the caller may act in; repeat for several.
    #[arg(long = "org", required = true, value_parser = parse_org)]
    pub orgs: Vec<OrgId>,
    /// A display name.
    #[arg(long)]
    pub name: Option<String>,
}

/// `sandlane keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a new signing key current; the previous one verifies until its tokens expire.
    Rotate,
}

/// `sandlane audit …`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every hash, link and signature: exit 0 when intact, 1 naming the first
    /// bad record.
    Verify,
}

fn parse_identity(s: &str) -> Result<IdentityId, String> {
    IdentityId::parse(s).map_err(|e| e.to_string())
}

fn parse_org(s: &str) -> Result<OrgId, String> {
    OrgId::parse(s).map_err(|e| e.to_string())
}

fn parse_class(s: &str) -> Result<CallerClass, String> {
    CallerClass::parse_wire(s).map_err(|e| e.to_string())
}

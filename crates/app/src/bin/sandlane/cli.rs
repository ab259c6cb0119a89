//! The command line: `serve`, `caller add|list|revoke`, `org set|show`, `secret
//! set|list|delete|rotate-key`, `keys rotate`,
//! `audit verify`, `config show`, `sandbox exec|cp` (clients of a running server), `host
//! reap` (this host's sandboxes nobody owns). A sandbox's supervisor is a program of its
//! own, `sandlane-supervisor` (crate `supervisor`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use domain::policy::{parse_count, parse_duration, parse_egress, parse_limit, parse_size, parse_switch};
use domain::{
    CallerClass, IdentityId, OrgId, PolicyError, PolicyField as F, PolicyPatch, PreviewLinkId, SandboxId,
    SnapshotId,
};

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
    /// Set or show an org's policy (lanes, quotas, timeouts, warm pool, egress).
    #[command(subcommand)]
    Org(OrgCommand),
    /// Manage an org's brokered secrets (values never shown) and their sealing key.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Manage the credential signing keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Work with the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Inspect the settings.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Work inside a sandbox through a running server (the caller key is read from
    /// SANDLANE_KEY).
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Look after what the bubblewrap sandboxes of every server on this host share (root).
    #[command(subcommand)]
    Host(HostCommand),
}

/// `sandlane sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command in a sandbox, its output streamed to this terminal as it comes; exit
    /// with the command's exit code.
    Exec(SandboxExec),
    /// Copy a file or a directory into or out of a sandbox (`ORG/ID:PATH` names the
    /// sandbox's side).
    Cp(SandboxCp),
    /// Take a snapshot of a sandbox's workspace; print it (JSON).
    Snapshot(SandboxSnapshot),
    /// Ensure a session's or a workflow execution's sandbox from a snapshot (a fork);
    /// print the sandbox (JSON).
    Fork(SandboxFork),
    /// Restore a sandbox from a snapshot (same id, a fresh token); print it (JSON).
    Restore(SandboxRestore),
    /// An interactive terminal in a sandbox (its shell, or a command); exit with its
    /// exit code.
    Shell(SandboxShell),
    /// Make a preview link of a port inside a sandbox: anyone with its URL opens that port
    /// until it expires or is revoked; print it (JSON; its `url` carries the token, shown
    /// only now).
    Preview(SandboxPreview),
    /// List the preview links of a sandbox's port (JSON).
    Previews(SandboxPort),
    /// Revoke a preview link at once (on every replica).
    RevokePreview(SandboxRevokePreview),
}

/// A port inside a sandbox.
#[derive(Debug, Args)]
pub struct SandboxPort {
    /// The sandbox's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The sandbox (`sbx_…`).
    #[arg(value_parser = parse_sandbox_id)]
    pub id: SandboxId,
    /// The port inside the sandbox (1-65535).
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `sandlane sandbox preview`.
#[derive(Debug, Args)]
pub struct SandboxPreview {
    /// The sandbox and its port.
    #[command(flatten)]
    pub port: SandboxPort,
    /// How long the link opens the port, in seconds (60 to 604800; the server's default
    /// is an hour).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(60..=604_800))]
    pub ttl: Option<u64>,
}

/// `sandlane sandbox revoke-preview`.
#[derive(Debug, Args)]
pub struct SandboxRevokePreview {
    /// The sandbox and its port.
    #[command(flatten)]
    pub port: SandboxPort,
    /// The link (`pvl_…`).
    #[arg(value_parser = parse_link_id)]
    pub link: PreviewLinkId,
}

fn parse_link_id(s: &str) -> Result<PreviewLinkId, String> {
    PreviewLinkId::parse(s).map_err(|e| e.to_string())
}

/// `sandlane sandbox shell`.
#[derive(Debug, Args)]
pub struct SandboxShell {
    /// The sandbox's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The sandbox (`sbx_…`).
    #[arg(value_parser = parse_sandbox_id)]
    pub id: SandboxId,
    /// A command to run instead of the sandbox's shell, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub argv: Vec<String>,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `sandlane sandbox snapshot`.
#[derive(Debug, Args)]
pub struct SandboxSnapshot {
    /// The sandbox's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The sandbox (`sbx_…`).
    #[arg(value_parser = parse_sandbox_id)]
    pub id: SandboxId,
    /// A label for the snapshot (1-64 of A-Z a-z 0-9 . _ -).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `sandlane sandbox fork`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("key").required(true).args(["session", "workflow"]))]
pub struct SandboxFork {
    /// The snapshot's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The snapshot (`snp_…`).
    #[arg(value_parser = parse_snapshot_id)]
    pub snapshot: SnapshotId,
    /// The session whose sandbox starts from the snapshot.
    #[arg(long, value_name = "SESSION_ID", requires = "execution")]
    pub session: Option<String>,
    /// The agent execution the session's ensure is for.
    #[arg(long, value_name = "EXECUTION_ID")]
    pub execution: Option<String>,
    /// The workflow execution whose sandbox starts from the snapshot.
    #[arg(long, value_name = "EXECUTION_ID")]
    pub workflow: Option<String>,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `sandlane sandbox restore`.
#[derive(Debug, Args)]
pub struct SandboxRestore {
    /// The sandbox's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The sandbox (`sbx_…`).
    #[arg(value_parser = parse_sandbox_id)]
    pub id: SandboxId,
    /// The snapshot (`snp_…`) its workspace becomes.
    #[arg(value_parser = parse_snapshot_id)]
    pub snapshot: SnapshotId,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

fn parse_snapshot_id(s: &str) -> Result<SnapshotId, String> {
    SnapshotId::parse(s).map_err(|e| e.to_string())
}

/// `sandlane sandbox exec`.
#[derive(Debug, Args)]
pub struct SandboxExec {
    /// The sandbox's org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The sandbox (`sbx_…`).
    #[arg(value_parser = parse_sandbox_id)]
    pub id: SandboxId,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub argv: Vec<String>,
    /// Wall-clock limit of the command in milliseconds (default: the server's, 30 s).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Feed this terminal's standard input (read to its end, UTF-8) to the command.
    #[arg(long)]
    pub stdin: bool,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `sandlane sandbox cp`.
#[derive(Debug, Args)]
pub struct SandboxCp {
    /// What to copy: a local path, or `ORG/ID:PATH` in a sandbox.
    pub source: String,
    /// Where to: a local path, or `ORG/ID:PATH` in a sandbox (exactly one side is one).
    pub destination: String,
    /// The server's base URL (default: http:// and the `listen` setting).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

fn parse_sandbox_id(s: &str) -> Result<SandboxId, String> {
    SandboxId::parse(s).map_err(|e| e.to_string())
}

/// `sandlane host …`.
#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// End the bubblewrap sandboxes on this host whose data dir or record is gone (no
    /// server can reach them any more), release their host uids and remove the sandbox
    /// roots of the data dirs that are gone; print what was ended. Every server does this
    /// at its start. Exit status 1 when something could not be ended.
    Reap {
        /// Only print what would be ended.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `sandlane config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective settings (defaults, then the --config file, then SANDLANE_*
    /// variables), each with where its value came from; the database password redacted.
    Show {
        /// `toml` (each line commented with its source) or `json`.
        #[arg(long, value_enum, default_value_t = ShowFormat::Toml)]
        format: ShowFormat,
    },
}

/// How `config show` prints.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ShowFormat {
    /// TOML, readable back with --config.
    Toml,
    /// `{"settings": …, "sources": …}`.
    Json,
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

/// `sandlane secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Make or replace a secret; its value is read from standard input (to its end, one
    /// trailing newline dropped), never from an argument. Prints its binding (JSON).
    Set(SecretSet),
    /// Print the org's secrets (JSON), names and bindings, never values.
    List {
        /// The org.
        #[arg(value_parser = parse_org)]
        org: OrgId,
    },
    /// Delete a secret: no connection opened after this carries it.
    Delete {
        /// The org.
        #[arg(value_parser = parse_org)]
        org: OrgId,
        /// The secret's name.
        name: String,
    },
    /// Make a new sealing key, seal every value again under it, and remove the old keys no
    /// value uses any more. Prints the new key's id.
    RotateKey,
}

/// `sandlane secret set`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("scope").required(true).args(["identity", "class", "org_scope"]))]
pub struct SecretSet {
    /// The org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// The secret's name (1-64 of a-z A-Z 0-9 . _ -).
    pub name: String,
    /// A host it is sent to (`api.example.com`, `*.example.com`, either with `:port`;
    /// without one, 443; over plain HTTP only to a port named here); repeat for several.
    #[arg(long = "host", required = true, value_name = "HOST")]
    pub hosts: Vec<String>,
    /// The header it is sent in (default `authorization`).
    #[arg(long)]
    pub header: Option<String>,
    /// How the value becomes the header's value, `{value}` once (default `Bearer {value}`
    /// for `authorization`, `{value}` otherwise).
    #[arg(long)]
    pub format: Option<String>,
    /// For one caller only.
    #[arg(long, value_parser = parse_identity)]
    pub identity: Option<IdentityId>,
    /// For every caller of a class (`user` or `service`).
    #[arg(long, value_parser = parse_class)]
    pub class: Option<CallerClass>,
    /// For every caller of the org.
    #[arg(long = "org")]
    pub org_scope: bool,
    /// A method it may be sent with (default: any); repeat for several.
    #[arg(long = "method", value_name = "METHOD")]
    pub methods: Vec<String>,
    /// A path prefix it may be sent to (default: any); repeat for several.
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<String>,
}

/// `sandlane org …`.
#[derive(Debug, Subcommand)]
pub enum OrgCommand {
    /// Change an org's policy: each flag given sets its field; a flag not given keeps its
    /// value. Every replica obeys the change within a second. Prints the new policy (JSON).
    Set(OrgSet),
    /// Print an org's effective policy (JSON): the defaults with its changes.
    Show {
        /// The org.
        #[arg(value_parser = parse_org)]
        org: OrgId,
    },
}

/// `sandlane org set`.
#[derive(Debug, Args)]
pub struct OrgSet {
    /// The org.
    #[arg(value_parser = parse_org)]
    pub org: OrgId,
    /// Whether session sandboxes are provisioned for the org.
    #[arg(long, value_name = "on|off", value_parser = |s: &str| parse_switch(F::LaneSession, s).map_err(text))]
    pub lane_session: Option<bool>,
    /// Whether workflow sandboxes are provisioned for the org.
    #[arg(long, value_name = "on|off", value_parser = |s: &str| parse_switch(F::LaneWorkflow, s).map_err(text))]
    pub lane_workflow: Option<bool>,
    /// The most sandboxes the org runs at once (`unlimited` for no quota).
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_limit(F::MaxSandboxes, s).map(Unset).map_err(text))]
    pub max_sandboxes: Option<Unset<u32>>,
    /// The most commands the org runs at once, over all its sandboxes and replicas.
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_limit(F::MaxCommands, s).map(Unset).map_err(text))]
    pub max_commands: Option<Unset<u32>>,
    /// The most commands one sandbox runs at once.
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_limit(F::MaxCommandsPerSandbox, s).map(Unset).map_err(text))]
    pub max_commands_per_sandbox: Option<Unset<u32>>,
    /// The most bytes a sandbox writes into its workspace, enforced by the kernel (SIZE like
    /// `64MiB`, or `unlimited`).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size(F::WorkspaceBytes, s).map(Unset).map_err(text))]
    pub workspace_bytes: Option<Unset<u64>>,
    /// How long a sandbox may be idle before it is suspended (DUR like `90s`, `15m`; `off`).
    #[arg(long, value_name = "DUR", value_parser = |s: &str| parse_duration(F::IdleTimeout, s).map(Unset).map_err(text))]
    pub idle_timeout: Option<Unset<u64>>,
    /// How long a sandbox may live before it is deprovisioned (DUR; `off`).
    #[arg(long, value_name = "DUR", value_parser = |s: &str| parse_duration(F::MaxLifetime, s).map(Unset).map_err(text))]
    pub max_lifetime: Option<Unset<u64>>,
    /// How many warm ephemeral sandboxes to keep provisioned for the org.
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_count(F::WarmPool, s).map_err(text))]
    pub warm_pool: Option<u32>,
    /// What sandboxes may reach through the egress proxy: `name`, `*.suffix` or an
    /// address range `ADDRESS/PREFIX` (named explicitly, so reachable although refused by
    /// default), each with an optional `:PORT`, then an optional `@user` or `@service` (the
    /// rule holds only for that caller class); repeat for several; the list given replaces
    /// the org's; `none` empties it.
    #[arg(long, value_name = "HOST[:PORT][@CLASS]")]
    pub egress_allow: Vec<String>,
    /// The most snapshots the org holds (`unlimited` for no quota).
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_limit(F::MaxSnapshots, s).map(Unset).map_err(text))]
    pub max_snapshots: Option<Unset<u32>>,
    /// The most bytes the org's snapshots hold together (SIZE, or `unlimited`).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size(F::SnapshotBytes, s).map(Unset).map_err(text))]
    pub snapshot_bytes: Option<Unset<u64>>,
    /// Where the org's webhook events are posted (`http://` or `https://`; `''` removes
    /// the webhook). Prints a new signing secret (`whsec_…`) once, as the last line.
    #[arg(long, value_name = "URL", conflicts_with = "no_webhook")]
    pub webhook_url: Option<String>,
    /// Removes the org's webhook (its pending deliveries are given up).
    #[arg(long)]
    pub no_webhook: bool,
}

/// What `org set` does to the org's webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookChange {
    /// Set it to this URL, with a new secret.
    Set(String),
    /// Remove it.
    Remove,
}

impl OrgSet {
    /// The change to the webhook the flags ask for, if any.
    pub fn webhook(&self) -> Option<WebhookChange> {
        match (&self.webhook_url, self.no_webhook) {
            (_, true) => Some(WebhookChange::Remove),
            (Some(url), false) if url.trim().is_empty() => Some(WebhookChange::Remove),
            (Some(url), false) => Some(WebhookChange::Set(url.trim().to_owned())),
            (None, false) => None,
        }
    }

    /// The change the flags ask for.
    ///
    /// # Errors
    /// [`PolicyError`] for a bad egress rule.
    pub fn patch(&self) -> Result<PolicyPatch, PolicyError> {
        Ok(PolicyPatch {
            lane_session: self.lane_session,
            lane_workflow: self.lane_workflow,
            max_sandboxes: self.max_sandboxes.map(|v| v.0),
            max_commands: self.max_commands.map(|v| v.0),
            max_commands_per_sandbox: self.max_commands_per_sandbox.map(|v| v.0),
            workspace_bytes: self.workspace_bytes.map(|v| v.0),
            idle_timeout_ms: self.idle_timeout.map(|v| v.0),
            max_lifetime_ms: self.max_lifetime.map(|v| v.0),
            warm_pool: self.warm_pool,
            egress_allow: if self.egress_allow.is_empty() {
                None
            } else {
                Some(parse_egress(&self.egress_allow)?)
            },
            max_snapshots: self.max_snapshots.map(|v| v.0),
            snapshot_bytes: self.snapshot_bytes.map(|v| v.0),
        })
    }
}

/// A value that may be `unlimited` or `off` (`None`). A newtype, so clap reads the flag as
/// one that takes a value (clap reads `Option<Option<T>>` as a flag whose value is optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unset<T>(pub Option<T>);

fn text(e: PolicyError) -> String {
    e.to_string()
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    const CLI_MD: &str = include_str!("../../../../../docs/cli.md");

    /// Every command without subcommands, by its full path (`caller add`), with its long
    /// options; hidden commands (internal modes) are not part of the documented CLI.
    fn leaves(command: &clap::Command, prefix: &str, out: &mut Vec<(String, Vec<String>)>) {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            let path = if prefix.is_empty() {
                sub.get_name().to_owned()
            } else {
                format!("{prefix} {}", sub.get_name())
            };
            if sub.has_subcommands() {
                leaves(sub, &path, out);
            } else {
                let options = sub
                    .get_arguments()
                    .filter(|a| !a.is_global_set() && !a.is_hide_set())
                    .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                    .filter(|l| l != "--help" && l != "--version")
                    .collect();
                out.push((path, options));
            }
        }
    }

    /// `docs/cli.md`'s sections: `## \`sandlane PATH\`` and the text up to the next one.
    fn sections() -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for line in CLI_MD.lines() {
            if let Some(path) = line.strip_prefix("## `sandlane ").and_then(|l| l.strip_suffix('`')) {
                out.push((path.to_owned(), String::new()));
            } else if let Some((_, text)) = out.last_mut() {
                text.push_str(line);
                text.push('\n');
            }
        }
        out
    }

    #[test]
    fn cli_md_documents_every_command_and_option() {
        let mut commands = Vec::new();
        leaves(&Cli::command(), "", &mut commands);
        let documented = sections();
        let names: Vec<&str> = commands.iter().map(|(p, _)| p.as_str()).collect();
        let doc_names: Vec<&str> = documented.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(doc_names, names, "docs/cli.md's sections against `sandlane --help`");
        for ((path, options), (_, text)) in commands.iter().zip(&documented) {
            for option in options {
                assert!(
                    text.contains(option.as_str()),
                    "docs/cli.md's `sandlane {path}` does not mention {option}"
                );
            }
        }
        assert!(CLI_MD.contains("--config"), "the global option");
    }
}

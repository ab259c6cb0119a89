//! The bubblewrap driver's settings (the server's `[bwrap]` table) and the configuration
//! built from them: program, data dir, binds, limits, host ids.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::InvalidSetting;

/// The system directories and files bound read-only into every sandbox when they exist.
///
/// Deliberately not `/etc` wholesale: it holds host secrets and settings (`shadow`,
/// `resolv.conf`, `hosts`, credentials of other services). Only what the dynamic linker
/// and `update-alternatives` links need is bound.
pub const DEFAULT_RO_BINDS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
];

/// The default host directory of a root server (see [`BwrapConfig::host_dir`]).
pub const DEFAULT_HOST_DIR: &str = "/var/lib/sandlane";

/// Resource limits: the sandbox's as a whole (processes, memory, CPU share) and each
/// command's (open files, address space, file size, CPU seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most processes of the sandbox: the `pids` cgroup, and `RLIMIT_NPROC` (per host
    /// uid, which is the workspace's own).
    pub processes: u64,
    /// Most open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Most address space per process in bytes (`RLIMIT_AS`). `UNLIMITED_ADDRESS_SPACE`
    /// (the default) sets none where the memory cgroup bounds the sandbox, and
    /// `FALLBACK_ADDRESS_SPACE` where it cannot: runtimes reserve address space far beyond
    /// what they use (V8 about 10 GiB per WebAssembly instance, so Node's own `fetch`; Go;
    /// the JVM), and fail under a limit that memory use alone would never reach.
    pub address_space_bytes: u64,
    /// Largest file a process may write in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: u64,
    /// CPU seconds per process (`RLIMIT_CPU`; SIGXCPU, then SIGKILL a second later).
    pub cpu_secs: u64,
    /// Most memory of the whole sandbox in bytes (the `memory` cgroup, where writable).
    pub memory_bytes: u64,
    /// CPU share of the whole sandbox in thousandths of a CPU (the `cpu` cgroup's quota).
    pub cpu_millis: u64,
}

/// No address-space limit (`RLIM_INFINITY`); see [`Limits::address_space_bytes`].
pub const UNLIMITED_ADDRESS_SPACE: u64 = libc::RLIM_INFINITY;
/// The address-space limit of a sandbox that no memory cgroup bounds: 4 GiB.
pub const FALLBACK_ADDRESS_SPACE: u64 = 4 << 30;

impl Limits {
    /// These limits with the address space a sandbox gets: the configured limit, or, when
    /// none is configured, none where the memory cgroup bounds the sandbox
    /// (`memory_bounded`) and `FALLBACK_ADDRESS_SPACE` where it cannot.
    #[must_use]
    pub fn bounded(self, memory_bounded: bool) -> Self {
        let unset = self.address_space_bytes == UNLIMITED_ADDRESS_SPACE;
        Self {
            address_space_bytes: if unset && !memory_bounded {
                FALLBACK_ADDRESS_SPACE
            } else {
                self.address_space_bytes
            },
            ..self
        }
    }
}

impl Default for Limits {
    /// 256 processes, 1024 files, no address-space limit of its own (see
    /// [`Limits::address_space_bytes`]), 1 GiB files, 300 CPU seconds, 1 GiB memory, one CPU.
    fn default() -> Self {
        Self {
            processes: 256,
            open_files: 1024,
            address_space_bytes: UNLIMITED_ADDRESS_SPACE,
            file_size_bytes: 1 << 30,
            cpu_secs: 300,
            memory_bytes: 1 << 30,
            cpu_millis: 1000,
        }
    }
}

/// Which unprivileged host ids the sandboxes run as, when the server runs as root.
///
/// Each workspace gets its own host uid (and the same gid), derived from the workspace
/// identity (the key for a durable workspace, the sandbox id for an ephemeral one) as
/// `base + hash % span`, then stepped past ids a live sandbox already holds. A durable
/// workspace keeps the uid that owns it. Inside, the sandbox always sees
/// [`BwrapConfig::inner_id`]. When the server is not root, the sandboxes run as the
/// server's own uid and these are unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    /// First host uid/gid handed out.
    pub base: u32,
    /// How many ids from `base` on may be handed out (at least 1).
    pub span: u32,
}

impl Default for HostIds {
    /// 200 000 000 ids from 1 900 000 000: above the ranges of regular, system, dynamic
    /// and nspawn users, below 2^31.
    fn default() -> Self {
        Self { base: 1_900_000_000, span: 200_000_000 }
    }
}

/// A protection of the host a sandbox can be required to run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protection {
    /// User namespaces (the sandbox's uid 1000 is an unprivileged host uid).
    UserNamespaces,
    /// A `memory` cgroup holding the sandbox's memory limit.
    CgroupMemory,
    /// A `pids` cgroup holding the sandbox's process limit.
    CgroupPids,
    /// A `cpu` cgroup holding the sandbox's CPU share.
    CgroupCpu,
    /// The seccomp filter (installed by the supervisor, inherited by every command).
    Seccomp,
}

impl Protection {
    /// Every protection.
    pub const ALL: [Self; 5] =
        [Self::UserNamespaces, Self::CgroupMemory, Self::CgroupPids, Self::CgroupCpu, Self::Seccomp];

    /// `userns`, `cgroup-memory`, `cgroup-pids`, `cgroup-cpu`, `seccomp`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UserNamespaces => "userns",
            Self::CgroupMemory => "cgroup-memory",
            Self::CgroupPids => "cgroup-pids",
            Self::CgroupCpu => "cgroup-cpu",
            Self::Seccomp => "seccomp",
        }
    }

    /// The protection named `name` (as [`Protection::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// The bubblewrap driver's settings, as an operator gives them: the server's `[bwrap]`
/// table (`SANDLANE_BWRAP__*`), read as they are. Unset ones keep the driver's defaults
/// ([`BwrapConfig::new`]); [`BwrapConfig::from_settings`] applies them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BwrapSettings {
    /// The bubblewrap program.
    pub program: PathBuf,
    /// Process limit per sandbox.
    pub max_processes: Option<u64>,
    /// Open file limit.
    pub max_open_files: Option<u64>,
    /// Address space limit in bytes.
    pub max_address_space_bytes: Option<u64>,
    /// File size limit in bytes.
    pub max_file_size_bytes: Option<u64>,
    /// CPU time limit in seconds.
    pub max_cpu_secs: Option<u64>,
    /// Memory limit in bytes (enforced where a memory cgroup is writable).
    pub max_memory_bytes: Option<u64>,
    /// Output cap per stream, in bytes.
    pub output_cap_bytes: Option<usize>,
    /// CPU share of a sandbox in thousandths of a CPU (the `cpu` cgroup, where writable).
    pub max_cpu_millis: Option<u64>,
    /// Whether the supervisor installs the seccomp filter (default: yes, where the kernel
    /// has seccomp).
    pub seccomp: Option<bool>,
    /// Where what a sandbox's own uid must reach lives (workspaces, token directories,
    /// prepared starts); default: as root `<host_dir>/roots/<hash of the data dir>`,
    /// otherwise the data dir's sibling `<data dir>.sandboxes`.
    pub sandbox_root: Option<PathBuf>,
    /// The host directory of a root server: the host uid claims shared by every server on
    /// this host, and the default sandbox roots; default `/var/lib/sandlane`.
    pub host_dir: Option<PathBuf>,
    /// How many new ephemeral sandboxes to keep started ahead (0: none; default 2).
    pub started_ahead: Option<usize>,
    /// How many ephemeral forks of the latest forked snapshot to keep started ahead (0:
    /// none; default 1).
    pub forks_ahead: Option<usize>,
    /// The protections provision requires, comma-separated (`userns`, `cgroup-memory`, `cgroup-pids`,
    /// `cgroup-cpu`, `seccomp`); default: every one this host gives.
    pub required_protections: Option<String>,
}

impl Default for BwrapSettings {
    fn default() -> Self {
        Self {
            program: PathBuf::from("bwrap"),
            max_processes: None,
            max_open_files: None,
            max_address_space_bytes: None,
            max_file_size_bytes: None,
            max_cpu_secs: None,
            max_memory_bytes: None,
            output_cap_bytes: None,
            max_cpu_millis: None,
            seccomp: None,
            required_protections: None,
            sandbox_root: None,
            host_dir: None,
            started_ahead: None,
            forks_ahead: None,
        }
    }
}

impl BwrapSettings {
    /// Checks what the types do not, naming the first bad setting (`bwrap.KEY`).
    ///
    /// # Errors
    /// [`InvalidSetting`].
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        InvalidSetting::check_positive([
            ("bwrap.max_processes", self.max_processes),
            ("bwrap.max_open_files", self.max_open_files),
            ("bwrap.max_address_space_bytes", self.max_address_space_bytes),
            ("bwrap.max_file_size_bytes", self.max_file_size_bytes),
            ("bwrap.max_cpu_secs", self.max_cpu_secs),
            ("bwrap.max_memory_bytes", self.max_memory_bytes),
            ("bwrap.output_cap_bytes", self.output_cap_bytes.map(|v| v as u64)),
            ("bwrap.max_cpu_millis", self.max_cpu_millis),
        ])?;
        for name in self.required_protections.iter().flat_map(|l| l.split(',').map(str::trim)) {
            if Protection::parse(name).is_none() {
                return Err(InvalidSetting::new(
                    "bwrap.required_protections",
                    format!(
                        "unknown protection {name:?}; expected userns, cgroup-memory, cgroup-pids, cgroup-cpu or seccomp"
                    ),
                ));
            }
        }
        if self.program.as_os_str().is_empty() {
            return Err(InvalidSetting::new("bwrap.program", "must not be empty"));
        }
        if self.host_dir.as_ref().is_some_and(|dir| !dir.is_absolute()) {
            return Err(InvalidSetting::new("bwrap.host_dir", "must be an absolute path"));
        }
        Ok(())
    }
}

/// Everything the bubblewrap driver needs: its settings ([`BwrapConfig::from_settings`])
/// resolved over the defaults, and what is not a setting (the data dir, the supervisor's
/// program, the knobs tests and benches turn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwrapConfig {
    /// The bubblewrap program: a path, or a name looked up on `PATH` (`SANDLANE_BWRAP`,
    /// default `bwrap`).
    pub program: PathBuf,
    /// The data dir: the per-sandbox state only the server reads (`sandboxes/`: records,
    /// the supervisors' sockets; their logs are in memory). Private (0700): no sandbox uid
    /// can even search it.
    pub data_dir: PathBuf,
    /// The sandbox root: what a sandbox's own uid must reach to start — its workspace
    /// (`workspaces/`), its token directory (`run/<id>/`), prepared starts (`warm/`), and
    /// the supervisor's program when the sandboxes' uids cannot reach it where it is
    /// (`bin/`). Its directories are searchable (0711, not listable) because bubblewrap,
    /// already running as the sandbox's uid, resolves the paths it binds. `None`: the
    /// default ([`BwrapConfig::resolved_sandbox_root`]).
    pub sandbox_root: Option<PathBuf>,
    /// The host directory, when the server runs as root: the host uid claims of every
    /// server on this host, and the default sandbox roots (see
    /// [`BwrapConfig::resolved_sandbox_root`]). Root's own, searchable, not listable.
    /// Default [`DEFAULT_HOST_DIR`].
    pub host_dir: PathBuf,
    /// Host paths bound read-only at the same place inside (missing ones are skipped; a
    /// symlink such as `/bin -> usr/bin` is recreated as a symlink).
    pub ro_binds: Vec<PathBuf>,
    /// Resource limits of every command.
    pub limits: Limits,
    /// Per-stream cap of captured output in bytes; the rest is drained and dropped.
    pub output_cap_bytes: usize,
    /// Size of the private `/tmp` tmpfs in bytes (`None`: the kernel default).
    pub tmp_size_bytes: Option<u64>,
    /// How long a new sandbox's supervisor may take to answer at provision.
    pub probe_timeout: Duration,
    /// The supervisor's program (`sandlane-supervisor`): bound read-only into every
    /// sandbox and run as its init.
    pub supervisor: PathBuf,
    /// Whether the supervisor installs the seccomp filter (where the kernel has seccomp).
    pub seccomp: bool,
    /// The protections a sandbox must run under: provision refuses when the host lacks
    /// one. `None`: every protection this host gives (found at start).
    pub required_protections: Option<Vec<Protection>>,
    /// How many sandbox starts to keep prepared (cgroup v1 or none): a process already in
    /// a cgroup, waiting for its sandbox, so a provision does not wait for the cgroup v1
    /// move (an RCU grace period, ≈ 10 ms). Each waits as a forked copy of the server.
    pub warm_starts: usize,
    /// How many new ephemeral sandboxes to keep started ahead (cgroup v1 or none), with
    /// the workspace quota of the latest ephemeral provision: a provision that finds one
    /// renames it to its id instead of starting one. 0 turns it off. Each is an idle
    /// sandbox (about 1.2 MiB of host memory) and a fresh workspace image.
    pub started_ahead: usize,
    /// How many ephemeral forks of the latest ephemeral fork's snapshot (and quota) to
    /// keep started ahead, their workspaces filled with the snapshot's files: a fork that
    /// finds one renames it instead of copying the files and starting one. 0 turns it off.
    /// Each is an idle sandbox and a copy of the snapshot's image (shared blocks where the
    /// filesystem can reflink).
    pub forks_ahead: usize,
    /// Whether to enforce limits with cgroups where a controller is writable.
    pub use_cgroups: bool,
    /// Where the cgroup hierarchies are mounted.
    pub cgroup_root: PathBuf,
    /// The cgroup (below each controller) that holds one cgroup per sandbox.
    pub cgroup_parent: String,
    /// Whether to pass `--disable-userns` (no user namespaces inside the sandbox; needs
    /// bubblewrap 0.8 or later).
    pub disable_nested_userns: bool,
    /// The unprivileged uid and gid processes see inside the sandbox.
    pub inner_id: u32,
    /// The host ids sandboxes run as when the server is root.
    pub host_ids: HostIds,
    /// The PEM file of the roots brokered upstreams are verified against
    /// (`egress.upstream_ca_file`); `None`: the system's roots.
    pub upstream_ca_file: Option<PathBuf>,
}

impl BwrapConfig {
    /// The defaults with `data_dir`: program `bwrap`, [`DEFAULT_RO_BINDS`], default
    /// [`Limits`], 1 MiB output per stream, 256 MiB `/tmp`, 10 s for the supervisor's
    /// answer, `sandlane-supervisor` beside the running executable as the supervisor, seccomp
    /// on, every protection the host gives required, 2 prepared starts, 2 sandboxes started
    /// ahead, cgroups under
    /// `/sys/fs/cgroup/<controller>/sandlane`, no nested user namespaces, uid/gid 1000
    /// inside, the default sandbox root, the host dir [`DEFAULT_HOST_DIR`].
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            program: PathBuf::from("bwrap"),
            sandbox_root: None,
            host_dir: PathBuf::from(DEFAULT_HOST_DIR),
            data_dir,
            ro_binds: DEFAULT_RO_BINDS.iter().map(PathBuf::from).collect(),
            limits: Limits::default(),
            output_cap_bytes: 1 << 20,
            tmp_size_bytes: Some(256 << 20),
            probe_timeout: Duration::from_secs(10),
            supervisor: crate::supervisor_link::beside_current_exe(),
            seccomp: true,
            required_protections: None,
            warm_starts: 2,
            started_ahead: 2,
            forks_ahead: 1,
            use_cgroups: true,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "sandlane".to_owned(),
            disable_nested_userns: true,
            inner_id: 1000,
            host_ids: HostIds::default(),
            upstream_ca_file: None,
        }
    }
}

impl BwrapConfig {
    /// The defaults with `data_dir` ([`BwrapConfig::new`]) and `settings` over them;
    /// `supervisor`: the supervisor's program (`None`: `sandlane-supervisor` beside the
    /// running executable). `settings` are assumed valid ([`BwrapSettings::validate`]): an
    /// unknown protection name is skipped.
    pub fn from_settings(
        settings: &BwrapSettings,
        data_dir: impl Into<PathBuf>,
        supervisor: Option<PathBuf>,
    ) -> Self {
        let s = settings;
        let mut config = Self::new(data_dir);
        if let Some(program) = supervisor {
            config.supervisor = program;
        }
        config.program.clone_from(&s.program);
        config.sandbox_root.clone_from(&s.sandbox_root);
        if let Some(dir) = &s.host_dir {
            config.host_dir.clone_from(dir);
        }
        let l = &mut config.limits;
        l.processes = s.max_processes.unwrap_or(l.processes);
        l.open_files = s.max_open_files.unwrap_or(l.open_files);
        l.address_space_bytes = s.max_address_space_bytes.unwrap_or(l.address_space_bytes);
        l.file_size_bytes = s.max_file_size_bytes.unwrap_or(l.file_size_bytes);
        l.cpu_secs = s.max_cpu_secs.unwrap_or(l.cpu_secs);
        l.memory_bytes = s.max_memory_bytes.unwrap_or(l.memory_bytes);
        l.cpu_millis = s.max_cpu_millis.unwrap_or(l.cpu_millis);
        config.output_cap_bytes = s.output_cap_bytes.unwrap_or(config.output_cap_bytes);
        config.seccomp = s.seccomp.unwrap_or(config.seccomp);
        config.started_ahead = s.started_ahead.unwrap_or(config.started_ahead);
        config.forks_ahead = s.forks_ahead.unwrap_or(config.forks_ahead);
        config.required_protections = s
            .required_protections
            .as_ref()
            .map(|names| names.split(',').filter_map(|n| Protection::parse(n.trim())).collect());
        config
    }

    /// The sandbox root: [`BwrapConfig::sandbox_root`] when set, else the default.
    ///
    /// A server that is not root runs its sandboxes as its own uid, which reaches anything
    /// the server does: the default is the data dir's sibling `<data dir>.sandboxes`.
    /// A root server runs them as unprivileged uids, which cannot search a home directory
    /// of mode 0700 (Debian's `/root`) or anything else private on the way to the working
    /// directory: the default is `<host_dir>/roots/<name>`, a directory the server makes
    /// itself under a root-owned, searchable host directory, `<name>` derived from the
    /// data dir's canonical path (so two data dirs never share one). One exception keeps
    /// what an earlier version made: a sibling `<data dir>.sandboxes` that exists and that
    /// the sandboxes' uids can reach stays the root (its durable workspaces and running
    /// sandboxes are there).
    pub fn resolved_sandbox_root(&self) -> PathBuf {
        if let Some(root) = &self.sandbox_root {
            return root.clone();
        }
        let sibling = sibling_root(&self.data_dir);
        let (euid, _) = super::workspace::effective_ids();
        if euid != 0 || (sibling.is_dir() && super::workspace::unsearchable_ancestor(&sibling).is_none()) {
            return sibling;
        }
        super::host::HostDir::new(&self.host_dir).root_of(&self.data_dir)
    }
}

/// The default sandbox root of `data_dir` for a server of this process's uid with the
/// default host dir (see [`BwrapConfig::resolved_sandbox_root`]).
pub fn default_sandbox_root(data_dir: &std::path::Path) -> PathBuf {
    BwrapConfig { sandbox_root: None, ..BwrapConfig::new(data_dir) }.resolved_sandbox_root()
}

/// The data dir's sibling `<name>.sandboxes`.
fn sibling_root(data_dir: &std::path::Path) -> PathBuf {
    let name = data_dir.file_name().map_or_else(|| "sandlane".into(), |n| n.to_string_lossy().into_owned());
    data_dir.with_file_name(format!("{name}.sandboxes"))
}

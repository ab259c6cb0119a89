//! The seccomp filter every sandbox runs under: a deny list of what agents never need,
//! built with Firecracker's `seccompiler` and installed by the supervisor on itself
//! before it serves anything, so every command inherits it.
//!
//! Denied with `EPERM`: tracing and reading other processes (`ptrace`,
//! `process_vm_readv`/`writev`), the kernel keyring (`keyctl`, `add_key`, `request_key`),
//! `bpf`, `perf_event_open`, `userfaultfd`, kernel modules and `kexec`, every mount
//! syscall (old and new API), `pivot_root`, `swapon`/`swapoff`, `reboot`, `acct`,
//! `quotactl`, handles that bypass path checks (`open_by_handle_at`), port I/O, and new
//! namespaces: `unshare`, `setns`, and `clone` with any namespace flag. `clone3` gets
//! `ENOSYS` (its flags are behind a pointer a filter cannot read), so C libraries fall
//! back to `clone`, whose flags are checked.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// The syscalls denied outright.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_iopl,
    libc::SYS_ioperm,
];

/// The `clone` flags that make a new namespace (`CLONE_NEWTIME` is only for `clone3`
/// and `unshare`, both denied).
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

fn deny_list(errno: u32) -> Result<BpfProgram, String> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp: no filter for architecture {}: {e:?}", std::env::consts::ARCH))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|s| (*s, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(*flag), *flag)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("seccomp: {e}"))?;
    rules.insert(libc::SYS_clone, clone_rules);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno), arch)
        .map_err(|e| format!("seccomp: {e}"))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))
}

/// The sandbox filter as a BPF program.
///
/// # Errors
/// A message when this architecture has no filter or it cannot be built.
pub fn sandbox_filter() -> Result<(BpfProgram, BpfProgram), String> {
    // Two programs: the deny list (EPERM) and one that answers clone3 with ENOSYS.
    let main = deny_list(libc::EPERM as u32)?;
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp: no filter for architecture {}: {e:?}", std::env::consts::ARCH))?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let clone3: BpfProgram =
        clone3.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))?;
    Ok((main, clone3))
}

/// Installs the sandbox filter on the calling process (all its threads), with
/// `no_new_privs`. Call it before any untrusted code runs; it cannot be removed.
///
/// # Errors
/// A message when the filter cannot be built or the kernel refuses it.
pub fn install() -> Result<(), String> {
    let (main, clone3) = sandbox_filter()?;
    seccompiler::apply_filter_all_threads(&clone3).map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter_all_threads(&main).map_err(|e| format!("seccomp: {e}"))
}

/// Whether this kernel can filter syscalls with seccomp (`Seccomp:` in
/// `/proc/self/status` and the `errno` action available).
pub fn available() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Seccomp:")) && actions.split_whitespace().any(|a| a == "errno")
}

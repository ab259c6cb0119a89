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
//! back to `clone`, whose flags are checked. `io_uring_setup`, `io_uring_enter` and
//! `io_uring_register` are denied (its rings run system calls this filter never sees).
//! Sockets: only `AF_UNIX`, `AF_INET`, `AF_INET6` and `AF_NETLINK` can be created
//! (`socket`, `socketpair`); every other family is `EPERM`, among them `AF_VSOCK`, a path
//! to the host that no network namespace closes.
//!
//! The architecture is checked first: a system call made under any other ABI than the
//! one the filter was built for kills the process (seccompiler's prologue). On x86_64 a
//! second, hand-written program refuses every x32 system call (`EPERM`): they share the
//! x86_64 audit architecture and differ only by bit 30 of the number, which the deny list
//! (matching exact numbers) would let through.

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
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// The only socket families a sandbox may create (`AF_NETLINK`: C libraries ask the
/// kernel for interfaces and routes with it).
pub const SOCKET_FAMILIES: &[i32] = &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];

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
    // One rule whose conditions all hold (the family is none of the allowed ones).
    let other_family = SOCKET_FAMILIES
        .iter()
        .map(|family| {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                u64::from(family.unsigned_abs()),
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(SeccompRule::new)
        .map_err(|e| format!("seccomp: {e}"))?;
    rules.insert(libc::SYS_socket, vec![other_family.clone()]);
    rules.insert(libc::SYS_socketpair, vec![other_family]);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno), arch)
        .map_err(|e| format!("seccomp: {e}"))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))
}

/// The x32 system calls' bit in the number (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// On x86_64, the program that refuses every x32 system call: the architecture checked
/// (anything else is killed, as in seccompiler's own programs), then the number's x32 bit.
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    use seccompiler::sock_filter;
    // Offsets in `struct seccomp_data`: the number, then the architecture.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    let ld = |k| sock_filter { code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, jt: 0, jf: 0, k };
    let jump =
        |op: u32, k, jt, jf| sock_filter { code: (libc::BPF_JMP | op | libc::BPF_K) as u16, jt, jf, k };
    let ret = |k| sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k };
    vec![
        ld(ARCH),
        jump(libc::BPF_JEQ, AUDIT_ARCH_X86_64, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        ld(NR),
        jump(libc::BPF_JSET, X32_SYSCALL_BIT, 0, 1),
        ret(libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA)),
        ret(libc::SECCOMP_RET_ALLOW),
    ]
}

/// The sandbox filter as BPF programs, all installed (the kernel runs each and the most
/// restrictive answer wins): the deny list (`EPERM`), one that answers `clone3` with
/// `ENOSYS`, and on x86_64 the x32 filter.
///
/// # Errors
/// A message when this architecture has no filter or it cannot be built.
pub fn sandbox_filter() -> Result<Vec<BpfProgram>, String> {
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
    #[cfg(target_arch = "x86_64")]
    return Ok(vec![clone3, x32_filter(), main]);
    #[cfg(not(target_arch = "x86_64"))]
    Ok(vec![clone3, main])
}

/// Installs the sandbox filter on the calling process (all its threads), with
/// `no_new_privs`. Call it before any untrusted code runs; it cannot be removed.
///
/// # Errors
/// A message when the filter cannot be built or the kernel refuses it.
pub fn install() -> Result<(), String> {
    for program in sandbox_filter()? {
        seccompiler::apply_filter_all_threads(&program).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// Whether this kernel can filter syscalls with seccomp (`Seccomp:` in
/// `/proc/self/status` and the `errno` action available).
pub fn available() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Seccomp:")) && actions.split_whitespace().any(|a| a == "errno")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every program checks the architecture before anything else and kills a process
    /// calling under another ABI (`struct seccomp_data`'s `arch` is at offset 4).
    #[test]
    fn every_program_kills_a_call_from_an_unknown_architecture_first() {
        let programs = sandbox_filter().unwrap();
        assert!(programs.len() >= 2);
        for program in programs {
            let load = &program[0];
            assert_eq!((u32::from(load.code), load.k), (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4));
            let check = &program[1];
            assert_eq!(u32::from(check.code), libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K);
            assert_eq!((check.jt, check.jf), (1, 0), "a mismatch falls through to the kill");
            let kill = &program[2];
            assert_eq!(
                (u32::from(kill.code), kill.k),
                (libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_KILL_PROCESS)
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_x32_program_refuses_the_x32_bit_and_allows_the_rest() {
        let program = x32_filter();
        let test = &program[4];
        assert_eq!(u32::from(test.code), libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K);
        assert_eq!(test.k, X32_SYSCALL_BIT);
        // Set: the next instruction (EPERM); clear: the one after (allow).
        assert_eq!(program[5 + usize::from(test.jt)].k, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
        assert_eq!(program[5 + usize::from(test.jf)].k, libc::SECCOMP_RET_ALLOW);
        assert_eq!(program.len(), 7);
    }
}

//! The contract every [`SandboxDriver`] adapter passes: one test body, run against the
//! real bubblewrap driver and any later driver (the container driver) alike.
//!
//! It needs only POSIX `sh`, `cat`, `env` and `printf` inside the sandbox.

use domain::execution::AgentExecution;
use domain::{
    CallerClass, DriverEnvironment, Durability, ExecOutput, ExecRequest, ExecutionId, IdentityId, OrgId,
    Phase, ProcessCaps, ProcessRequest, SandboxCaller, SandboxId, SandboxToken, SessionId, split_caller,
};
use ports::driver::{DriverError, ProvisionSpec, SandboxDriver};

/// A fresh random sandbox id.
pub fn new_sandbox_id() -> SandboxId {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("entropy");
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis();
    SandboxId::generate(u64::try_from(millis).expect("millis fit"), u128::from_le_bytes(bytes))
}

/// A provision spec for a new sandbox of session `session` in `org`, asked for by an
/// identity `identity` of `class`, with `durability` and token `token`.
pub fn spec_for(
    org: &str,
    session: &str,
    identity: &str,
    class: CallerClass,
    durability: Durability,
    token: &str,
) -> ProvisionSpec {
    let execution = AgentExecution {
        org: OrgId::parse(org).expect("org"),
        session_id: SessionId::parse(session).expect("session"),
        execution_id: ExecutionId::parse(format!("exec-{}", new_sandbox_id())).expect("exec"),
        phase: Phase::InProgress,
    };
    let caller = SandboxCaller::from_record(IdentityId::parse(identity).expect("identity"), class);
    let (_mint, environment): (_, DriverEnvironment) = split_caller(&execution, &caller, &new_sandbox_id());
    ProvisionSpec {
        key: domain::execution::SandboxSubject::sandbox_key(&execution),
        environment,
        durability,
        credential: SandboxToken::new(token),
        epoch: 1,
        workspace_bytes: None,
        from_snapshot: None,
    }
}

/// Runs `argv` in `sandbox` with `stdin` and a timeout, expecting the driver to start it.
pub async fn run(
    driver: &dyn SandboxDriver,
    sandbox: &SandboxId,
    argv: &[&str],
    stdin: &[u8],
    timeout_ms: u64,
) -> ExecOutput {
    let request =
        ExecRequest::new(argv.iter().map(|a| (*a).to_owned()).collect(), stdin.to_vec(), Some(timeout_ms))
            .expect("valid request");
    driver.exec(sandbox, &request).await.expect("exec starts")
}

/// How many host processes have `marker` in their command line.
pub fn host_processes_with(marker: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).replace('\0', " ").contains(marker))
        .count()
}

/// How many host processes run exactly `argv` (their whole command line), whatever
/// namespace they live in.
fn host_processes_running(argv: &[&str]) -> usize {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| *cmdline == want)
        .count()
}

/// The limits a driver under test was configured with, which the contract reads back
/// from inside its sandbox.
#[derive(Debug, Clone, Copy)]
pub struct ExpectedLimits {
    /// `RLIMIT_NOFILE` (`ulimit -n`).
    pub open_files: u64,
    /// `RLIMIT_NPROC` (`ulimit -u`).
    pub processes: u64,
    /// `RLIMIT_FSIZE` in bytes (`ulimit -f`).
    pub file_size_bytes: u64,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An exec's output as text, for assertion messages.
pub fn shown(out: &ExecOutput) -> String {
    format!(
        "exit {}{}{}, stdout {:?}, stderr {:?}",
        out.exit_code,
        if out.timed_out { " (timed out)" } else { "" },
        if out.truncated { " (truncated)" } else { "" },
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The contract: provision (idempotent), exec (output, exit codes, stdin, timeout,
/// environment, token file), refresh, list, limits (`limits`, as configured),
/// deprovision (idempotent, no process left), durability.
pub async fn driver_contract(driver: &dyn SandboxDriver, limits: ExpectedLimits) {
    let health = driver.health().await;
    assert!(health.usable, "driver not usable: {}", health.detail);
    assert!(!driver.name().is_empty());

    let org = format!("org-{}", new_sandbox_id().as_str()[4..12].to_ascii_lowercase());
    let spec = spec_for(&org, "s1", "user-7", CallerClass::User, Durability::Durable, "tok-one");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.expect("provision");
    driver.provision(&spec).await.expect("provision again is idempotent");
    assert!(driver.list().await.expect("list").contains(&id));

    let out = run(driver, &id, &["sh", "-c", "printf hello; printf oops >&2; exit 3"], b"", 10_000).await;
    assert_eq!((out.exit_code, text(&out.stdout), text(&out.stderr)), (3, "hello".into(), "oops".into()));
    assert!(!out.timed_out && !out.truncated);

    let out = run(driver, &id, &["cat"], b"from stdin", 10_000).await;
    assert_eq!(text(&out.stdout), "from stdin");

    let out = run(driver, &id, &["sh", "-c", "sleep 20"], b"", 300).await;
    assert!(out.timed_out, "timeout must be reported: {out:?}");

    let out = run(driver, &id, &["env"], b"", 10_000).await;
    let mut seen: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    let mut want: Vec<String> = spec.environment.vars().iter().map(|(k, v)| format!("{k}={v}")).collect();
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "the environment is exactly the contract");
    assert!(!text(&out.stdout).contains("user-7"), "the identity id never reaches the sandbox");
    assert!(!text(&out.stdout).contains("tok-one"), "the token is never in the environment");

    let out = run(driver, &id, &["sh", "-c", "pwd; cat \"$SANDLANE_TOKEN_FILE\""], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "/workspace\ntok-one");
    driver.refresh_credential(&id, &SandboxToken::new("tok-two"), &spec.environment).await.expect("refresh");
    let out = run(driver, &id, &["sh", "-c", "cat \"$SANDLANE_TOKEN_FILE\""], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "tok-two");

    let out = run(driver, &id, &["sh", "-c", "echo x > \"$SANDLANE_TOKEN_FILE\""], b"", 10_000).await;
    assert_ne!(out.exit_code, 0, "the token file is read-only");

    let out = run(driver, &id, &["sh", "-c", "echo kept > /workspace/kept"], b"", 10_000).await;
    assert_eq!(out.exit_code, 0, "workspace writable: {}", text(&out.stderr));

    // No network: the sandbox's network namespace has only the loopback interface
    // (/proc/net/dev is per namespace, unlike /sys/class/net).
    let out = run(driver, &id, &["cat", "/proc/net/dev"], b"", 10_000).await;
    let interfaces: Vec<String> = text(&out.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_owned()))
        .collect();
    assert_eq!(interfaces, vec!["lo".to_owned()], "no interface but loopback");

    // Limits: open files, processes and file size are the configured ones, soft and hard,
    // read by the kernel's own account (dash's `ulimit` has no `-u`).
    let out = run(driver, &id, &["cat", "/proc/self/limits"], b"", 10_000).await;
    assert_eq!(out.exit_code, 0, "cat /proc/self/limits: {}", text(&out.stderr));
    let table = text(&out.stdout);
    let limit = |name: &str| -> Vec<String> {
        let line =
            table.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {table}"));
        line[name.len()..].split_whitespace().take(2).map(str::to_owned).collect()
    };
    let both = |v: u64| vec![v.to_string(), v.to_string()];
    assert_eq!(limit("Max open files"), both(limits.open_files), "ulimit -n: {table}");
    assert_eq!(limit("Max processes"), both(limits.processes), "ulimit -u: {table}");
    assert_eq!(limit("Max file size"), both(limits.file_size_bytes), "ulimit -f: {table}");

    // How a command starts: the leader of its own process group, no signal blocked, and
    // neither SIGPIPE nor SIGXFSZ ignored (the supervisor ignores both for itself).
    let out = run(driver, &id, &["cat", "/proc/self/stat", "/proc/self/status"], b"", 10_000).await;
    let shown_out = text(&out.stdout);
    let stat: Vec<&str> = shown_out.lines().next().unwrap_or("").rsplit(") ").collect();
    let fields: Vec<&str> = stat.first().map(|f| f.split_whitespace().collect()).unwrap_or_default();
    let pid = shown_out.split_whitespace().next().unwrap_or("");
    assert_eq!(fields.get(2).copied(), Some(pid), "a command leads its own process group: {shown_out}");
    let mask = |name: &str| -> u64 {
        let line = shown_out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}"));
        u64::from_str_radix(line[name.len()..].trim(), 16).expect("a hex mask")
    };
    assert_eq!(mask("SigBlk:"), 0, "no signal blocked: {shown_out}");
    let pipe_and_xfsz = (1u64 << (libc::SIGPIPE - 1)) | (1u64 << (libc::SIGXFSZ - 1));
    assert_eq!(mask("SigIgn:") & pipe_and_xfsz, 0, "SIGPIPE and SIGXFSZ at their defaults: {shown_out}");
    // A program is looked up in PATH; a file of no known format is run by /bin/sh (as
    // execvp does); a file that cannot be run, or no such program, says why.
    let out = run(
        driver,
        &id,
        &["sh", "-c", "printf 'echo from-sh \"$1\"\n' > /workspace/plain; chmod +x /workspace/plain; printf x > /workspace/data"],
        b"",
        10_000,
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let out = run(driver, &id, &["./plain", "arg"], b"", 10_000).await;
    assert_eq!((out.exit_code, text(&out.stdout)), (0, "from-sh arg\n".to_owned()), "{}", shown(&out));
    for (argv, why) in
        [(["/workspace/data"], "Permission denied"), (["no-such-program-anywhere"], "No such file")]
    {
        let request = ExecRequest::new(argv.iter().map(|a| (*a).to_owned()).collect(), vec![], Some(10_000))
            .expect("request");
        // As a shell says it: exit 127, the reason on standard error.
        let out = driver.exec(&id, &request).await.expect("exec");
        let stderr = text(&out.stderr);
        assert!(
            out.exit_code == 127 && stderr.contains("cannot run") && stderr.contains(why),
            "{argv:?}: {}",
            shown(&out)
        );
    }

    // Deprovision leaves no process: a command running in the sandbox, with a child in the
    // background, is seen alive from the host (whatever the driver), then deprovision
    // ends both and the command returns.
    let mut nonce = [0u8; 4];
    getrandom::fill(&mut nonce).expect("entropy");
    let marker = format!("3000.{}", u32::from_le_bytes(nonce) % 1_000_000);
    let marker_argv = ["sleep", marker.as_str()];
    let script = format!("sleep {marker} & sleep {marker}; echo survived");
    let request =
        ExecRequest::new(vec!["sh".into(), "-c".into(), script], vec![], Some(20_000)).expect("request");
    let started = std::time::Instant::now();
    let watch = async {
        let mut alive = 0;
        while started.elapsed() < std::time::Duration::from_secs(10) {
            alive = host_processes_running(&marker_argv);
            if alive == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        driver.deprovision(&id).await.expect("deprovision");
        (alive, host_processes_running(&marker_argv))
    };
    let (ended, (alive_before, alive_after)) = tokio::join!(driver.exec(&id, &request), watch);
    let ended_shown = ended.as_ref().map(shown);
    assert_eq!(alive_before, 2, "the marker processes never ran; the exec gave {ended_shown:?}");
    assert_eq!(alive_after, 0, "a sandbox process outlived deprovision");
    match ended {
        Ok(out) => assert!(
            !out.timed_out && out.exit_code != 0 && !text(&out.stdout).contains("survived"),
            "the command is ended by deprovision, not by its timeout: {}",
            shown(&out)
        ),
        Err(e) => assert!(matches!(e, DriverError::NotFound(_) | DriverError::Failed(_)), "{e}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "took {:?}", started.elapsed());
    driver.deprovision(&id).await.expect("deprovision is idempotent");
    assert!(!driver.list().await.expect("list").contains(&id));
    let request = ExecRequest::new(vec!["true".into()], vec![], None).expect("request");
    assert!(matches!(driver.exec(&id, &request).await, Err(DriverError::NotFound(_))));
    assert!(matches!(
        driver.refresh_credential(&id, &SandboxToken::new("x"), &spec.environment).await,
        Err(DriverError::NotFound(_))
    ));

    // Durable: the same key comes back with its workspace.
    let again = spec_for(&org, "s1", "user-7", CallerClass::User, Durability::Durable, "tok-3");
    driver.provision(&again).await.expect("provision the same key");
    let out = run(driver, again.sandbox_id(), &["cat", "/workspace/kept"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "kept\n", "durable workspace survives deprovision");
    driver.deprovision(again.sandbox_id()).await.expect("deprovision");

    // Ephemeral: gone at deprovision.
    let eph = spec_for(&org, "s2", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-4");
    driver.provision(&eph).await.expect("provision ephemeral");
    run(driver, eph.sandbox_id(), &["sh", "-c", "echo x > /workspace/gone"], b"", 10_000).await;
    driver.deprovision(eph.sandbox_id()).await.expect("deprovision");
    let eph2 = spec_for(&org, "s2", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-5");
    driver.provision(&eph2).await.expect("provision ephemeral again");
    let out = run(driver, eph2.sandbox_id(), &["sh", "-c", "ls -A /workspace"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "", "ephemeral workspace starts empty");
    driver.deprovision(eph2.sandbox_id()).await.expect("deprovision");
}

/// The limits a driver under test was configured with, for [`resident_contract`].
#[derive(Debug, Clone, Copy)]
pub struct ContractLimits {
    /// Most processes of a sandbox.
    pub processes: u64,
    /// Most memory of a sandbox, in MiB.
    pub memory_mib: u64,
}

/// A nonce for markers in command lines.
pub fn nonce() -> u32 {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("entropy");
    u32::from_le_bytes(bytes) % 1_000_000
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The contract of a resident sandbox (one live process tree per sandbox): background
/// commands return at once, a cancelled exec leaves nothing behind, a refreshed token
/// reaches a running command, the environment follows the latest ensure, and limits hold
/// for the sandbox as a whole (processes and memory), after which commands run again.
pub async fn resident_contract(driver: std::sync::Arc<dyn SandboxDriver>, limits: ContractLimits) {
    let org = format!("org-{}", new_sandbox_id().as_str()[4..12].to_ascii_lowercase());
    let spec = spec_for(&org, "resident", "svc-3", CallerClass::Service, Durability::Ephemeral, "tok-a");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.expect("provision");

    // A background process does not hold the command: it returns at once.
    let started = std::time::Instant::now();
    let out = run(&*driver, &id, &["sh", "-c", "sleep 300 & echo hi"], b"", 20_000).await;
    assert_eq!((out.exit_code, text(&out.stdout), out.timed_out), (0, "hi\n".to_owned(), false), "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "took {:?}", started.elapsed());
    // The sandbox lives between commands: files in /tmp stay.
    run(&*driver, &id, &["sh", "-c", "echo kept > /tmp/between"], b"", 10_000).await;
    assert_eq!(text(&run(&*driver, &id, &["cat", "/tmp/between"], b"", 10_000).await.stdout), "kept\n");

    // Out of memory, the kernel ends a command, not the supervisor (PID 1): every command
    // starts with the largest OOM score, the supervisor keeps a lower one (it raises its
    // own only while it forks, so it is read a moment later).
    let script = "cat /proc/self/oom_score_adj; sleep 0.3; cat /proc/1/oom_score_adj";
    let scores = run(&*driver, &id, &["sh", "-c", script], b"", 10_000).await;
    let scores: Vec<i32> = text(&scores.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(scores.len(), 2, "both scores readable: {scores:?}");
    assert_eq!(scores[0], 1000, "a command's OOM score");
    assert!(scores[1] < 1000, "the supervisor's OOM score stays below its commands': {scores:?}");

    // A cancelled exec (the caller went away) leaves no process behind.
    let marker = format!("3100.{}", nonce());
    let pattern = format!("sleep {marker}");
    let task = {
        let driver = driver.clone();
        let id = id.clone();
        let script = format!("sleep {marker}; echo never");
        tokio::spawn(async move { run(&*driver, &id, &["sh", "-c", &script], b"", 60_000).await })
    };
    wait_for("the command to run (positive control)", || host_processes_with(&pattern) >= 1).await;
    task.abort();
    assert!(task.await.is_err(), "the exec was cancelled");
    wait_for("the cancelled command to end", || host_processes_with(&pattern) == 0).await;

    // A running command reads the refreshed token.
    let reader = {
        let driver = driver.clone();
        let id = id.clone();
        tokio::spawn(async move {
            run(
                &*driver,
                &id,
                &["sh", "-c", "cat /run/sandlane/token; echo; sleep 2; cat /run/sandlane/token"],
                b"",
                20_000,
            )
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let other = spec_for(&org, "resident", "svc-4", CallerClass::User, Durability::Ephemeral, "x");
    // The environment of a later ensure (another execution, another class) for the same id.
    let user = SandboxCaller::from_record(IdentityId::parse("svc-4").expect("identity"), CallerClass::User);
    let subject = domain::split::RecordSubject::new(&spec.key, other.environment.execution_id());
    let (_, next) = split_caller(&subject, &user, &id);
    driver.refresh_credential(&id, &SandboxToken::new("tok-b"), &next).await.expect("refresh");
    let out = reader.await.expect("reader");
    assert_eq!(text(&out.stdout), "tok-a\ntok-b", "the running command saw the refresh: {out:?}");
    let out =
        run(&*driver, &id, &["sh", "-c", "echo $SANDLANE_CALLER_CLASS $SANDLANE_EXECUTION_ID"], b"", 10_000)
            .await;
    assert_eq!(
        text(&out.stdout),
        format!("user {}\n", other.environment.execution_id()),
        "commands follow the environment of the latest ensure"
    );

    // Processes: one command fills the sandbox's process limit with background sleeps;
    // while they live, the next command cannot start 8 processes (the limit is the
    // sandbox's, not the command's); once they end, commands run again.
    let probe = "for i in 1 2 3 4 5 6 7 8; do sleep 6 & echo $i; done 2>/dev/null";
    let out = run(&*driver, &id, &["sh", "-c", probe], b"", 10_000).await;
    assert_eq!(text(&out.stdout).lines().count(), 8, "positive control: 8 processes start: {out:?}");
    let fill = format!(
        "i=0; while [ $i -lt {} ]; do sleep 6 & i=$((i+1)); done 2>/dev/null; echo filled",
        limits.processes * 2
    );
    let _ = run(&*driver, &id, &["sh", "-c", &fill], b"", 20_000).await;
    let blocked = run(&*driver, &id, &["sh", "-c", probe], b"", 10_000).await;
    assert!(
        text(&blocked.stdout).lines().count() < 8,
        "a second command started processes past the sandbox's process limit: {blocked:?}"
    );
    let mut again = None;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let out = run(&*driver, &id, &["sh", "-c", "echo alive"], b"", 10_000).await;
        if text(&out.stdout) == "alive\n" {
            again = Some(out);
            break;
        }
    }
    assert!(again.is_some(), "commands run again once the processes ended");
    // Wait for the sleeps to end so the memory check below has room.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;

    // Memory: one command holds 60 % of the sandbox's memory in the background; another
    // allocating 60 % more cannot succeed while the first holds it (one of them is
    // killed). Each alone fits (positive control).
    let share = limits.memory_mib * 6 / 10;
    let alone = format!("dd if=/dev/zero of=/dev/null bs={share}M count=1 2>/dev/null && echo ok2");
    let out = run(&*driver, &id, &["sh", "-c", &alone], b"", 20_000).await;
    assert_eq!(text(&out.stdout), "ok2\n", "positive control: {share} MiB fit alone: {out:?}");
    let hold = format!(
        "rm -f /tmp/ok1; {{ dd if=/dev/zero bs={share}M count=1 2>/dev/null && echo ok1 > /tmp/ok1; }} | {{ sleep 3; cat > /dev/null; }} &"
    );
    run(&*driver, &id, &["sh", "-c", &hold], b"", 20_000).await;
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let second = run(&*driver, &id, &["sh", "-c", &alone], b"", 20_000).await;
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let first =
        run(&*driver, &id, &["sh", "-c", "cat /tmp/ok1 2>/dev/null || echo killed1"], b"", 10_000).await;
    let both = text(&second.stdout) == "ok2\n" && text(&first.stdout) == "ok1\n";
    assert!(!both, "two commands together held more than the sandbox's memory: {second:?} {first:?}");
    let out = run(&*driver, &id, &["sh", "-c", "echo alive"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "alive\n", "the sandbox still runs commands: {out:?}");

    driver.deprovision(&id).await.expect("deprovision");
}

/// The org policy's contract (issue 14): a workspace quota the kernel enforces (a write
/// past it fails inside with `ENOSPC`, what fits stays), suspension (every process ends,
/// the workspace stays; the record is kept, listed, and not cleaned up by an exec), and
/// the resume (a provision of the same id with a newer epoch: same workspace, fresh
/// processes and token), for a durable and an ephemeral workspace; an ephemeral
/// workspace provisioned under another key of the same org (a warm sandbox adopted) can
/// be resumed under its key; deprovision ends it all.
pub async fn quota_and_suspend_contract(driver: &dyn SandboxDriver, org: &str) {
    for durability in [Durability::Durable, Durability::Ephemeral] {
        let mut spec =
            spec_for(org, &format!("quota-{}", nonce()), "u-quota", CallerClass::User, durability, "tok-a");
        spec.workspace_bytes = Some(8 << 20);
        driver.provision(&spec).await.expect("provision with a quota");
        let id = spec.sandbox_id().clone();
        let big = run(
            driver,
            &id,
            &["sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=12 2>&1; echo rc=$?"],
            b"",
            20_000,
        )
        .await;
        let said = text(&big.stdout);
        assert!(
            said.contains("No space left on device"),
            "{durability}: a write past the quota: {}",
            shown(&big)
        );
        assert!(!said.contains("rc=0"), "{durability}: {}", shown(&big));
        let fits = run(driver, &id, &["sh", "-c", "rm -f /workspace/big && dd if=/dev/zero of=/workspace/fits bs=1M count=7 2>/dev/null && echo kept > /workspace/note && echo ok"], b"", 20_000).await;
        assert_eq!(text(&fits.stdout), "ok\n", "{durability}: what fits is written: {}", shown(&fits));
        let marker = format!("{}", 700_000 + nonce() % 100_000);
        let bg = run(
            driver,
            &id,
            &["sh", "-c", &format!("sleep {marker} >/dev/null 2>&1 & echo started")],
            b"",
            5_000,
        )
        .await;
        assert_eq!(text(&bg.stdout), "started\n", "{}", shown(&bg));
        wait_for("the background process", || host_processes_with(&format!("sleep {marker}")) == 1).await;
        // A background process of the supervisor's, too.
        let kept = format!("{}", 800_000 + nonce() % 100_000);
        let process =
            ProcessRequest::new(vec!["sleep".into(), kept.clone()], Vec::new(), None).expect("process");
        driver.start_process(&id, &process, &ProcessCaps::default()).await.expect("a background process");
        wait_for("the supervisor's process", || host_processes_with(&format!("sleep {kept}")) == 1).await;
        // A file written past the quota through the supervisor: the disk is full, and
        // nothing of it is kept.
        let big = vec![1u8; 4 << 20];
        let written = driver.write_file(&id, &path("/workspace/past"), Chunks::of(&big, 1 << 20)).await;
        assert!(matches!(written, Err(DriverError::ResourceExhausted(_))), "{durability}: {written:?}");
        assert!(
            matches!(driver.read_path(&id, &path("/workspace/past")).await, Err(DriverError::NoSuchPath(_))),
            "{durability}: nothing of a file past the quota"
        );

        driver.suspend(&id).await.expect("suspend");
        wait_for("every process to end at suspend", || host_processes_with(&format!("sleep {marker}")) == 0)
            .await;
        wait_for("the background processes to end at suspend", || {
            host_processes_with(&format!("sleep {kept}")) == 0
        })
        .await;
        // Every supervisor operation is refused (not taken for a dead sandbox).
        assert!(
            matches!(driver.list_processes(&id).await, Err(DriverError::Failed(_))),
            "{durability}: processes of a suspended sandbox"
        );
        assert!(
            matches!(driver.read_path(&id, &path("/workspace/note")).await, Err(DriverError::Failed(_))),
            "{durability}: files of a suspended sandbox"
        );
        driver.suspend(&id).await.expect("suspend is idempotent");
        assert!(
            driver.list().await.expect("list").contains(&id),
            "{durability}: a suspended sandbox is still held"
        );
        let request = ExecRequest::new(vec!["true".into()], Vec::new(), None).expect("request");
        assert!(
            matches!(driver.exec(&id, &request).await, Err(DriverError::Failed(_))),
            "{durability}: an exec in a suspended sandbox is refused, not treated as a dead sandbox"
        );
        assert!(driver.list().await.expect("list").contains(&id), "{durability}: and nothing was cleaned up");

        // Resume: the same id, a newer epoch, a fresh token.
        spec.epoch = 2;
        spec.credential = SandboxToken::new("tok-b");
        driver.provision(&spec).await.expect("resume");
        let back = run(driver, &id, &["sh", "-c", "cat /workspace/note; cat \"$SANDLANE_TOKEN_FILE\"; echo; ls /workspace | sort | tr '\\n' ' '"], b"", 5_000).await;
        assert_eq!(
            text(&back.stdout),
            "kept\ntok-b\nfits note ",
            "{durability}: the workspace came back: {}",
            shown(&back)
        );
        assert_eq!(host_processes_with(&format!("sleep {marker}")), 0, "the old processes stay gone");
        // The quota still holds after the resume.
        let again = run(
            driver,
            &id,
            &["sh", "-c", "dd if=/dev/zero of=/workspace/more bs=1M count=4 2>&1; echo rc=$?"],
            b"",
            20_000,
        )
        .await;
        assert!(text(&again.stdout).contains("No space left on device"), "{durability}: {}", shown(&again));
        driver.deprovision(&id).await.expect("deprovision");
        assert!(!driver.list().await.expect("list").contains(&id));
    }

    // A warm sandbox: provisioned under its org's pool key, resumed under another key of
    // that org (its record was adopted); never under another org's.
    let base = spec_for(org, "warm", "sandlane:internal", CallerClass::Internal, Durability::Ephemeral, "");
    let mut warm = ProvisionSpec { key: domain::policy::warm_key(&OrgId::parse(org).expect("org")), ..base };
    warm.workspace_bytes = Some(4 << 20);
    driver.provision(&warm).await.expect("a warm sandbox");
    let id = warm.sandbox_id().clone();
    driver.suspend(&id).await.expect("suspend");
    let adopted = spec_for(org, "adopted", "u-adopter", CallerClass::Service, Durability::Ephemeral, "tok-c");
    let mut resumed = ProvisionSpec {
        epoch: 2,
        key: adopted.key.clone(),
        environment: warm.environment.clone(),
        ..warm.clone()
    };
    resumed.credential = SandboxToken::new("tok-c");
    let elsewhere =
        spec_for("other-org", "adopted", "u-adopter", CallerClass::Service, Durability::Ephemeral, "tok-c");
    let foreign = ProvisionSpec { key: elsewhere.key.clone(), epoch: 3, ..warm.clone() };
    assert!(driver.provision(&foreign).await.is_err(), "never under another org's key");
    // A plain ephemeral sandbox of the org is its key's: another key may not take it.
    let plain = spec_for(org, "plain", "u-1", CallerClass::Service, Durability::Ephemeral, "tok-d");
    driver.provision(&plain).await.expect("a plain ephemeral sandbox");
    let takeover = ProvisionSpec { key: adopted.key.clone(), epoch: 2, ..plain.clone() };
    assert!(driver.provision(&takeover).await.is_err(), "nor another key of the org, unless it is warm");
    driver.deprovision(plain.sandbox_id()).await.expect("deprovision");
    driver.provision(&resumed).await.expect("resumed under the adopting key");
    let out = run(driver, &id, &["cat", "/run/sandlane/token"], b"", 5_000).await;
    assert_eq!(text(&out.stdout), "tok-c", "{}", shown(&out));
    driver.deprovision(&id).await.expect("deprovision");
}

/// What [`streams_contract`] needs to know of the driver under test.
#[derive(Debug, Clone)]
pub struct StreamsLimits {
    /// The driver's output cap per stream, in bytes.
    pub output_cap: u64,
    /// The sandbox's file size limit (`RLIMIT_FSIZE`), in bytes.
    pub file_size_bytes: u64,
    /// A directory of the host (the driver's data dir) that no path may reach.
    pub host_dir: std::path::PathBuf,
}

/// Chunks handed to the driver as an upload; `fail_after` makes it fail past that many.
pub struct Chunks {
    chunks: std::collections::VecDeque<Vec<u8>>,
    fail_after: Option<usize>,
    given: usize,
}

impl Chunks {
    /// An upload of `bytes` in chunks of `size`.
    pub fn of(bytes: &[u8], size: usize) -> Box<Self> {
        Box::new(Self {
            chunks: bytes.chunks(size.max(1)).map(<[u8]>::to_vec).collect(),
            fail_after: None,
            given: 0,
        })
    }

    /// The same upload failing after `n` chunks (as a client that goes away).
    pub fn failing_after(bytes: &[u8], size: usize, n: usize) -> Box<Self> {
        let mut chunks = Self::of(bytes, size);
        chunks.fail_after = Some(n);
        chunks
    }
}

#[async_trait::async_trait]
impl ports::driver::ByteSource for Chunks {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, ports::driver::SourceError> {
        if self.fail_after.is_some_and(|n| self.given >= n) {
            return Err(ports::driver::SourceError("the client went away".into()));
        }
        self.given += 1;
        Ok(self.chunks.pop_front())
    }
}

/// Everything an output stream gives, to its end: (stdout, stderr, exit).
pub async fn drain(
    stream: &mut dyn ports::driver::OutputStream,
) -> (Vec<u8>, Vec<u8>, Option<domain::ExitStatus>) {
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(event) = stream.next().await.expect("the stream goes on") {
        match event {
            domain::OutputEvent::Stdout(b) => out.extend(b),
            domain::OutputEvent::Stderr(b) => err.extend(b),
            domain::OutputEvent::Exit(e) => exit = Some(e),
        }
    }
    (out, err, exit)
}

/// Everything a byte stream gives, to its end.
pub async fn bytes_of(stream: &mut dyn ports::driver::ByteStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await.expect("the stream goes on") {
        assert!(!chunk.is_empty(), "a chunk is never empty");
        out.extend(chunk);
    }
    out
}

/// Every entry of a listing, checking each batch is not empty; also how many batches.
pub async fn entries_of(stream: &mut dyn ports::driver::EntryStream) -> (Vec<domain::DirEntry>, usize) {
    let (mut out, mut batches) = (Vec::new(), 0);
    while let Some(batch) = stream.next().await.expect("the listing goes on") {
        assert!(!batch.is_empty(), "a batch is never empty");
        out.extend(batch);
        batches += 1;
    }
    (out, batches)
}

fn path(p: &str) -> domain::SandboxPath {
    domain::SandboxPath::parse(p).expect("a valid path")
}

/// The contract of what an agent does inside a sandbox: streaming exec (output before
/// the exit, binary-safe, capped, timed out, ended when dropped), background processes
/// (kept across connections, replayed and followed, fed, signalled, capped), files (read,
/// written whole with parents, owned by the sandbox user, deleted, listed; never through
/// a link that leads out; an abandoned or oversized upload leaves nothing) and archives
/// both ways.
#[allow(clippy::too_many_lines)]
pub async fn streams_contract(driver: std::sync::Arc<dyn SandboxDriver>, limits: StreamsLimits) {
    use domain::{OutputEvent, ProcessCaps, ProcessRequest, Signal};
    use ports::driver::ReadOutcome;
    let org = format!("org-{}", new_sandbox_id().as_str()[4..12].to_ascii_lowercase());
    let spec = spec_for(&org, "streams", "svc-5", CallerClass::Service, Durability::Ephemeral, "tok-s");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.expect("provision");
    let req = |argv: &[&str], stdin: &[u8], timeout: u64| {
        ExecRequest::new(argv.iter().map(|a| (*a).to_owned()).collect(), stdin.to_vec(), Some(timeout))
            .expect("valid request")
    };

    // Streaming exec: the first output arrives while the command still runs.
    let started = std::time::Instant::now();
    let mut stream = driver
        .exec_stream(&id, &req(&["sh", "-c", "echo one; sleep 2; echo two >&2; exit 4"], b"", 20_000))
        .await
        .expect("exec_stream starts");
    let first = stream.next().await.expect("first event");
    let first_at = started.elapsed();
    assert_eq!(first, Some(OutputEvent::Stdout(b"one\n".to_vec())));
    assert!(first_at < std::time::Duration::from_millis(1500), "the first frame took {first_at:?}");
    let (out, err, exit) = drain(&mut *stream).await;
    assert!(started.elapsed() >= std::time::Duration::from_secs(2), "positive control: the command slept");
    assert_eq!((out, err), (Vec::new(), b"two\n".to_vec()));
    assert_eq!(exit.map(|e| (e.exit_code, e.timed_out, e.truncated)), Some((4, false, false)));
    assert!(stream.next().await.expect("after the exit").is_none(), "nothing after the exit");

    // Binary-safe, fed from stdin, capped, timed out, a program that cannot start.
    let bytes: Vec<u8> = (0..=255u8).collect();
    let mut stream = driver.exec_stream(&id, &req(&["cat"], &bytes, 10_000)).await.expect("cat");
    let (out, _, exit) = drain(&mut *stream).await;
    assert_eq!((out, exit.map(|e| e.exit_code)), (bytes.clone(), Some(0)));
    let over = limits.output_cap + 1000;
    let script = format!("head -c {over} /dev/zero");
    let mut stream = driver.exec_stream(&id, &req(&["sh", "-c", &script], b"", 10_000)).await.expect("cap");
    let (out, _, exit) = drain(&mut *stream).await;
    assert_eq!(out.len() as u64, limits.output_cap, "capped at the driver's cap");
    assert!(exit.is_some_and(|e| e.truncated), "{exit:?}");
    let mut stream = driver.exec_stream(&id, &req(&["sleep", "30"], b"", 300)).await.expect("timeout");
    let (_, _, exit) = drain(&mut *stream).await;
    assert!(exit.is_some_and(|e| e.timed_out), "{exit:?}");
    let mut stream = driver.exec_stream(&id, &req(&["/no/such/program"], b"", 1000)).await.expect("127");
    let (_, err, exit) = drain(&mut *stream).await;
    assert_eq!(exit.map(|e| e.exit_code), Some(127));
    assert!(!err.is_empty(), "the reason is on standard error");

    // Dropping the stream ends the command.
    let marker = format!("3200.{}", nonce());
    let script = format!("echo up; sleep {marker}");
    let mut stream = driver.exec_stream(&id, &req(&["sh", "-c", &script], b"", 60_000)).await.expect("drop");
    assert_eq!(stream.next().await.expect("up"), Some(OutputEvent::Stdout(b"up\n".to_vec())));
    wait_for("the command to run (positive control)", || {
        host_processes_with(&format!("sleep {marker}")) >= 1
    })
    .await;
    drop(stream);
    wait_for("the dropped command to end", || host_processes_with(&format!("sleep {marker}")) == 0).await;

    // Background processes: kept across connections, replayed, followed, fed, signalled.
    let caps = ProcessCaps { max_processes: 3, buffer_bytes: 64 << 10, max_buffered_bytes: 1 << 20 };
    let preq = |argv: &[&str], stdin: &[u8], timeout: Option<u64>| {
        ProcessRequest::new(argv.iter().map(|a| (*a).to_owned()).collect(), stdin.to_vec(), timeout)
            .expect("valid process")
    };
    let loop_script = "echo started; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done";
    let ticker =
        driver.start_process(&id, &preq(&["sh", "-c", loop_script], b"", None), &caps).await.expect("start");
    assert!(ticker.running && ticker.exit_code.is_none(), "{ticker:?}");
    let cat = driver.start_process(&id, &preq(&["cat"], b"first ", None), &caps).await.expect("start cat");
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let listed = driver.list_processes(&id).await.expect("list");
    let pids: Vec<u32> = listed.iter().map(|p| p.pid).collect();
    assert!(pids.contains(&ticker.pid) && pids.contains(&cat.pid), "{listed:?}");
    assert_eq!(driver.process(&id, ticker.pid).await.expect("status").argv, vec!["sh", "-c", loop_script]);
    let mut replay = driver.process_output(&id, ticker.pid, false).await.expect("replay");
    let (out, _, exit) = drain(&mut *replay).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("started\ntick 1\n"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert!(exit.is_none(), "still running: no exit without follow");
    driver.write_stdin(&id, cat.pid, b"second", true).await.expect("stdin");
    let mut followed = driver.process_output(&id, cat.pid, true).await.expect("follow");
    let (out, _, exit) = drain(&mut *followed).await;
    assert_eq!(out, b"first second", "the first input, then the written one; closing ends cat");
    assert_eq!(exit.map(|e| e.exit_code), Some(0));
    let ended = driver.process(&id, cat.pid).await.expect("status");
    assert_eq!((ended.running, ended.exit_code), (false, Some(0)));
    assert!(matches!(driver.write_stdin(&id, cat.pid, b"x", false).await, Err(DriverError::Conflict(_))));
    assert!(matches!(driver.signal_process(&id, cat.pid, Signal::Term).await, Err(DriverError::Conflict(_))));
    assert!(matches!(
        driver.process(&id, 999_999).await,
        Err(DriverError::NoSuchProcess { pid: 999_999, .. })
    ));
    // A follower sees the ticker's new output, then its end by SIGTERM.
    let mut follow = driver.process_output(&id, ticker.pid, true).await.expect("follow the ticker");
    let signaller = {
        let driver = driver.clone();
        let id = id.clone();
        let pid = ticker.pid;
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            driver.signal_process(&id, pid, Signal::Term).await
        })
    };
    let (out, _, exit) = drain(&mut *follow).await;
    signaller.await.expect("signaller").expect("SIGTERM sent");
    assert!(String::from_utf8_lossy(&out).contains("tick 3"), "{:?}", String::from_utf8_lossy(&out));
    assert_eq!(exit.map(|e| e.exit_code), Some(128 + 15), "SIGTERM ended it");
    // Caps: with every kept process running, a start is refused; an ended one makes room.
    let tiny = ProcessCaps { max_processes: 2, ..caps };
    let a = driver.start_process(&id, &preq(&["sleep", "60"], b"", None), &tiny).await.expect("a");
    let b = driver
        .start_process(&id, &preq(&["sleep", "60"], b"", None), &tiny)
        .await
        .expect("b: ended ones made room");
    let refused = driver.start_process(&id, &preq(&["sleep", "60"], b"", None), &tiny).await;
    assert!(matches!(refused, Err(DriverError::ResourceExhausted(_))), "{refused:?}");
    driver.signal_process(&id, a.pid, Signal::Kill).await.expect("kill");
    let mut end = driver.process_output(&id, a.pid, true).await.expect("follow a");
    assert_eq!(drain(&mut *end).await.2.map(|e| e.exit_code), Some(128 + 9));
    let timed =
        driver.start_process(&id, &preq(&["sleep", "60"], b"", Some(300)), &tiny).await.expect("room made");
    let mut end = driver.process_output(&id, timed.pid, true).await.expect("follow");
    assert!(drain(&mut *end).await.2.is_some_and(|e| e.timed_out), "the timeout ended it");
    driver.signal_process(&id, b.pid, Signal::Kill).await.expect("kill b");
    let spawn_failure = driver.start_process(&id, &preq(&["/no/such/program"], b"", None), &caps).await;
    assert!(matches!(spawn_failure, Err(DriverError::NoSuchPath(_))), "{spawn_failure:?}");
    let not_executable = driver.start_process(&id, &preq(&["/etc"], b"", None), &caps).await;
    assert!(matches!(not_executable, Err(DriverError::Conflict(_))), "{not_executable:?}");

    // Terminals: a process on a pseudo-terminal of its own, resized and typed into over one
    // input, its output the terminal's, its exit its own.
    let terminal = domain::TerminalRequest::new(Some(vec!["sh".into()]), 80, 24).expect("a terminal");
    let terminal_id = domain::TerminalId::generate(1, u128::from(nonce()));
    let term =
        driver.start_process(&id, &terminal.process(terminal_id.clone()), &caps).await.expect("terminal");
    assert_eq!(term.terminal.as_ref(), Some(&terminal_id), "{term:?}");
    let mut output = driver.process_output(&id, term.pid, true).await.expect("follow the terminal");
    let mut input = driver.process_input(&id, term.pid).await.expect("the terminal's input");
    let size = domain::TerminalSize::new(132, 43).expect("a size");
    input.send(domain::TerminalInput::Resize(size)).await.expect("resize");
    let keys = b"stty size; echo TERM=$TERM; exit 3\n".to_vec();
    input.send(domain::TerminalInput::Bytes(keys)).await.expect("keys");
    let (out, err, exit) = drain(&mut *output).await;
    let typed = String::from_utf8_lossy(&out);
    assert!(typed.contains("43 132") && typed.contains("TERM=xterm-256color"), "{typed:?}");
    assert!(err.is_empty(), "one stream: the terminal's");
    assert_eq!(exit.map(|e| e.exit_code), Some(3));
    let closed = driver.process_input(&id, term.pid).await;
    assert!(matches!(closed, Err(DriverError::Conflict(_))), "an ended terminal takes no input");

    // Files: written whole with parents, read back, listed, owned by the sandbox's user.
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let written = driver.write_file(&id, &path("/workspace/a/b/blob.bin"), Chunks::of(&blob, 10_000)).await;
    assert_eq!(written.expect("write"), blob.len() as u64);
    match driver.read_path(&id, &path("a/b/blob.bin")).await.expect("read") {
        ReadOutcome::File { size, mut contents } => {
            assert_eq!(size, blob.len() as u64);
            assert_eq!(bytes_of(&mut *contents).await, blob);
        }
        ReadOutcome::Directory(_) => panic!("a file"),
    }
    match driver.read_path(&id, &path("/workspace/a/b")).await.expect("list") {
        ReadOutcome::Directory(mut listing) => {
            let (entries, _) = entries_of(&mut *listing).await;
            assert_eq!(entries.len(), 1);
            assert_eq!(
                (entries[0].name.as_str(), entries[0].kind, entries[0].size),
                ("blob.bin", domain::EntryKind::File, blob.len() as u64)
            );
        }
        ReadOutcome::File { .. } => panic!("a directory"),
    }
    // A bigger directory comes in several batches, sorted across them.
    let out = run(&*driver, &id, &["sh", "-c", "mkdir /workspace/many && cd /workspace/many && for i in $(seq 1000 1249); do : > f$i; done && echo made"], b"", 30_000).await;
    assert_eq!(text(&out.stdout), "made\n", "{}", shown(&out));
    match driver.read_path(&id, &path("/workspace/many")).await.expect("list") {
        ReadOutcome::Directory(mut listing) => {
            let (entries, batches) = entries_of(&mut *listing).await;
            let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
            assert_eq!(names, (1000..1250).map(|i| format!("f{i}")).collect::<Vec<_>>());
            assert!(batches > 1, "a listing of 250 entries is streamed in batches, got {batches}");
        }
        ReadOutcome::File { .. } => panic!("a directory"),
    }
    driver.delete_path(&id, &path("/workspace/many"), true).await.expect("delete the many");
    let out = run(&*driver, &id, &["sh", "-c", "[ \"$(stat -c %u /workspace/a/b/blob.bin)\" = \"$(id -u)\" ] && [ -O /workspace/a ] && echo mine"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "mine\n", "the sandbox's user owns what was written: {}", shown(&out));
    driver.write_file(&id, &path("/tmp/t.txt"), Chunks::of(b"in tmp", 3)).await.expect("write /tmp");
    assert_eq!(text(&run(&*driver, &id, &["cat", "/tmp/t.txt"], b"", 10_000).await.stdout), "in tmp");

    // An abandoned upload and one past the file size limit leave nothing.
    let failed = driver
        .write_file(&id, &path("/workspace/partial.bin"), Chunks::failing_after(&blob, 10_000, 3))
        .await;
    assert!(matches!(failed, Err(DriverError::Source(_))), "{failed:?}");
    let too_big = vec![7u8; usize::try_from(limits.file_size_bytes).expect("fits") + 4096];
    let failed = driver.write_file(&id, &path("/workspace/big.bin"), Chunks::of(&too_big, 64 << 10)).await;
    assert!(matches!(failed, Err(DriverError::TooLarge(_))), "{failed:?}");
    let out = run(&*driver, &id, &["sh", "-c", "ls -A /workspace"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "a\n", "no partial file, no temporary file: {}", shown(&out));

    // Paths never lead out: a link to the host's data dir, an absolute link, `..` in a link.
    let host = limits.host_dir.display().to_string();
    let script = format!(
        "ln -s '{host}' /workspace/host; ln -s /etc /workspace/etc; ln -s ../../.. /workspace/up; \
         mkdir -p /tmp/target && echo keep > /tmp/target/f && ln -s /tmp/target /workspace/tlink"
    );
    assert_eq!(run(&*driver, &id, &["sh", "-c", &script], b"", 10_000).await.exit_code, 0);
    for p in [
        "/workspace/host",
        "/workspace/host/sandlane.db",
        "/workspace/etc/passwd",
        "/workspace/up/etc/passwd",
    ] {
        let got = driver.read_path(&id, &path(p)).await;
        assert!(matches!(got, Err(DriverError::Invalid(_))), "{p}: {:?}", got.map(|_| ()));
    }
    for p in ["/workspace/host/new", "/workspace/etc/new", "/workspace/up/etc/new", "/workspace/host/a/b"] {
        let got = driver.write_file(&id, &path(p), Chunks::of(b"x", 1)).await;
        assert!(matches!(got, Err(DriverError::Invalid(_))), "{p}: {got:?}");
        let got = driver.delete_path(&id, &path(p), true).await;
        assert!(matches!(got, Err(DriverError::Invalid(_))), "{p}: {got:?}");
    }
    assert!(
        !limits.host_dir.join("new").exists() && !limits.host_dir.join("a").exists(),
        "nothing reached the host"
    );
    let got = driver.archive_out(&id, &path("/workspace/up")).await;
    assert!(matches!(got, Err(DriverError::Invalid(_))), "{:?}", got.map(|_| ()));
    assert!(matches!(
        driver.read_path(&id, &path("/workspace/nothing")).await,
        Err(DriverError::NoSuchPath(_))
    ));

    // Archives both ways, byte-exact; the links inside travel as links.
    let tree = "mkdir -p /workspace/tree/d/e && printf 'x%.0s' $(seq 1 5000) > /workspace/tree/d/e/f && \
                printf 'hi' > /workspace/tree/g && ln -s d/e/f /workspace/tree/l";
    assert_eq!(run(&*driver, &id, &["sh", "-c", tree], b"", 10_000).await.exit_code, 0);
    let mut archive = driver.archive_out(&id, &path("/workspace/tree")).await.expect("archive out");
    let tar = bytes_of(&mut *archive).await;
    let unpacked =
        driver.archive_in(&id, &path("/tmp/copy"), Chunks::of(&tar, 7000)).await.expect("archive in");
    assert!(unpacked.entries >= 5 && unpacked.bytes == 5002, "{unpacked:?}");
    let sums = "cd $0 && find . | sort && find . -type f | sort | xargs md5sum && readlink l";
    let a = run(&*driver, &id, &["sh", "-c", sums, "/workspace/tree"], b"", 10_000).await;
    let b = run(&*driver, &id, &["sh", "-c", sums, "/tmp/copy"], b"", 10_000).await;
    assert_eq!(a.exit_code, 0, "{}", shown(&a));
    assert_eq!(text(&a.stdout), text(&b.stdout), "the tree round-trips");

    // Deletes: a link (not its target), a tree; a root never.
    driver.delete_path(&id, &path("/workspace/etc"), false).await.expect("delete a link");
    driver.delete_path(&id, &path("/workspace/tlink"), true).await.expect("delete a link to a directory");
    assert!(matches!(
        driver.delete_path(&id, &path("/workspace/tree"), false).await,
        Err(DriverError::Conflict(_))
    ));
    driver.delete_path(&id, &path("/workspace/tree"), true).await.expect("delete a tree");
    assert!(matches!(
        driver.delete_path(&id, &path("/workspace"), true).await,
        Err(DriverError::Conflict(_))
    ));
    let out = run(&*driver, &id, &["sh", "-c", "ls -A /workspace; cat /tmp/target/f"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "a\nhost\nup\nkeep\n", "a link goes, never its target: {}", shown(&out));

    // Background processes end with the sandbox.
    let marker = format!("3300.{}", nonce());
    let kept = driver.start_process(&id, &preq(&["sleep", &marker], b"", None), &caps).await.expect("start");
    assert!(kept.running);
    wait_for("the background process to run (positive control)", || {
        host_processes_with(&format!("sleep {marker}")) == 1
    })
    .await;
    driver.deprovision(&id).await.expect("deprovision");
    wait_for("the background process to end with its sandbox", || {
        host_processes_with(&format!("sleep {marker}")) == 0
    })
    .await;
    assert!(matches!(driver.list_processes(&id).await, Err(DriverError::NotFound(_))));
}

/// A page server on the host's loopback standing in for the outside world: every
/// request is counted and answered `page` (hyper's server, as the proxy's).
pub async fn page_server(page: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the page server");
    let port = listener.local_addr().expect("its address").port();
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hits = counted.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(page.as_bytes()),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, hits)
}

/// A server that, once a connection sends anything, writes to it without end; counts the
/// connections whose writes failed (their client went away).
pub async fn endless_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("its address").port();
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = ended.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let ended = counted.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let _ = stream.read(&mut first).await;
                let chunk = vec![b'x'; 64 << 10];
                while stream.write_all(&chunk).await.is_ok() {}
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (port, ended)
}

/// A gate for the egress contract: `allowed.test` (on `port` or `other_port` only) goes
/// to the host's loopback at that port; everything else is refused.
pub struct TestGate {
    /// The page server's port.
    pub port: u16,
    /// Another port allowed (the endless server's).
    pub other_port: u16,
    /// The requests it saw, as `kind host:port`.
    pub seen: std::sync::Mutex<Vec<String>>,
}

struct NoBudget;

impl ports::EgressBudget for NoBudget {
    fn spend(&self, _bytes: u64) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl ports::EgressGate for TestGate {
    async fn open(&self, request: &ports::EgressRequest) -> Result<ports::EgressGrant, ports::EgressRefusal> {
        self.seen.lock().expect("lock").push(format!(
            "{} {}:{}",
            request.kind.as_str(),
            request.host,
            request.port
        ));
        if request.host == "allowed.test" && (request.port == self.port || request.port == self.other_port) {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], request.port));
            return Ok(ports::EgressGrant { addrs: vec![addr], budget: Box::new(NoBudget), broker: None });
        }
        Err(ports::EgressRefusal::NotAllowed(format!("{}:{} is not allowed", request.host, request.port)))
    }
}

/// The egress contract: through the proxy on the sandbox's loopback (as its environment
/// names it), `fetch URL` (a command printing the page, run by `sh -c`) reaches an allowed
/// host and is refused another with the gate's message; `direct PORT` (a direct
/// connection to the same server, bypassing the proxy) fails; when the sandbox ends,
/// serving ends. `connect_probe` (curl only): a `CONNECT` tunnel reaches it too, and a
/// client that goes away in the middle of an endless download takes the destination's
/// connection with it. `path` is run on the sandbox before it ends, to check which way
/// the proxy's connections came (the supervisor's counts: handed over or relayed in
/// frames).
pub async fn egress_contract(
    driver: std::sync::Arc<dyn SandboxDriver>,
    spec: ProvisionSpec,
    fetch: &str,
    direct: &str,
    connect_probe: bool,
    path: impl AsyncFnOnce(&SandboxId),
) {
    use std::sync::atomic::Ordering;
    let (port, hits) = page_server("egress page\n").await;
    let (endless, ended) = endless_server().await;
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.expect("provision");
    let gate =
        std::sync::Arc::new(TestGate { port, other_port: endless, seen: std::sync::Mutex::new(Vec::new()) });
    let serving = tokio::spawn({
        let (driver, id, gate) = (driver.clone(), id.clone(), gate.clone());
        async move { driver.serve_egress(&id, gate).await }
    });
    let sh = |script: String| {
        let (driver, id) = (driver.clone(), id.clone());
        async move { run(driver.as_ref(), &id, &["sh", "-c", &script], b"", 20_000).await }
    };

    let out = sh(format!("{fetch} http://allowed.test:{port}/page")).await;
    assert_eq!((out.exit_code, text(&out.stdout).as_str()), (0, "egress page\n"), "{}", shown(&out));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    if connect_probe {
        let out = sh(format!("curl -sS --max-time 10 -p http://allowed.test:{port}/tunnelled")).await;
        assert_eq!((out.exit_code, text(&out.stdout).as_str()), (0, "egress page\n"), "{}", shown(&out));
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        // The client gives up in the middle of an endless answer: the destination's
        // connection ends too (nothing keeps pulling bytes for nobody).
        let out =
            sh(format!("curl -s --max-time 2 -p -o /dev/null http://allowed.test:{endless}/; echo $?")).await;
        assert_ne!(text(&out.stdout).trim(), "0", "{}", shown(&out));
        // Within 5 s: well past a prompt close under load, well short of the 10 s a
        // Kubernetes pod's gate holds a connection its supervisor closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while ended.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "the destination's connection outlived its client");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let before = hits.load(Ordering::SeqCst);
    let out = sh(format!("{fetch} http://denied.test:{port}/page")).await;
    assert!(
        text(&out.stdout).contains("sandlane egress: denied.test") || text(&out.stderr).contains("403"),
        "{}",
        shown(&out)
    );
    // A direct connection, bypassing the proxy, finds nothing: the sandbox has only its own loopback.
    let out = sh(format!("{direct} {port}")).await;
    assert_ne!(out.exit_code, 0, "a direct connection must fail: {}", shown(&out));
    assert_eq!(hits.load(Ordering::SeqCst), before, "nothing reached the server but through the proxy");
    let seen = gate.seen.lock().expect("lock").clone();
    assert!(seen.contains(&format!("http allowed.test:{port}")), "{seen:?}");
    assert!(seen.contains(&format!("http denied.test:{port}")), "{seen:?}");
    if connect_probe {
        assert!(seen.contains(&format!("connect allowed.test:{port}")), "{seen:?}");
    }
    path(&id).await;

    driver.deprovision(&id).await.expect("deprovision");
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), serving).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "serving ends with the sandbox: {ended:?}");
}

/// A TLS server on the host's loopback standing in for a brokered API (`api.test`): its
/// certificate is signed by a test CA written to `ca_file` (the driver's
/// `upstream_ca_file`). It records the `authorization` headers it receives with each
/// path, answers `upstream ok` (never echoing a header), and serves a one-ref Git smart
/// HTTP advertisement at `…/info/refs`.
pub struct BrokeredUpstream {
    /// Its port.
    pub port: u16,
    /// The test CA's certificate (PEM), for the driver's `upstream_ca_file`.
    pub ca_file: tempfile::NamedTempFile,
    /// `(path, authorization values)` per request.
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
}

/// A request the brokered upstream received: its path and its `authorization` values.
pub type Seen = (String, Vec<String>);

/// The host name the brokered contract's secret is for.
pub const BROKERED_HOST: &str = "api.test";

/// The object id the Git advertisement names.
const GIT_REF: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

impl BrokeredUpstream {
    /// Starts it.
    pub async fn start() -> Self {
        use std::sync::Arc;
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "brokered upstream test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec![BROKERED_HOST.to_owned()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("leaf");
        let mut ca_file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut ca_file, ca_cert.pem().as_bytes()).expect("write");
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone()], key)
                .expect("config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, recorded) = (acceptor.clone(), recorded.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else { return };
                    let service =
                        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let auth = request
                                .headers()
                                .get_all("authorization")
                                .iter()
                                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                                .collect();
                            let path = request.uri().path().to_owned();
                            recorded.lock().expect("lock").push((path.clone(), auth));
                            let response = if path.ends_with("/info/refs") {
                                let line = format!("{GIT_REF} refs/heads/main\0side-band-64k\n");
                                let body = format!(
                                    "001e# service=git-upload-pack\n0000{:04x}{line}0000",
                                    line.len() + 4
                                );
                                hyper::Response::builder()
                                    .header("content-type", "application/x-git-upload-pack-advertisement")
                                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            } else {
                                hyper::Response::builder().body(http_body_util::Full::new(
                                    bytes::Bytes::from_static(b"upstream ok\n"),
                                ))
                            };
                            async move { response }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { port, ca_file, seen }
    }
}

/// A gate granting [`BROKERED_HOST`] on the upstream's port, brokered: `authorization`
/// set to `value` for `GET` under `/repos`; every use recorded.
pub struct BrokerGate {
    /// The upstream's port.
    pub port: u16,
    /// The secret's rendered value.
    pub value: String,
    /// Every use recorded.
    pub uses: std::sync::Arc<std::sync::Mutex<Vec<ports::egress::BrokerUse>>>,
}

struct RecordingAudit(std::sync::Arc<std::sync::Mutex<Vec<ports::egress::BrokerUse>>>);

#[async_trait::async_trait]
impl ports::egress::BrokerAudit for RecordingAudit {
    async fn record(&self, used: &ports::egress::BrokerUse) -> bool {
        self.0.lock().expect("lock").push(used.clone());
        true
    }
}

#[async_trait::async_trait]
impl ports::EgressGate for BrokerGate {
    async fn open(&self, request: &ports::EgressRequest) -> Result<ports::EgressGrant, ports::EgressRefusal> {
        if request.host != BROKERED_HOST || request.port != self.port {
            return Err(ports::EgressRefusal::NotAllowed(format!("{} is not allowed", request.host)));
        }
        let broker = ports::egress::Brokered {
            injections: vec![domain::broker::Injection {
                secret: "api-token".to_owned(),
                header: "authorization".to_owned(),
                value: domain::secret::SecretValue::new(self.value.clone()),
                methods: vec!["GET".to_owned()],
                paths: vec!["/repos".to_owned()],
            }],
            audit: std::sync::Arc::new(RecordingAudit(self.uses.clone())),
        };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        Ok(ports::EgressGrant { addrs: vec![addr], budget: Box::new(NoBudget), broker: Some(broker) })
    }
}

/// Which clients the brokered contract runs inside the sandbox.
#[derive(Debug, Clone, Copy, Default)]
pub struct BrokeredClients {
    /// `curl` (the header reaches the upstream; a method outside the binding is refused).
    pub curl: bool,
    /// Python's `urllib` (`python3`).
    pub python: bool,
    /// `git ls-remote` over smart HTTP.
    pub git: bool,
}

/// The brokered-secrets contract, on a driver built with `upstream.ca_file` as its
/// `upstream_ca_file`: the sandbox's CA is at `/run/sandlane/ca.pem`, the bundle and the
/// environment name it, the CA's key is not in the sandbox; with the clients given, an
/// HTTPS request made with nothing but the sandbox's environment reaches the upstream
/// with the injected `authorization` (the sandbox's own replaced), a method outside the
/// binding is refused (403, recorded); and the secret's value is found nowhere the
/// sandbox can read (its own files, every process's environment and command line).
pub async fn brokered_contract(
    driver: std::sync::Arc<dyn SandboxDriver>,
    spec: ProvisionSpec,
    upstream: &BrokeredUpstream,
    clients: BrokeredClients,
) {
    let value = format!("Bearer brokered-{:08x}{:08x}", nonce(), nonce());
    let uses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.expect("provision");
    let gate =
        std::sync::Arc::new(BrokerGate { port: upstream.port, value: value.clone(), uses: uses.clone() });
    let serving = tokio::spawn({
        let (driver, id, gate) = (driver.clone(), id.clone(), gate.clone());
        async move { driver.serve_egress(&id, gate).await }
    });
    let sh = |script: String| {
        let (driver, id) = (driver.clone(), id.clone());
        async move { run(driver.as_ref(), &id, &["sh", "-c", &script], b"", 30_000).await }
    };

    // The CA and the bundle, named by the environment; no key.
    let out = sh("head -1 /run/sandlane/ca.pem; grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\"; \
                  for v in SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO NODE_EXTRA_CA_CERTS; \
                  do eval \"echo \\$$v\"; done; ls -A /run/sandlane; \
                  grep -rl 'PRIVATE KEY' /run /tmp /workspace 2>/dev/null | sed 's/^/KEY /'; true"
        .to_owned())
    .await;
    let text_out = text(&out.stdout);
    let lines: Vec<&str> = text_out.lines().collect();
    assert_eq!(lines.first().copied(), Some("-----BEGIN CERTIFICATE-----"), "{}", shown(&out));
    let in_bundle: usize = lines.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(in_bundle >= 1, "{}", shown(&out));
    assert_eq!(
        lines.get(2..7),
        Some(
            [
                "/run/sandlane/ca-bundle.pem",
                "/run/sandlane/ca-bundle.pem",
                "/run/sandlane/ca-bundle.pem",
                "/run/sandlane/ca-bundle.pem",
                "/run/sandlane/ca.pem"
            ]
            .as_slice()
        ),
        "{}",
        shown(&out)
    );
    assert!(!text_out.contains("ca.key") && !text_out.contains("KEY "), "a key is readable: {}", shown(&out));

    let url = format!("https://{BROKERED_HOST}:{}", upstream.port);
    let mut expected_requests = 0;
    if clients.curl {
        let out = sh(format!(
            "curl -sS --max-time 20 -H 'Authorization: Bearer the-sandbox-own' {url}/repos/acme/issues"
        ))
        .await;
        assert_eq!((out.exit_code, text(&out.stdout).as_str()), (0, "upstream ok\n"), "{}", shown(&out));
        expected_requests += 1;
        let out =
            sh(format!("curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' -X DELETE {url}/repos/acme"))
                .await;
        assert_eq!(text(&out.stdout), "403", "{}", shown(&out));
    }
    if clients.python {
        let script = format!(
            "import urllib.request; print(urllib.request.urlopen('{url}/repos/acme/py', timeout=20).read().decode(), end='')"
        );
        let out = sh(format!("python3 -c \"{script}\"")).await;
        assert_eq!((out.exit_code, text(&out.stdout).as_str()), (0, "upstream ok\n"), "{}", shown(&out));
        expected_requests += 1;
    }
    if clients.git {
        let out = sh(format!("cd /tmp && git ls-remote {url}/repos/acme.git")).await;
        assert_eq!(
            (out.exit_code, text(&out.stdout).as_str()),
            (0, format!("{GIT_REF}\trefs/heads/main\n").as_str()),
            "{}",
            shown(&out)
        );
        expected_requests += 1;
    }
    let seen = upstream.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), expected_requests, "only allowed requests reached the upstream: {seen:?}");
    for (path, auth) in &seen {
        assert_eq!(
            auth,
            &vec![value.clone()],
            "{path}: the injected value alone, the sandbox's own replaced"
        );
    }
    let recorded = uses.lock().expect("lock").clone();
    assert_eq!(recorded.iter().filter(|u| u.allowed).count(), expected_requests, "{recorded:?}");
    if clients.curl {
        assert!(
            recorded.iter().any(|u| !u.allowed && u.method == "DELETE" && u.path == "/repos/acme"),
            "{recorded:?}"
        );
    }

    // The value is nowhere the sandbox can read: the files it can write or was given
    // (the rest is the host's read-only system binds, or the image), every process's
    // environment and command line. The value to look for comes on the search's standard
    // input, so no command line of the search holds it.
    let secret = value.trim_start_matches("Bearer ");
    let search = "sleep 30 & grep -rlsF -f - /workspace /tmp /run /etc /proc/[0-9]*/environ \
                  /proc/[0-9]*/cmdline; echo done; kill $! 2>/dev/null; true";
    let out =
        run(driver.as_ref(), &id, &["sh", "-c", search], format!("{secret}\n").as_bytes(), 60_000).await;
    let found = text(&out.stdout);
    assert_eq!(found.lines().last(), Some("done"), "{}", shown(&out));
    assert_eq!(found.lines().count(), 1, "the secret's value is readable in the sandbox: {}", shown(&out));
    // Positive control: the same search finds a value that is there.
    let out = run(driver.as_ref(), &id, &["sh", "-c", search], b"BEGIN CERTIFICATE\n", 60_000).await;
    assert!(text(&out.stdout).contains("/run/sandlane/ca.pem"), "{}", shown(&out));

    driver.deprovision(&id).await.expect("deprovision");
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), serving).await;
}

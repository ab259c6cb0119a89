//! The host a server shares: the embedded defaults from where a user clones and runs them
//! (a private home directory, a deep working directory), host uids unique across the data
//! dirs of one host, and the sandboxes of a data dir that is gone found and ended (at the
//! next start, and by `sandlane host reap`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, binary, supervisor_binary};

fn ensure(server: &Server, key: &str, session: &str) -> (u16, Value) {
    server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    )
}

fn ready(got: &(u16, Value)) -> String {
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn exec(server: &Server, key: &str, sandbox: &str, script: &str) -> String {
    let got = server.exec_sh(key, sandbox, script);
    assert_eq!((got.0, &got.1["exit_code"]), (200, &json!(0)), "{}", got.1);
    got.1["stdout"].as_str().unwrap().to_owned()
}

/// The host uid a sandbox runs as: its processes' real uid, found through its cgroup
/// (named after the sandbox; v1 `pids`, or v2).
fn host_uid(sandbox: &str) -> u32 {
    let procs = ["/sys/fs/cgroup/pids/sandlane", "/sys/fs/cgroup/sandlane"]
        .iter()
        .find_map(|parent| std::fs::read_to_string(Path::new(parent).join(sandbox).join("cgroup.procs")).ok())
        .expect("the sandbox's cgroup");
    let pid = procs.lines().next().expect("a process in the sandbox's cgroup");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    uid.split_whitespace().next().unwrap().parse().unwrap()
}

/// The live (not zombie) host processes whose real uid is `uid`.
fn processes_of(uid: u32) -> usize {
    let uid = uid.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .filter(|status| {
            let field = |name: &str| {
                status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next())
            };
            field("Uid:") == Some(uid.as_str()) && field("State:") != Some("Z")
        })
        .count()
}

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `program` (the `sandlane` binary) in `cwd` with `env`'s variables.
fn cli_in(env: &Env, program: &Path, cwd: &Path, args: &[&str]) -> String {
    let out =
        Command::new(program).args(args).current_dir(cwd).envs(env.vars.iter().cloned()).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The README's first commands, from a clone in a home directory of mode 0700 (Debian's
/// default for `/root`): the binary and the default data dir are both under it, where no
/// sandbox uid can reach. An ensure gives `ready` and a command runs.
pub fn a_clone_under_a_private_home_serves() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    env.unset("SANDLANE_DATA_DIR");
    let home = env.data.path().join("home");
    let clone = home.join("clone");
    std::fs::create_dir_all(clone.join("target/release")).unwrap();
    // The clone's own build of the binaries (links to this build's: the same files),
    // `sandlane-supervisor` beside `sandlane` as cargo puts it.
    let program = clone.join("target/release/sandlane");
    for (built, at) in
        [(binary(), program.clone()), (supervisor_binary(), clone.join("target/release/sandlane-supervisor"))]
    {
        if std::fs::hard_link(&built, &at).is_err() {
            std::fs::copy(&built, &at).unwrap();
        }
    }
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let key = cli_in(
        &env,
        &program,
        &clone,
        &["caller", "add", "--id", "user-ada", "--class", "user", "--org", "acme"],
    );
    let server = Server::start_program(&env, &program, &clone);
    let id = ready(&ensure(&server, &key, &format!("home-{}", std::process::id())));
    assert_eq!(exec(&server, &key, &id, "echo inside; id -u"), "inside\n1000\n");
    // The data dir stayed where it was, private.
    let data = clone.join("sandlane-data");
    assert!(data.join("sandlane.db").exists());
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
}

/// The embedded defaults from a working directory 150 characters deep: the data dir (and
/// so each supervisor's socket under it) is longer than a unix socket's path may be.
pub fn a_deep_working_directory_serves() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    env.unset("SANDLANE_DATA_DIR");
    let mut cwd = env.data.path().to_path_buf();
    while cwd.as_os_str().len() < 150 {
        cwd.push("a-rather-deep-project-directory");
    }
    std::fs::create_dir_all(&cwd).unwrap();
    let socket_dir = cwd.join("sandlane-data/sandboxes/sbx_01JAAAAAAAAAAAAAAAAAAAAAAA/control/sock");
    assert!(socket_dir.as_os_str().len() > 108, "positive control: the path is too long for a socket");
    let key = cli_in(
        &env,
        &binary(),
        &cwd,
        &["caller", "add", "--id", "user-ada", "--class", "user", "--org", "acme"],
    );
    let server = Server::start_in(&env, &cwd);
    let id = ready(&ensure(&server, &key, &format!("deep-{}", std::process::id())));
    assert_eq!(exec(&server, &key, &id, "echo inside"), "inside\n");
    // A second command, and a new connection for each: the server reaches the supervisor
    // however long the path.
    assert_eq!(exec(&server, &key, &id, "echo again"), "again\n");
}

/// The median of `n` timings of `f`.
fn median(n: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

/// Two servers with their own data dirs on one host ensure the same org and key: their
/// sandboxes run as different host uids, and a fork bomb left in one (as many processes
/// as its limit lets it start, all sleeping) neither fails nor slows an ensure and the
/// commands of the other.
pub fn two_data_dirs_never_share_a_host_uid() {
    let (Some(env_a), Some(env_b)) = (Env::new(Backend::Sqlite), Env::new(Backend::Sqlite)) else { return };
    let key_a = env_a.add_caller("user-ada", "user", &["acme"]);
    let key_b = env_b.add_caller("user-ada", "user", &["acme"]);
    let a = Server::start_binary(&env_a);
    let b = Server::start_binary(&env_b);
    let session = format!("twin-{}", std::process::id());
    let in_a = ready(&ensure(&a, &key_a, &session));
    let uid_a = host_uid(&in_a);

    // What an ensure and its commands cost on b before anything happens in a.
    let baseline_ensure = {
        let start = Instant::now();
        ready(&ensure(&b, &key_b, &format!("{session}-before")));
        start.elapsed()
    };
    let before = ready(&ensure(&b, &key_b, &format!("{session}-before")));
    let baseline_exec = median(7, || {
        exec(&b, &key_b, &before, "echo ok");
    });

    // The bomb: as many sleeping processes as a's process limit lets it start.
    exec(
        &a,
        &key_a,
        &in_a,
        "nohup sh -c 'for i in $(seq 1 2000); do sleep 60 & done; wait' >/dev/null 2>&1 &",
    );
    let mut last = 0;
    wait_until("the bomb to reach its limit", Duration::from_secs(30), || {
        let now = processes_of(uid_a);
        let settled = now >= 100 && now == last;
        last = now;
        std::thread::sleep(Duration::from_millis(200));
        settled
    });

    let start = Instant::now();
    let in_b = ready(&ensure(&b, &key_b, &session));
    let ensure_took = start.elapsed();
    let uid_b = host_uid(&in_b);
    assert_ne!(uid_a, uid_b, "the same key in two data dirs runs as one host uid");
    // b's sandbox may start processes of its own: none of a's count against it.
    assert_eq!(exec(&b, &key_b, &in_b, "for i in $(seq 1 50); do sleep 1 & done; wait; echo done"), "done\n");
    let exec_took = median(7, || {
        exec(&b, &key_b, &in_b, "echo ok");
    });
    assert!(
        ensure_took <= baseline_ensure * 3 + Duration::from_millis(200),
        "an ensure took {ensure_took:?} beside the bomb, {baseline_ensure:?} before"
    );
    assert!(
        exec_took <= baseline_exec * 3 + Duration::from_millis(20),
        "a command took {exec_took:?} beside the bomb, {baseline_exec:?} before"
    );
    // The bomb goes with its sandbox.
    let got = a.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(&key_a), None);
    assert_eq!(got.0, 204, "{}", got.1);
    wait_until("the bomb to end", Duration::from_secs(10), || processes_of(uid_a) == 0);
}

/// A data dir's path, for removal.
fn data_dir(env: &Env) -> PathBuf {
    env.data.path().join("data")
}

/// The sandboxes of a data dir removed while its server was stopped run on with no server
/// to end them: `sandlane host reap` ends them, and so does the next start of any server
/// on the host; the sandboxes of a data dir that is still there are left alone.
pub fn sandboxes_of_a_data_dir_that_is_gone_are_ended() {
    let (Some(env_a), Some(env_b), Some(env_c)) =
        (Env::new(Backend::Sqlite), Env::new(Backend::Sqlite), Env::new(Backend::Sqlite))
    else {
        return;
    };
    let nonce = std::process::id();
    let (mut sandboxes, mut stopped) = (Vec::new(), Vec::new());
    for (env, name) in [(&env_a, "a"), (&env_b, "b")] {
        let key = env.add_caller("user-ada", "user", &["acme"]);
        let mut server = Server::start_binary(env);
        let id = ready(&ensure(&server, &key, &format!("gone-{name}-{nonce}")));
        exec(&server, &key, &id, "nohup sleep 1000 >/dev/null 2>&1 &");
        let uid = host_uid(&id);
        // A clean stop leaves the sandboxes running (they outlive their server).
        assert!(server.stop(), "the server stops cleanly");
        sandboxes.push((uid, id));
        // Kept (a dropped test server ends its sandboxes).
        stopped.push(server);
    }
    let (uid_a, uid_b) = (sandboxes[0].0, sandboxes[1].0);
    assert_ne!(uid_a, uid_b);
    assert!(processes_of(uid_a) > 0 && processes_of(uid_b) > 0, "positive control: both run on");

    std::fs::remove_dir_all(data_dir(&env_a)).unwrap();
    let (code, out, err) = env_c.cli(&["host", "reap"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&uid_a.to_string()), "names what it ended: {out}");
    wait_until("a's sandbox to end", Duration::from_secs(10), || processes_of(uid_a) == 0);
    assert!(processes_of(uid_b) > 0, "a sandbox whose data dir is there is left alone: {out}");
    for controller in ["pids", "memory"] {
        let cgroup = Path::new("/sys/fs/cgroup").join(controller).join("sandlane").join(&sandboxes[0].1);
        assert!(!cgroup.exists(), "{} is left", cgroup.display());
    }
    // Nothing left to do: a second run ends nothing.
    let (code, again, err) = env_c.cli(&["host", "reap"]);
    assert_eq!(code, 0, "{again}{err}");
    assert!(!again.contains(&uid_a.to_string()), "{again}");

    std::fs::remove_dir_all(data_dir(&env_b)).unwrap();
    let _c = Server::start_binary(&env_c);
    wait_until("b's sandbox to end at the next start", Duration::from_secs(10), || processes_of(uid_b) == 0);
}

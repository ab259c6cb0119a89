//! Terminals end to end on a real driver (bubblewrap, and containers on the throwaway
//! podman): a terminal follows a resize (`stty size`), a detach, a restart of the server
//! and a new attach replay what came before, `exit 3` ends it with 3 in the last control message, another user
//! may not attach (403), a ticket works once and only for its terminal, and
//! `sandlane sandbox shell` driven through tmux runs a command and exits with the shell's
//! status.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

use crate::support::{Backend, Env, Server, assert_error};

/// How a test runs its sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Bubblewrap,
    Container,
}

fn env_for(driver: Driver) -> Option<Env> {
    let mut env = Env::new(Backend::Sqlite)?;
    if driver == Driver::Container {
        let engine = tests::services::podman_engine()?;
        env.set("SANDLANE_DRIVER", "container");
        env.set("SANDLANE_DOCKER_HOST", &engine.docker_host);
        env.set("SANDLANE_CONTAINER_IMAGE", &engine.image);
    }
    Some(env)
}

type Socket = WebSocket<TcpStream>;

/// Attaches to `route` (`…/terminals/{id}`, with its query) with `key` as the bearer
/// credential, if any: the WebSocket, or the HTTP status of the refusal.
fn attach(server: &Server, route: &str, key: Option<&str>) -> Result<Socket, u16> {
    let url = format!("{}{route}", server.base.replacen("http://", "ws://", 1));
    let mut request = url.as_str().into_client_request().unwrap();
    if let Some(key) = key {
        request.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    let address = server.base.trim_start_matches("http://");
    let tcp = TcpStream::connect(address).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.set_nodelay(true).unwrap();
    match tungstenite::client::client(request, tcp) {
        Ok((socket, response)) => {
            assert_eq!(response.status().as_u16(), 101);
            Ok(socket)
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("attach {route}: {e}"),
    }
}

/// Reads the terminal's output until `needle` is in it: all that was read.
fn read_until(socket: &mut Socket, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in {seen:?}");
        match socket.read().unwrap_or_else(|e| panic!("no {needle:?} in {seen:?}: {e}")) {
            Message::Binary(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            Message::Text(text) => panic!("a control message {text} before {needle:?} in {seen:?}"),
            _ => {}
        }
    }
    seen
}

fn send(socket: &mut Socket, keys: &str) {
    socket.send(Message::Binary(keys.as_bytes().to_vec().into())).unwrap();
}

fn resize(socket: &mut Socket, cols: u16, rows: u16) {
    let control = json!({"type": "resize", "cols": cols, "rows": rows}).to_string();
    socket.send(Message::Text(control.into())).unwrap();
}

fn ensure(server: &Server, key: &str, session: &str) -> String {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn start(server: &Server, key: &str, sandbox: &str, body: Value) -> String {
    let got =
        server.call("POST", &format!("/v1/orgs/acme/sandboxes/{sandbox}/terminals"), Some(key), Some(body));
    assert_eq!(got.0, 201, "{}", got.1);
    assert_eq!(got.1["running"], true, "{}", got.1);
    got.1["id"].as_str().unwrap().to_owned()
}

fn ticket(server: &Server, key: &str, route: &str) -> String {
    let got = server.call("POST", &format!("{route}/tickets"), Some(key), None);
    assert_eq!(got.0, 201, "{}", got.1);
    got.1["ticket"].as_str().unwrap().to_owned()
}

pub fn terminals_end_to_end(driver: Driver) {
    let Some(env) = env_for(driver) else { return };
    let alice = env.add_caller("u-term-alice", "user", &["acme"]);
    let bob = env.add_caller("u-term-bob", "user", &["acme"]);
    let mut first_server = Server::start(&env);
    let server = &first_server;
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let session = format!("t{tag}");
    let sandbox = ensure(server, &alice, &session);

    // The sandbox's shell, at 80 × 24; a resize, then `stty size` prints the new size.
    let id = start(server, &alice, &sandbox, json!({"cols": 80, "rows": 24}));
    let route = format!("/v1/orgs/acme/sandboxes/{sandbox}/terminals/{id}");
    let mut socket = attach(server, &route, Some(&alice)).unwrap();
    send(&mut socket, "stty size; pwd; echo TERM=$TERM\n");
    let first = read_until(&mut socket, "TERM=xterm-256color");
    assert!(first.contains("24 80") && first.contains("/workspace"), "{first:?}");
    resize(&mut socket, 132, 43);
    send(&mut socket, "stty size\n");
    read_until(&mut socket, "43 132");
    send(&mut socket, "echo before-$((20+1))-detach\n");
    read_until(&mut socket, "before-21-detach");
    // Detach, and restart the server: the terminal runs on (its supervisor keeps it), and
    // a new attach replays what it wrote. (The first server stays, stopped, to the end:
    // dropping it ends the sandboxes.)
    socket.close(None).unwrap();
    drop(socket);
    assert!(first_server.stop(), "the first server stops cleanly");
    let restarted = Server::start(&env);
    let server = &restarted;
    let mut socket = attach(server, &route, Some(&alice)).unwrap();
    let replayed = read_until(&mut socket, "before-21-detach");
    assert!(replayed.contains("43 132"), "the replay holds the earlier output: {replayed:?}");
    let got = server.call("GET", &route, Some(&alice), None);
    assert_eq!(
        (got.0, got.1["id"].as_str(), got.1["running"].as_bool()),
        (200, Some(id.as_str()), Some(true))
    );
    let got = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{sandbox}/terminals"), Some(&alice), None);
    assert!(got.1["terminals"].as_array().unwrap().iter().any(|t| t["id"] == id.as_str()), "{}", got.1);
    // Among the background processes, the terminal's names it.
    let got = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{sandbox}/processes"), Some(&alice), None);
    let marked: Vec<&Value> =
        got.1["processes"].as_array().unwrap().iter().filter(|p| p["terminal"] == id.as_str()).collect();
    assert_eq!(marked.len(), 1, "{}", got.1);

    // Another user may not attach, list, end or ask for a ticket (the exec rule).
    assert_eq!(attach(server, &route, Some(&bob)).err(), Some(403));
    assert_error(&server.call("DELETE", &route, Some(&bob), None), 403, "permission_denied");
    assert_error(
        &server.call("POST", &format!("{route}/tickets"), Some(&bob), None),
        403,
        "permission_denied",
    );
    // No credential at all: 401.
    assert_eq!(attach(server, &route, None).err(), Some(401));

    // A ticket: good once, without a header, and only for its own terminal.
    let other = start(server, &alice, &sandbox, json!({"argv": ["sh"], "cols": 40, "rows": 10}));
    let other_route = format!("/v1/orgs/acme/sandboxes/{sandbox}/terminals/{other}");
    let once = ticket(server, &alice, &route);
    let mut by_ticket = attach(server, &format!("{route}?access_token={once}"), None).unwrap();
    send(&mut by_ticket, "echo via-$((2+3))-ticket\n");
    read_until(&mut by_ticket, "via-5-ticket");
    // Two clients attached at once: the first one (attached since the restart) sees what
    // the second typed, and its own keys reach the same shell.
    read_until(&mut socket, "via-5-ticket");
    send(&mut socket, "echo both-$((3+4))-attached\n");
    read_until(&mut by_ticket, "both-7-attached");
    by_ticket.close(None).unwrap();
    assert_eq!(attach(server, &format!("{route}?access_token={once}"), None).err(), Some(401), "used twice");
    let elsewhere = ticket(server, &alice, &route);
    assert_eq!(
        attach(server, &format!("{other_route}?access_token={elsewhere}"), None).err(),
        Some(401),
        "a ticket for another terminal"
    );
    assert_eq!(
        attach(server, &format!("{route}?access_token={elsewhere}"), None).err(),
        Some(401),
        "used up"
    );
    let got = server.call("DELETE", &other_route, Some(&alice), None);
    assert_eq!(got.0, 204, "{}", got.1);

    // `exit 3`: the last control message carries 3, then the close.
    send(&mut socket, "exit 3\n");
    let exit = loop {
        match socket.read() {
            Ok(Message::Text(text)) => break serde_json::from_str::<Value>(text.as_str()).unwrap(),
            Ok(_) => {}
            Err(e) => panic!("the terminal ended without its exit: {e}"),
        }
    };
    assert_eq!(exit, json!({"type": "exit", "exit_code": 3}));
    assert!(matches!(socket.read(), Ok(Message::Close(_))), "the close follows the exit");
    let got = server.call("GET", &route, Some(&alice), None);
    assert_eq!(
        (got.1["running"].as_bool(), got.1["exit_code"].as_i64()),
        (Some(false), Some(3)),
        "{}",
        got.1
    );

    the_cli_shell_runs_in_tmux(&env, server, &alice, &sandbox);

    let got = server.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(&alice), None);
    assert_eq!(got.0, 204, "{}", got.1);
    drop(restarted);
    drop(first_server);
}

/// What tmux's pane `name` shows.
fn capture(name: &str) -> String {
    let out = std::process::Command::new("tmux").args(["capture-pane", "-p", "-t", name]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for_pane(name: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pane = capture(name);
        if check(&pane) {
            return pane;
        }
        assert!(Instant::now() < deadline, "no {what} in tmux's pane:\n{pane}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `sandlane sandbox shell` in a tmux pane: `echo $((6*7))` prints 42, and `exit 3` exits
/// the command with 3.
fn the_cli_shell_runs_in_tmux(env: &Env, server: &Server, key: &str, sandbox: &str) {
    let tmux = |args: &[&str]| {
        let status = std::process::Command::new("tmux")
            .args(args)
            .status()
            .expect("tmux (scripts/test.sh installs it)");
        assert!(status.success(), "tmux {args:?}");
    };
    let name = format!("sandlane-{}", std::process::id());
    let mut vars: Vec<String> = env
        .vars
        .iter()
        .filter(|(k, _)| k.starts_with("SANDLANE_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    vars.push(format!("SANDLANE_KEY={key}"));
    let command = format!(
        "env {} {} sandbox shell acme {sandbox} --server {}; echo sandlane-exited-$?; sleep 60",
        vars.join(" "),
        crate::support::binary().display(),
        server.base
    );
    tmux(&["new-session", "-d", "-s", &name, "-x", "100", "-y", "30", &command]);
    struct Session(String);
    impl Drop for Session {
        fn drop(&mut self) {
            let _ = std::process::Command::new("tmux").args(["kill-session", "-t", &self.0]).status();
        }
    }
    let _session = Session(name.clone());
    // The shell's prompt first, then a command typed as keys.
    wait_for_pane(&name, "a prompt", |p| p.lines().any(|l| l.trim_end().ends_with(['$', '#'])));
    tmux(&["send-keys", "-t", &name, "stty size; echo $((6*7))", "Enter"]);
    let pane = wait_for_pane(&name, "42", |p| p.lines().any(|l| l.trim() == "42"));
    let out = std::process::Command::new("tmux")
        .args(["display-message", "-p", "-t", &name, "#{pane_height} #{pane_width}"])
        .output()
        .unwrap();
    let size = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(pane.lines().any(|l| l.trim() == size), "the terminal has the pane's size ({size}):\n{pane}");
    tmux(&["send-keys", "-t", &name, "exit 3", "Enter"]);
    wait_for_pane(&name, "the shell's exit status", |p| p.contains("sandlane-exited-3"));
}

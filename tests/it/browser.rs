//! A preview link in a real browser: headless Chromium (Debian's `chromium`, driven by
//! playwright-core through `tests/browser/preview.mjs`) opens a link of a page served
//! inside a bubblewrap sandbox by the preview tests' app (`tests/it/preview_app.py`: the
//! working directory's files and a WebSocket echo on one port, as a dev server has them),
//! renders it, and its script's WebSocket
//! answers through the server; after the link's `DELETE`, the same tab reloaded is refused.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::preview::{preview_host, start_in, upload, wait_serving};
use crate::support::{Backend, Env, Server};

pub fn a_preview_link_in_a_real_browser() {
    let Some((chromium, playwright)) = tests::services::browser() else { return };
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let owner = env.add_caller("user-ada", "user", &["acme"]);
    let server = Server::start(&env);
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/br{tag}/sandbox"),
        Some(&owner),
        Some(json!({"execution_id": "e1"})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    let sandbox = got.1["sandbox"]["id"].as_str().unwrap().to_owned();
    let site = concat!(env!("CARGO_MANIFEST_DIR"), "/browser");
    upload(&server, &owner, &sandbox, ("index.html", &std::fs::read(format!("{site}/index.html")).unwrap()));
    start_in(
        &server,
        &owner,
        &sandbox,
        ("preview_app.py", include_bytes!("preview_app.py")),
        json!(["python3", "/workspace/preview_app.py", "8000"]),
    );
    let host = preview_host(&server, &sandbox, 8000);
    wait_serving(&server, &host, "/", &format!("Bearer {owner}"));
    let links = format!("/v1/orgs/acme/sandboxes/{sandbox}/ports/8000/links");
    let made = server.call("POST", &links, Some(&owner), Some(json!({"ttl_s": 600})));
    assert_eq!(made.0, 201, "{}", made.1);
    let url = made.1["url"].as_str().unwrap().to_owned();

    let mut node = Command::new("node")
        .arg(format!("{site}/preview.mjs"))
        .arg(&url)
        .env("SANDLANE_TEST_CHROMIUM", &chromium)
        .env("SANDLANE_TEST_PLAYWRIGHT", &playwright)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node (Debian: apt-get install nodejs)");
    let mut input = node.stdin.take().unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut step = || -> Value {
        let line = lines.next().expect("a step from the browser").expect("read the browser's step");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let opened = step();
    assert_eq!(opened["step"], "opened", "{opened}");
    assert_eq!(opened["status"], 200, "{opened}");
    assert_eq!(opened["url"], format!("http://{host}/").as_str(), "the token left the address bar: {opened}");
    assert_eq!(opened["greeting"], "Hello from inside the sandbox", "{opened}");
    assert_eq!(opened["echo"], "echo:ping", "the page's WebSocket through the server: {opened}");
    let cookies = opened["cookies"].as_array().unwrap();
    assert_eq!(cookies.len(), 1, "{opened}");
    let cookie = &cookies[0];
    assert_eq!(cookie["name"], "sandlane_preview", "{cookie}");
    assert_eq!(cookie["httpOnly"], true, "{cookie}");
    assert_eq!(cookie["sameSite"], "Lax", "{cookie}");
    assert_eq!(cookie["secure"], false, "not over TLS: {cookie}");
    assert_eq!(cookie["domain"], host.split(':').next().unwrap(), "the page's host alone: {cookie}");

    let link = made.1["id"].as_str().unwrap();
    let revoked = server.call("DELETE", &format!("{links}/{link}"), Some(&owner), None);
    assert_eq!(revoked.0, 204, "{}", revoked.1);
    writeln!(input, "revoked").unwrap();
    let reloaded = step();
    assert_eq!(reloaded["step"], "reloaded", "{reloaded}");
    assert_eq!(reloaded["status"], 403, "{reloaded}");
    assert!(reloaded["body"].as_str().unwrap().contains("revoked"), "{reloaded}");
    drop(input);
    assert!(node.wait().unwrap().success(), "the browser script failed");
}

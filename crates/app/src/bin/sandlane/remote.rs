//! `sandlane sandbox exec|cp|shell`: clients of a running server's HTTP API (plain HTTP,
//! blocking), acting with the caller key in `SANDLANE_KEY` (never an argument: arguments
//! show in `ps` and shell histories).
//!
//! - `exec` streams the command's output (NDJSON) to this terminal as it arrives and exits
//!   with the command's exit code; sandlane's own failures exit 125 (a command's status
//!   may be any of 0–255, so 2 would be ambiguous), with a `sandlane:` line on stderr.
//! - `cp` copies a file through the files route and a directory through the archive route,
//!   both ways, streamed (no whole file or archive in memory). A file arriving here is
//!   written under a temporary name and renamed into place whole; a directory's archive is
//!   unpacked by the `tar` crate, which refuses entries that would land outside the
//!   destination (a sandbox's contents are not to be trusted by the host).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine;
use domain::{OrgId, SandboxId};
use serde_json::{Value, json};

use crate::cli::{
    SandboxCommand, SandboxCp, SandboxExec, SandboxFork, SandboxPort, SandboxPreview, SandboxRestore,
    SandboxRevokePreview, SandboxSnapshot,
};
use app::config::Settings;

/// The variable the caller key is read from.
pub const KEY_VAR: &str = "SANDLANE_KEY";
/// The exit status of sandlane's own failures in `sandbox exec`.
const EXEC_FAILED: u8 = 125;

/// Runs a `sandbox` command.
pub fn run(command: SandboxCommand, settings: &Settings) -> ExitCode {
    let (result, failed) = match command {
        SandboxCommand::Exec(args) => (exec(&args, settings), EXEC_FAILED),
        SandboxCommand::Cp(args) => (cp(&args, settings).map(|()| 0), 2),
        SandboxCommand::Snapshot(args) => (snapshot(&args, settings).map(|()| 0), 2),
        SandboxCommand::Fork(args) => (fork(&args, settings).map(|()| 0), 2),
        SandboxCommand::Restore(args) => (restore(&args, settings).map(|()| 0), 2),
        SandboxCommand::Shell(args) => (crate::shell::shell(&args, settings), EXEC_FAILED),
        SandboxCommand::Preview(args) => (preview(&args, settings).map(|()| 0), 2),
        SandboxCommand::Previews(args) => (previews(&args, settings).map(|()| 0), 2),
        SandboxCommand::RevokePreview(args) => (revoke_preview(&args, settings).map(|()| 0), 2),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sandlane: {e}");
            ExitCode::from(failed)
        }
    }
}

/// What the client needs: the server's base URL and the key.
pub(crate) struct Client {
    pub(crate) base: String,
    key: String,
    pub(crate) agent: ureq::Agent,
}

impl Client {
    pub(crate) fn new(server: Option<&str>, settings: &Settings) -> Result<Self, String> {
        let key =
            std::env::var(KEY_VAR).ok().map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()).ok_or_else(
                || format!("set {KEY_VAR} to a caller key (from `sandlane caller add`) or a sandbox token"),
            )?;
        let base = match server {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let mut listen = settings.listen;
                if listen.ip().is_unspecified() {
                    listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{listen}")
            }
        };
        if !base.starts_with("http://") {
            return Err(format!(
                "--server {base:?}: only http:// servers are reached (put a TLS proxy in front)"
            ));
        }
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        Ok(Self { base, key, agent })
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn auth(&self) -> String {
        format!("Bearer {}", self.key)
    }
}

/// The message of an error response.
pub(crate) fn failure(what: &str, mut response: ureq::http::Response<ureq::Body>) -> String {
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    match serde_json::from_str::<Value>(&text) {
        Ok(v) if v["error"].is_string() => {
            format!(
                "{what}: {status} {}: {}",
                v["error"].as_str().unwrap_or(""),
                v["message"].as_str().unwrap_or("")
            )
        }
        _ => format!("{what}: {status} {}", text.trim()),
    }
}

pub(crate) fn unreachable(base: &str, e: &ureq::Error) -> String {
    format!("cannot reach the server at {base}: {e} (is `sandlane serve` running? see --server)")
}

fn exec(args: &SandboxExec, settings: &Settings) -> Result<u8, String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    let mut body = json!({"argv": args.argv});
    if let Some(ms) = args.timeout_ms {
        body["timeout_ms"] = json!(ms);
    }
    if args.stdin {
        let mut input = Vec::new();
        std::io::stdin().read_to_end(&mut input).map_err(|e| format!("cannot read standard input: {e}"))?;
        let text = String::from_utf8(input)
            .map_err(|_| "standard input is not UTF-8; the exec API carries text".to_owned())?;
        body["stdin"] = json!(text);
    }
    let route = format!("/v1/orgs/{}/sandboxes/{}/exec", args.org, args.id);
    let response = client
        .agent
        .post(&client.url(&route))
        .header("authorization", &client.auth())
        .header("accept", "application/x-ndjson")
        .send_json(&body)
        .map_err(|e| unreachable(&client.base, &e))?;
    if !response.status().is_success() {
        return Err(failure("exec", response));
    }
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    for line in BufReader::new(response.into_body().into_reader()).lines() {
        let line = line.map_err(|e| format!("the output stream broke off: {e}"))?;
        let frame: Value =
            serde_json::from_str(&line).map_err(|e| format!("a line that is not JSON ({e}): {line}"))?;
        let bytes = || -> Result<Vec<u8>, String> {
            match (frame["text"].as_str(), frame["data"].as_str()) {
                (Some(text), _) => Ok(text.as_bytes().to_vec()),
                (None, Some(data)) => base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| format!("a frame's data is not base64: {e}")),
                (None, None) => Ok(Vec::new()),
            }
        };
        match frame["type"].as_str() {
            Some("stdout") => {
                let _ = out.write_all(&bytes()?);
                let _ = out.flush();
            }
            Some("stderr") => {
                let _ = err.write_all(&bytes()?);
                let _ = err.flush();
            }
            Some("exit") => {
                if frame["timed_out"] == true {
                    eprintln!("sandlane: the command ran out of time and was killed");
                }
                if frame["truncated"] == true {
                    eprintln!("sandlane: output past the server's cap was dropped");
                }
                let code = frame["exit_code"].as_i64().unwrap_or(i64::from(EXEC_FAILED));
                return Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(EXEC_FAILED));
            }
            Some("error") => {
                return Err(format!(
                    "the stream broke off: {}: {}",
                    frame["error"].as_str().unwrap_or(""),
                    frame["message"].as_str().unwrap_or("")
                ));
            }
            _ => return Err(format!("an unknown frame: {line}")),
        }
    }
    Err("the stream ended before the command's exit".to_owned())
}

/// Sends `body` as JSON with `method` to `route` (no body: none); prints the answer's
/// JSON (pretty) when it is a success with one, else says why.
fn call_and_print(
    client: &Client,
    what: &str,
    method: &str,
    route: &str,
    body: Option<&Value>,
) -> Result<(), String> {
    let request = ureq::http::Request::builder()
        .method(method)
        .uri(client.url(route))
        .header("authorization", client.auth())
        .header("content-type", "application/json")
        .body(body.map(Value::to_string).unwrap_or_default())
        .map_err(|e| format!("{what}: {e}"))?;
    let mut response = client.agent.run(request).map_err(|e| unreachable(&client.base, &e))?;
    if !response.status().is_success() {
        return Err(failure(what, response));
    }
    if response.status() == ureq::http::StatusCode::NO_CONTENT {
        return Ok(());
    }
    let answer: Value =
        response.body_mut().read_json().map_err(|e| format!("{what}: an answer that is not JSON: {e}"))?;
    if answer["outcome"] == "failed" {
        return Err(format!("{what}: {}", answer["message"].as_str().unwrap_or("failed")));
    }
    println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
    Ok(())
}

fn snapshot(args: &SandboxSnapshot, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    let mut body = json!({});
    if let Some(name) = &args.name {
        body["name"] = json!(name);
    }
    let route = format!("/v1/orgs/{}/sandboxes/{}/snapshots", args.org, args.id);
    call_and_print(&client, "snapshot", "POST", &route, Some(&body))
}

fn fork(args: &SandboxFork, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    // Ids are checked here too: a path segment is never anything but an id.
    let id = |raw: &str| domain::ExecutionId::parse(raw).map(|_| ()).map_err(|e| e.to_string());
    for raw in [&args.session, &args.execution, &args.workflow].into_iter().flatten() {
        id(raw)?;
    }
    let (route, body) = match (&args.session, &args.workflow) {
        (Some(session), _) => (
            format!("/v1/orgs/{}/sessions/{}/sandbox", args.org, query(session)),
            json!({"execution_id": args.execution, "from_snapshot": args.snapshot}),
        ),
        (None, Some(workflow)) => (
            format!("/v1/orgs/{}/workflow-executions/{}/sandbox", args.org, query(workflow)),
            json!({"from_snapshot": args.snapshot}),
        ),
        (None, None) => return Err("name --session (with --execution) or --workflow".to_owned()),
    };
    call_and_print(&client, "fork", "PUT", &route, Some(&body))
}

fn restore(args: &SandboxRestore, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    let route = format!("/v1/orgs/{}/sandboxes/{}/restore", args.org, args.id);
    call_and_print(&client, "restore", "POST", &route, Some(&json!({"snapshot": args.snapshot})))
}

/// The route of a sandbox's port's preview links.
fn links_route(port: &SandboxPort) -> String {
    format!("/v1/orgs/{}/sandboxes/{}/ports/{}/links", port.org, port.id, port.port)
}

fn preview(args: &SandboxPreview, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.port.server.as_deref(), settings)?;
    let body = args.ttl.map_or_else(|| json!({}), |ttl| json!({"ttl_s": ttl}));
    call_and_print(&client, "preview", "POST", &links_route(&args.port), Some(&body))
}

fn previews(args: &SandboxPort, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    call_and_print(&client, "previews", "GET", &links_route(args), None)
}

fn revoke_preview(args: &SandboxRevokePreview, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.port.server.as_deref(), settings)?;
    let route = format!("{}/{}", links_route(&args.port), args.link);
    call_and_print(&client, "revoke-preview", "DELETE", &route, None)
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    Local(PathBuf),
    Remote { org: OrgId, id: SandboxId, path: String },
}

/// `ORG/ID:PATH` is a sandbox's side; anything else a local path.
fn side(text: &str) -> Side {
    if let Some((sandbox, path)) = text.split_once(':')
        && let Some((org, id)) = sandbox.split_once('/')
        && let (Ok(org), Ok(id)) = (OrgId::parse(org), SandboxId::parse(id))
        && !path.is_empty()
    {
        return Side::Remote { org, id, path: path.to_owned() };
    }
    Side::Local(PathBuf::from(text))
}

fn query(path: &str) -> String {
    let mut out = String::new();
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

fn cp(args: &SandboxCp, settings: &Settings) -> Result<(), String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    match (side(&args.source), side(&args.destination)) {
        (Side::Local(from), Side::Remote { org, id, path }) => upload(&client, &from, &org, &id, &path),
        (Side::Remote { org, id, path }, Side::Local(to)) => download(&client, &org, &id, &path, &to),
        (Side::Local(_), Side::Local(_)) => {
            Err("one side must be in a sandbox: ORG/ID:PATH (for example acme/sbx_…:/workspace/file)"
                .to_owned())
        }
        (Side::Remote { .. }, Side::Remote { .. }) => {
            Err("copy between two sandboxes through this machine: one side must be local".to_owned())
        }
    }
}

fn upload(client: &Client, from: &Path, org: &OrgId, id: &SandboxId, path: &str) -> Result<(), String> {
    let meta = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let base = format!("/v1/orgs/{org}/sandboxes/{id}");
    let response = if meta.is_dir() {
        // The archive is made on a thread as the request sends it: a pipe between them.
        let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
        let dir = from.to_owned();
        let maker = std::thread::spawn(move || -> std::io::Result<()> {
            let mut builder = tar::Builder::new(writer);
            builder.follow_symlinks(false);
            builder.append_dir_all(".", &dir)?;
            builder.into_inner()?.flush()
        });
        let response = client
            .agent
            .put(&client.url(&format!("{base}/archive?path={}", query(path))))
            .header("authorization", &client.auth())
            .content_type("application/x-tar")
            .send(ureq::SendBody::from_owned_reader(reader))
            .map_err(|e| unreachable(&client.base, &e))?;
        match maker.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) if response.status().is_success() => return Err(format!("{}: {e}", from.display())),
            _ => {}
        }
        response
    } else {
        let dest = if path.ends_with('/') {
            let name = from.file_name().ok_or_else(|| format!("{} has no file name", from.display()))?;
            format!("{path}{}", name.to_string_lossy())
        } else {
            path.to_owned()
        };
        let file = File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
        client
            .agent
            .put(&client.url(&format!("{base}/files?path={}", query(&dest))))
            .header("authorization", &client.auth())
            .content_type("application/octet-stream")
            .send(file)
            .map_err(|e| unreachable(&client.base, &e))?
    };
    if response.status().is_success() { Ok(()) } else { Err(failure("cp", response)) }
}

fn download(client: &Client, org: &OrgId, id: &SandboxId, path: &str, to: &Path) -> Result<(), String> {
    let base = format!("/v1/orgs/{org}/sandboxes/{id}");
    let response = client
        .agent
        .get(&client.url(&format!("{base}/files?path={}", query(path))))
        .header("authorization", &client.auth())
        .call()
        .map_err(|e| unreachable(&client.base, &e))?;
    if !response.status().is_success() {
        return Err(failure("cp", response));
    }
    let is_dir = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_dir {
        drop(response);
        let response = client
            .agent
            .get(&client.url(&format!("{base}/archive?path={}", query(path))))
            .header("authorization", &client.auth())
            .call()
            .map_err(|e| unreachable(&client.base, &e))?;
        if !response.status().is_success() {
            return Err(failure("cp", response));
        }
        std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
        let mut archive = tar::Archive::new(response.into_body().into_reader());
        archive.set_overwrite(true);
        archive.set_preserve_permissions(false);
        archive.unpack(to).map_err(|e| format!("unpacking into {}: {e}", to.display()))
    } else {
        let target = if to.is_dir() {
            let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or(path);
            to.join(name)
        } else {
            to.to_owned()
        };
        let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = target.file_name().ok_or_else(|| format!("{} names no file", target.display()))?;
        let temp = dir.join(format!(".{}.sandlane-cp-{}", name.to_string_lossy(), std::process::id()));
        let written = (|| -> std::io::Result<()> {
            let mut file = File::create(&temp)?;
            std::io::copy(&mut response.into_body().into_reader(), &mut file)?;
            file.sync_all()?;
            std::fs::rename(&temp, &target)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            format!("{}: {e} (nothing was written)", target.display())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_are_told_apart() {
        let id = "sbx_01KA2B3C4D5E6F7G8H9JKMNPQR";
        assert_eq!(
            side(&format!("acme/{id}:/workspace/x")),
            Side::Remote {
                org: OrgId::parse("acme").unwrap(),
                id: SandboxId::parse(id).unwrap(),
                path: "/workspace/x".into()
            }
        );
        assert_eq!(side("./a:b"), Side::Local(PathBuf::from("./a:b")));
        assert_eq!(side(&format!("acme/{id}:")), Side::Local(PathBuf::from(format!("acme/{id}:"))));
        assert_eq!(side("/tmp/file"), Side::Local(PathBuf::from("/tmp/file")));
    }

    #[test]
    fn paths_are_escaped_for_the_query() {
        assert_eq!(query("/workspace/a b&c=d%"), "/workspace/a%20b%26c%3Dd%25");
        assert_eq!(query("/tmp/é"), "/tmp/%C3%A9");
    }
}

//! Preview ports end to end, on bubblewrap and on containers: a server inside a sandbox
//! (`tests/it/preview_app.py`, standard library only, and on bubblewrap also
//! `python3 -m http.server`) reached through the server's own listener at its preview host,
//! with a caller key and through a preview link (token, cookie, page), over plain HTTP and
//! a WebSocket (tokio-tungstenite as the client); a revoked link's cookie refused at once,
//! and a WebSocket it opened ended at the next check;
//! the cookie refused on another sandbox's host and another port; the lane's credentials
//! never reaching the sandbox; cookies for other hosts dropped on the way out; the egress
//! proxy's port refused; 502 when nothing listens; a body over the limit refused; a large
//! and a streamed answer relayed whole.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};

/// Where the sandboxes run.
pub enum Driver {
    Bubblewrap,
    /// The container driver on this Docker Engine API endpoint, with this image (one with
    /// python3: the tools image).
    Container {
        docker_host: String,
        image: String,
    },
}

/// One HTTP answer.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// One request to `address` (the server's) with `host` as its `Host`, its connection
/// closed after the answer (read whole; a chunked body is decoded).
pub fn http(
    address: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the server");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let given = headers.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    if !given && (!body.is_empty() || method == "POST") {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A refusal may come before the body is read: the server then closes its side.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse(&raw)
}

fn parse(raw: &[u8]) -> Answer {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| {
        panic!("no answer head in {:?}", String::from_utf8_lossy(raw));
    });
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body);
    }
    Answer { status, headers, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line) = raw.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&raw[..line]).split(';').next().unwrap().trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = line + 2;
        out.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = &raw[(start + size + 2).min(raw.len())..];
    }
}

/// The preview host of `port` of `sandbox` at `server`'s port.
pub fn preview_host(server: &Server, sandbox: &str, port: u16) -> String {
    let listen = server.base.rsplit_once(':').unwrap().1;
    format!("{port}-{}.preview.localhost:{listen}", sandbox.to_ascii_lowercase().replace('_', "-"))
}

pub fn address(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

fn ensure(server: &Server, key: &str, session: &str) -> String {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": "e1"})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["outcome"], "ready", "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

/// Writes `file` into the sandbox's `/workspace` and starts `argv` there as a background
/// process.
pub fn start_in(server: &Server, key: &str, sandbox: &str, file: (&str, &[u8]), argv: Value) {
    upload(server, key, sandbox, file);
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/processes"),
        Some(key),
        Some(json!({"argv": argv})),
    );
    assert_eq!(got.0, 201, "{}", got.1);
}

/// Starts the test's app (`preview_app.py`) on port 8000 inside the sandbox.
fn start_app(server: &Server, key: &str, sandbox: &str) {
    let app = ("preview_app.py", include_bytes!("preview_app.py").as_slice());
    start_in(server, key, sandbox, app, json!(["python3", "/workspace/preview_app.py", "8000"]));
}

/// Writes `file` (name, bytes) into the sandbox's `/workspace`.
pub fn upload(server: &Server, key: &str, sandbox: &str, file: (&str, &[u8])) {
    let (status, v) = server.raw(
        "PUT",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/files?path=/workspace/{}", file.0),
        Some(key),
        "application/octet-stream",
        file.1,
    );
    assert!((200..300).contains(&status), "upload {}: {status} {v}", file.0);
}

/// Waits until `path` on the preview host answers something but 502 (the server inside is
/// listening).
pub fn wait_serving(server: &Server, host: &str, path: &str, auth: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = http(&address(server), host, "GET", path, &[("authorization", auth)], b"");
        if got.status != 502 {
            return;
        }
        assert!(Instant::now() < deadline, "nothing served on {host} in 30 s: {}", got.text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A WebSocket to `/ws` on `host` through the server (`headers` added to its upgrade
/// request): sends `message`, returns the answer.
pub fn websocket_echo(
    server: &Server,
    host: &str,
    headers: &[(&str, &str)],
    message: &str,
) -> Result<String, String> {
    websocket_echo_twice(server, host, headers, message, None)
}

/// A WebSocket to `/ws` on `host` (with `headers`), echoed once and then held open, on a
/// thread of its own: `opened` says when it echoed; the thread returns how long the
/// WebSocket stayed open after that (ended by the server), or `None` after `limit`.
pub fn websocket_held(
    server: &Server,
    host: &str,
    headers: &[(&str, &str)],
    opened: std::sync::mpsc::Sender<()>,
    limit: Duration,
) -> std::thread::JoinHandle<Option<Duration>> {
    let (address, host) = (address(server), host.to_owned());
    let headers: Vec<(String, String)> =
        headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    std::thread::spawn(move || {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::{Message, http::HeaderValue};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut request = format!("ws://{host}/ws").into_client_request().unwrap();
            for (name, value) in &headers {
                request.headers_mut().insert(
                    tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
            let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
            ws.send(Message::text("held")).await.unwrap();
            let echoed = ws.next().await.unwrap().unwrap();
            assert_eq!(echoed.into_text().unwrap().as_str(), "echo:held");
            let since = std::time::Instant::now();
            opened.send(()).unwrap();
            loop {
                match tokio::time::timeout(limit.saturating_sub(since.elapsed()), ws.next()).await {
                    Err(_) => return None,
                    Ok(None | Some(Err(_) | Ok(Message::Close(_)))) => return Some(since.elapsed()),
                    Ok(Some(Ok(_))) => {}
                }
            }
        })
    })
}

/// [`websocket_echo`], and when `pause` is given, after it the same message again on the
/// same WebSocket: both answers must be the same.
pub fn websocket_echo_twice(
    server: &Server,
    host: &str,
    headers: &[(&str, &str)],
    message: &str,
    pause: Option<Duration>,
) -> Result<String, String> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::{Message, http::HeaderValue};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut request = format!("ws://{host}/ws").into_client_request().map_err(|e| e.to_string())?;
        for (name, value) in headers {
            request.headers_mut().insert(
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let tcp = tokio::net::TcpStream::connect(address(server)).await.map_err(|e| e.to_string())?;
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.map_err(|e| e.to_string())?;
        let mut answers = Vec::new();
        for wait in [None, pause] {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None if !answers.is_empty() => break,
                None => {}
            }
            ws.send(Message::text(message)).await.map_err(|e| e.to_string())?;
            let answer = tokio::time::timeout(Duration::from_secs(20), ws.next())
                .await
                .map_err(|_| "no answer in 20 s".to_owned())?
                .ok_or("closed")?
                .map_err(|e| e.to_string())?;
            answers.push(answer.into_text().map_err(|e| e.to_string())?.to_string());
        }
        let _ = ws.close(None).await;
        if answers.len() == 2 && answers[0] != answers[1] {
            return Err(format!("two answers differ: {answers:?}"));
        }
        Ok(answers.remove(0))
    })
}

pub fn on_bubblewrap() {
    scenario(&Driver::Bubblewrap);
}

pub fn on_containers() {
    let Some(engine) = tests::services::podman_engine() else { return };
    let image = engine.tools_image();
    scenario(&Driver::Container { docker_host: engine.docker_host, image });
}

fn scenario(driver: &Driver) {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    if let Driver::Container { docker_host, image } = driver {
        env.set("SANDLANE_DRIVER", "container");
        env.set("SANDLANE_DOCKER_HOST", docker_host);
        env.set("SANDLANE_CONTAINER_IMAGE", image);
    }
    // Short connection timeouts: a WebSocket below outlives them.
    env.set("SANDLANE_HTTP__IDLE_TIMEOUT_MS", "1000");
    env.set("SANDLANE_HTTP__HEADER_TIMEOUT_MS", "1000");
    let owner = env.add_caller("user-ada", "user", &["acme"]);
    let other = env.add_caller("user-bob", "user", &["acme"]);
    let service = env.add_caller("svc-audit", "service", &["acme"]);
    let server = Server::start(&env);
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let a = ensure(&server, &owner, &format!("pa{tag}"));
    let b_session = format!("pb{tag}");
    let b = ensure(&server, &owner, &b_session);
    let bearer = format!("Bearer {owner}");
    let addr = address(&server);

    // The app inside A on 8000 (and B, for the cookie carried over), a plain
    // `python3 -m http.server` on 8001 (bubblewrap).
    for sandbox in [&a, &b] {
        start_app(&server, &owner, sandbox);
    }
    let host = preview_host(&server, &a, 8000);
    wait_serving(&server, &host, "/headers", &bearer);
    if matches!(driver, Driver::Bubblewrap) {
        start_in(
            &server,
            &owner,
            &a,
            ("hello.txt", b"hello from inside\n"),
            json!([
                "python3",
                "-m",
                "http.server",
                "8001",
                "--bind",
                "127.0.0.1",
                "--directory",
                "/workspace"
            ]),
        );
        let plain = preview_host(&server, &a, 8001);
        wait_serving(&server, &plain, "/hello.txt", &bearer);
        let got = http(&addr, &plain, "GET", "/hello.txt", &[("authorization", &bearer)], b"");
        assert_eq!((got.status, got.text().as_str()), (200, "hello from inside\n"));
    }

    // With the owner's key: what crosses, and what does not.
    let got = http(
        &addr,
        &host,
        "GET",
        "/headers",
        &[
            ("authorization", &bearer),
            ("cookie", "keep=1; sandlane_preview=not-for-the-sandbox"),
            ("x-app", "yes"),
            ("connection", "close, x-hop"),
            ("x-hop", "drop me"),
        ],
        b"",
    );
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = got.json();
    assert_eq!(seen["authorization"], Value::Null, "the caller key reached the sandbox: {seen}");
    assert_eq!(seen["cookie"], "keep=1", "{seen}");
    assert_eq!(seen["x-app"], "yes", "{seen}");
    assert_eq!(seen["x-hop"], Value::Null, "a hop-by-hop header crossed: {seen}");
    assert!(!got.text().contains(&owner), "the key is nowhere in what the sandbox saw");
    // Cookies the sandbox sets for other hosts, or as the lane's, never reach the visitor.
    let got = http(&addr, &host, "GET", "/cookies", &[("authorization", &bearer)], b"");
    assert_eq!(got.all("set-cookie"), vec!["app=1; Path=/; HttpOnly"]);
    // A large answer and a streamed one, whole.
    let got = http(&addr, &host, "GET", "/bytes?n=5242880", &[("authorization", &bearer)], b"");
    assert_eq!((got.status, got.body.len()), (200, 5 << 20));
    let got = http(&addr, &host, "GET", "/stream?n=20", &[("authorization", &bearer)], b"");
    assert_eq!((got.status, got.body.len()), (200, 20 * 65536));
    // A visitor that goes away half-way through a streamed answer closes the sandbox's
    // connection: the server inside sees its client gone (10 MiB of 64 KiB chunks would
    // take 1.6 s more, and a relay that went on reading would leave it writing).
    {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        write!(stream, "GET /stream?n=160 HTTP/1.1\r\nhost: {host}\r\nauthorization: {bearer}\r\n\r\n")
            .unwrap();
        let mut some = [0u8; 65536];
        let mut got = 0;
        while got < 200_000 {
            got += stream.read(&mut some).unwrap();
        }
        drop(stream);
        let deadline = Instant::now() + Duration::from_millis(1500);
        loop {
            let stats = http(&addr, &host, "GET", "/stats", &[("authorization", &bearer)], b"").json();
            if stats["aborted"] == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the sandbox's connection outlived its visitor: {stats}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // A body within the limit goes through; one over it does not.
    let got = http(&addr, &host, "POST", "/echo", &[("authorization", &bearer)], b"ping");
    assert_eq!((got.status, got.text().as_str()), (200, "ping"));
    let got = http(
        &addr,
        &host,
        "POST",
        "/echo",
        &[("authorization", &bearer), ("content-length", "2000000")],
        b"",
    );
    assert_eq!(got.status, 413, "{}", got.text());
    // Without a length (chunked), the limit is found on the way: 413 too, not a 502.
    let mut chunked = Vec::new();
    for _ in 0..17 {
        chunked.extend_from_slice(b"10000\r\n");
        chunked.extend_from_slice(&[b'x'; 0x10000]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let got = http(
        &addr,
        &host,
        "POST",
        "/echo",
        &[("authorization", &bearer), ("transfer-encoding", "chunked")],
        &chunked,
    );
    assert_eq!(got.status, 413, "{}", got.text());
    // The WebSocket, with the key; silent for longer than the listener's idle timeout (an
    // upgraded connection is the upgrade's, not a kept-alive HTTP one).
    let pause = Some(Duration::from_millis(1500));
    let echoed = websocket_echo_twice(&server, &host, &[("authorization", &bearer)], "hi", pause);
    assert_eq!(echoed.as_deref(), Ok("echo:hi"));

    // Refusals: no credential, a caller who may not exec there, the proxy's port, a port
    // nothing listens on, a host that names no sandbox.
    let got = http(&addr, &host, "GET", "/headers", &[], b"");
    assert_eq!(got.status, 401, "{}", got.text());
    assert!(got.header("content-type").unwrap().starts_with("text/html"));
    let got = http(&addr, &host, "GET", "/headers", &[("authorization", &format!("Bearer {other}"))], b"");
    assert!(matches!(got.status, 403 | 404), "another user: {} {}", got.status, got.text());
    let got = http(&addr, &preview_host(&server, &a, 3128), "GET", "/", &[("authorization", &bearer)], b"");
    assert_eq!(got.status, 403, "the egress proxy's port: {}", got.text());
    let got = http(&addr, &preview_host(&server, &a, 8009), "GET", "/", &[("authorization", &bearer)], b"");
    assert_eq!(got.status, 502, "nothing listens: {}", got.text());
    assert!(got.text().contains("8009"), "{}", got.text());
    let got = http(&addr, "8000-nothing.preview.localhost", "GET", "/", &[("authorization", &bearer)], b"");
    assert_eq!(got.status, 404, "{}", got.text());
    // The API is still the API on its own host.
    assert_eq!(server.call("GET", "/healthz", None, None).0, 200);

    // A preview link: made by the owner, opened by anyone with its URL.
    let links = format!("/v1/orgs/acme/sandboxes/{a}/ports/8000/links");
    let refused = server.call("POST", &links, Some(&other), Some(json!({"ttl_s": 600})));
    assert!(matches!(refused.0, 403 | 404), "{}", refused.1);
    let bad = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{a}/ports/3128/links"),
        Some(&owner),
        Some(json!({})),
    );
    assert_eq!(bad.0, 403, "{}", bad.1);
    let made = server.call("POST", &links, Some(&owner), Some(json!({"ttl_s": 600})));
    assert_eq!(made.0, 201, "{}", made.1);
    let url = made.1["url"].as_str().unwrap().to_owned();
    let link_id = made.1["id"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&format!("http://{host}/?sandlane_preview_token=")), "{url}");
    let path = url.split_once(&host).unwrap().1.to_owned();
    let traded = http(&addr, &host, "GET", &path, &[], b"");
    assert_eq!(traded.status, 303, "{}", traded.text());
    assert_eq!(traded.header("location"), Some("/"));
    // A path that starts with two slashes sends the browser to this host still, never to
    // the host it names.
    let sent = path.replacen('/', "//evil.example/", 1);
    let traded = http(&addr, &host, "GET", &sent, &[], b"");
    assert_eq!(traded.status, 303, "{}", traded.text());
    assert_eq!(traded.header("location"), Some("/evil.example/"), "{sent}");
    let set = traded.header("set-cookie").unwrap().to_owned();
    for part in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age="] {
        assert!(set.contains(part), "{set}");
    }
    assert!(!set.contains("Secure"), "not over TLS: {set}");
    assert!(!set.to_ascii_lowercase().contains("domain"), "scoped to the host alone: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let got = http(&addr, &host, "GET", "/headers", &[("cookie", &cookie)], b"");
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["cookie"], Value::Null, "the lane's cookie reached the sandbox: {}", got.text());
    // A cookie another sandbox's page set for the whole preview domain, sent first, does
    // not shadow this host's own.
    let tossed = format!("sandlane_preview=tossed-by-another-page; {cookie}");
    let got = http(&addr, &host, "GET", "/headers", &[("cookie", &tossed)], b"");
    assert_eq!(got.status, 200, "the host's own cookie behind a tossed one: {}", got.text());
    // Over TLS (a proxy in front says so) the cookie is `__Host-`, which no other host can
    // set: it is tried first, behind however many tossed ones, and never reaches the app.
    let traded = http(&addr, &host, "GET", &path, &[("x-forwarded-proto", "https")], b"");
    assert_eq!(traded.status, 303, "{}", traded.text());
    let set = traded.header("set-cookie").unwrap().to_owned();
    assert!(set.starts_with("__Host-sandlane_preview=") && set.contains("; Secure"), "{set}");
    let host_cookie = set.split(';').next().unwrap().to_owned();
    let tossed = format!("{}{host_cookie}", "sandlane_preview=tossed-by-another-page; ".repeat(6));
    let got = http(&addr, &host, "GET", "/headers", &[("cookie", &tossed)], b"");
    assert_eq!(got.status, 200, "the __Host- cookie behind six tossed ones: {}", got.text());
    assert_eq!(got.json()["cookie"], Value::Null, "the lane's cookies reached the sandbox: {}", got.text());
    assert_eq!(
        websocket_echo(&server, &host, &[("cookie", &cookie)], "by link").as_deref(),
        Ok("echo:by link")
    );
    // A browser's request from another sandbox's page (same site) with the cookie is
    // refused; one from the page's own host is served.
    let from = |site: &'static str, mode: &'static str| {
        [
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", site),
            ("sec-fetch-mode", mode),
            ("sec-fetch-dest", "empty"),
        ]
    };
    let got = http(&addr, &host, "GET", "/headers", &from("same-site", "cors"), b"");
    assert_eq!(got.status, 403, "a fetch from another sandbox's page: {}", got.text());
    let got = http(&addr, &host, "GET", "/headers", &from("same-origin", "cors"), b"");
    assert_eq!(got.status, 200, "a fetch from the page's own host: {}", got.text());
    // Not on another sandbox's host, nor another port of this one.
    let got = http(&addr, &preview_host(&server, &b, 8000), "GET", "/headers", &[("cookie", &cookie)], b"");
    assert_eq!(got.status, 403, "another sandbox: {}", got.text());
    let got = http(&addr, &preview_host(&server, &a, 8001), "GET", "/", &[("cookie", &cookie)], b"");
    assert_eq!(got.status, 403, "another port: {}", got.text());
    // Listed, then revoked: the very next request with the cookie is refused.
    let listed = server.call("GET", &links, Some(&owner), None);
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert_eq!(listed.1["links"][0]["id"], link_id.as_str());
    assert!(!listed.1.to_string().contains("sandlane_preview_token"), "no token in a listing");
    // A WebSocket opened with the cookie and held open across the revocation.
    let (opened, echoed) = std::sync::mpsc::channel();
    let held = websocket_held(&server, &host, &[("cookie", &cookie)], opened, Duration::from_secs(40));
    echoed.recv_timeout(Duration::from_secs(30)).expect("the held WebSocket echoed");
    let revoked = server.call("DELETE", &format!("{links}/{link_id}"), Some(&owner), None);
    assert_eq!(revoked.0, 204, "{}", revoked.1);
    let got = http(&addr, &host, "GET", "/headers", &[("cookie", &cookie)], b"");
    assert_eq!(got.status, 403, "a revoked link: {}", got.text());
    // ... and that WebSocket ends at the server's next check of its link (every 10 s).
    let lasted = held.join().unwrap();
    assert!(
        lasted.is_some_and(|d| d < Duration::from_secs(25)),
        "a WebSocket of a revoked link ends within a check: open {lasted:?} after the revocation"
    );
    assert!(got.text().contains("revoked"), "{}", got.text());
    let got = http(&addr, &host, "GET", &path, &[], b"");
    assert_eq!(got.status, 403, "a revoked link's token: {}", got.text());

    // Made, opened (once per cookie: the token was traded three times above) and revoked: events
    // naming the link's creator.
    let audit = server.call("GET", "/v1/orgs/acme/audit?limit=1000", Some(&service), None);
    assert_eq!(audit.0, 200, "{}", audit.1);
    let events: Vec<&Value> = audit.1["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().is_some_and(|a| a.starts_with("preview_link")))
        .collect();
    let actions: Vec<&str> = events.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        vec![
            "preview_link_create",
            "preview_link_open",
            "preview_link_open",
            "preview_link_open",
            "preview_link_revoke"
        ],
        "{events:?}"
    );
    assert!(
        events.iter().all(|e| e["caller_id"] == "user-ada" && e["sandbox_id"] == a.as_str()),
        "{events:?}"
    );

    // The same through the CLI: made (its URL opens the port), listed, revoked.
    env.set("SANDLANE_KEY", &owner);
    let base = server.base.clone();
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--server", base.as_str()]);
        env.cli(&all)
    };
    let (code, out, err) = cli(&["sandbox", "preview", "acme", &a, "8000", "--ttl", "600"]);
    assert_eq!(code, 0, "{err}");
    let made: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let cli_link = made["id"].as_str().unwrap().to_owned();
    let path = made["url"].as_str().unwrap().split_once(&host).unwrap().1.to_owned();
    assert_eq!(http(&addr, &host, "GET", &path, &[], b"").status, 303, "the CLI's link opens the port");
    let (code, out, err) = cli(&["sandbox", "previews", "acme", &a, "8000"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&cli_link) && !out.contains("sandlane_preview_token"), "{out}");
    let (code, out, err) = cli(&["sandbox", "revoke-preview", "acme", &a, "8000", &cli_link]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    let listed = server.call("GET", &links, Some(&owner), None);
    let row = listed.1["links"].as_array().unwrap().iter().find(|l| l["id"] == cli_link.as_str()).cloned();
    assert!(row.is_some_and(|l| l["revoked_at"].is_string()), "{}", listed.1);
    for bad in [
        vec!["sandbox", "preview", "acme", a.as_str(), "0"],
        vec!["sandbox", "preview", "acme", a.as_str(), "8000", "--ttl", "5"],
        vec!["sandbox", "revoke-preview", "acme", a.as_str(), "8000", "sbx_nope"],
    ] {
        let (code, _, err) = cli(&bad);
        assert_eq!(code, 2, "{bad:?} is refused before any request: {err}");
    }
    let (code, _, err) = cli(&["sandbox", "preview", "acme", &b, "8000"]);
    assert_eq!(code, 0, "{err}");
    env.set("SANDLANE_KEY", &other);
    let (code, _, err) = env.cli(&["sandbox", "preview", "acme", &a, "8000", "--server", &base]);
    assert!(code != 0 && err.contains("403"), "another user may not: {code} {err}");

    // A sandbox that no longer runs: a clear 503.
    let gone =
        server.call("DELETE", &format!("/v1/orgs/acme/sessions/{b_session}/sandbox"), Some(&owner), None);
    assert_eq!(gone.0, 204, "{}", gone.1);
    let got =
        http(&addr, &preview_host(&server, &b, 8000), "GET", "/headers", &[("authorization", &bearer)], b"");
    assert_eq!(got.status, 503, "{}", got.text());
    assert!(got.text().contains("not running"), "{}", got.text());
}

/// A sandbox holds at most `streams.max_preview_connections_per_sandbox` preview
/// connections on a server (here 1): while a WebSocket to it is open, a request to any of
/// its ports gets a 429 page to retry; another sandbox is served meanwhile; once the
/// WebSocket closes, the sandbox is served again.
pub fn a_sandbox_at_its_preview_cap() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    env.set("SANDLANE_STREAMS__MAX_PREVIEW_CONNECTIONS_PER_SANDBOX", "1");
    let owner = env.add_caller("user-ada", "user", &["acme"]);
    let server = Server::start(&env);
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let (a, b) = (ensure(&server, &owner, &format!("ca{tag}")), ensure(&server, &owner, &format!("cb{tag}")));
    let bearer = format!("Bearer {owner}");
    let addr = address(&server);
    for sandbox in [&a, &b] {
        start_app(&server, &owner, sandbox);
        wait_serving(&server, &preview_host(&server, sandbox, 8000), "/headers", &bearer);
    }
    let host = preview_host(&server, &a, 8000);

    let (opened, echoed) = std::sync::mpsc::channel();
    let held = websocket_held(&server, &host, &[("authorization", &bearer)], opened, Duration::from_secs(3));
    echoed.recv_timeout(Duration::from_secs(30)).expect("the held WebSocket echoed");
    for port in [8000, 8001] {
        let got = http(
            &addr,
            &preview_host(&server, &a, port),
            "GET",
            "/headers",
            &[("authorization", &bearer)],
            b"",
        );
        assert_eq!(got.status, 429, "port {port}, past the cap: {}", got.text());
        assert_eq!(got.header("retry-after"), Some("1"));
        assert!(got.text().contains("streams.max_preview_connections_per_sandbox"), "{}", got.text());
    }
    let other =
        http(&addr, &preview_host(&server, &b, 8000), "GET", "/headers", &[("authorization", &bearer)], b"");
    assert_eq!(other.status, 200, "another sandbox's places are its own: {}", other.text());

    assert_eq!(held.join().unwrap(), None, "the WebSocket stayed open until the client closed it");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = http(&addr, &host, "GET", "/headers", &[("authorization", &bearer)], b"");
        if got.status == 200 {
            break;
        }
        assert_eq!(got.status, 429, "{}", got.text());
        assert!(Instant::now() < deadline, "the closed WebSocket's place never came back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

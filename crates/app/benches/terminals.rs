//! The terminals benchmark (issue 37): keystroke-to-echo latency through a real
//! `sandlane serve` (SQLite, bubblewrap), printed as one table.
//!
//! A terminal runs `cat` (the terminal's line discipline echoes each key as it arrives, as
//! it does for a shell's prompt); the client, attached over the WebSocket, sends one key
//! and times until its echo comes back: WebSocket to the server, the supervisor's input
//! stream, the pseudo-terminal, the supervisor's output buffer and its follower, the
//! server, the WebSocket. p50 and p99 over many keys, one at a time.
//!
//! `cargo bench -p app --bench terminals -- [--smoke] [--out FILE]`: `--smoke` (a few keys)
//! is for checking the bench still runs; `--out` prints the table into FILE too.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

mod support;
use support::{Served, quantile};

const ORG: &str = "bench";

/// A `sandlane serve` on its own data dir (SQLite, bubblewrap).
struct Server {
    served: Served,
    base: String,
    key: String,
}

impl Server {
    fn start() -> Self {
        let served = Served::start("sandlane-bench-terminals-", "svc-bench", ORG, &[]);
        Self { base: served.base(), key: served.key.clone(), served }
    }

    fn agent() -> ureq::Agent {
        Served::agent()
    }

    fn post(&self, route: &str, body: &Value) -> Value {
        let mut r = Self::agent()
            .post(&format!("{}{route}", self.base))
            .header("authorization", &format!("Bearer {}", self.key))
            .send_json(body)
            .expect("post");
        r.body_mut().read_json().expect("a JSON answer")
    }

    fn put(&self, route: &str, body: &Value) -> Value {
        let mut r = Self::agent()
            .put(&format!("{}{route}", self.base))
            .header("authorization", &format!("Bearer {}", self.key))
            .send_json(body)
            .expect("put");
        r.body_mut().read_json().expect("a JSON answer")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Self::agent()
            .delete(&format!("{}/v1/orgs/{ORG}/sessions/bench/sandbox", self.base))
            .header("authorization", &format!("Bearer {}", self.key))
            .call();
        self.served.stop();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let (warmup, keys) = if smoke { (5, 20) } else { (100, 2000) };
    let server = Server::start();
    let ensured =
        server.put(&format!("/v1/orgs/{ORG}/sessions/bench/sandbox"), &json!({"execution_id": "e-bench"}));
    assert_eq!(ensured["outcome"], "ready", "ensure: {ensured}");
    let sandbox = ensured["sandbox"]["id"].as_str().unwrap().to_owned();
    let route = format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/terminals");
    let terminal = server.post(&route, &json!({"argv": ["cat"], "cols": 80, "rows": 24}));
    let id = terminal["id"].as_str().unwrap_or_else(|| panic!("a terminal: {terminal}")).to_owned();

    let url = format!("{}{route}/{id}", server.base.replacen("http://", "ws://", 1));
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", server.key).parse().unwrap());
    let tcp = TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut socket, _) = tungstenite::client::client(request, tcp).expect("attach");

    let mut lags = Vec::with_capacity(keys);
    for i in 0..warmup + keys {
        // A letter, then at times a newline so `cat`'s line never grows long.
        let key: &[u8] = if i % 50 == 49 { b"\r" } else { b"k" };
        let sent = Instant::now();
        socket.send(Message::Binary(key.to_vec().into())).unwrap();
        loop {
            match socket.read().expect("the echo") {
                Message::Binary(bytes)
                    if bytes.contains(&key[0]) || (key == b"\r" && bytes.contains(&b'\n')) =>
                {
                    break;
                }
                _ => {}
            }
        }
        if i >= warmup {
            lags.push(sent.elapsed().as_secs_f64() * 1e3);
        }
        if key == b"\r" {
            // `cat` writes the line back: let it arrive before the next key.
            std::thread::sleep(Duration::from_millis(5));
            while let Ok(Message::Binary(_)) = {
                socket.get_ref().set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                socket.read()
            } {}
            socket.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
    }
    let _ = socket.close(None);
    let (p50, p99) = (quantile(&mut lags, 0.5), quantile(&mut lags, 0.99));
    let table = format!(
        "| # | measurement | result | target | status |\n|---|---|---|---|---|\n\
         | T1 | terminal keystroke to echo over the WebSocket ({keys} keys, one at a time; `cat` on the terminal, its \
         line discipline echoing) | p50 {p50:.3} ms, p99 {p99:.3} ms | p50 ≤ 2 ms | {} |\n",
        if p50 <= 2.0 { "met" } else { "**missed**" }
    );
    print!("{table}");
    if let Some(path) = out {
        std::fs::write(path, &table).expect("write the table");
    }
}

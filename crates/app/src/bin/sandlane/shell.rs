//! `sandlane sandbox shell`: an interactive terminal in a sandbox through a running server.
//! It starts a terminal (the sandbox's shell, sized as this terminal), attaches to it over
//! a WebSocket, and puts this terminal in raw mode (restored on every way out: the shell's
//! exit, a server that goes away, a signal, an error) so every key goes to the sandbox.
//! This terminal's size is sent at the start and again on every `SIGWINCH`; the exit
//! status is the shell's, or 125 for sandlane's own failures.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::cli::SandboxShell;
use crate::remote::{Client, failure, unreachable};
use app::config::Settings;

/// This terminal's size (columns, rows), if standard input or output is a terminal.
#[allow(unsafe_code)]
fn terminal_size() -> Option<(u16, u16)> {
    for fd in [std::io::stdout().as_raw_fd(), std::io::stdin().as_raw_fd()] {
        let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which is valid.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &raw mut size) } == 0
            && size.ws_col > 0
            && size.ws_row > 0
        {
            return Some((size.ws_col, size.ws_row));
        }
    }
    None
}

/// Standard input in raw mode while this lives; the settings it had are put back when it
/// is dropped (also while a panic unwinds).
struct RawMode {
    saved: Option<libc::termios>,
}

impl RawMode {
    #[allow(unsafe_code)]
    fn enter() -> Self {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: a zeroed termios is a valid value to be overwritten by tcgetattr.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios through the pointer, which is valid.
        if unsafe { libc::tcgetattr(fd, &raw mut saved) } != 0 {
            // Not a terminal: nothing to change, nothing to put back.
            return Self { saved: None };
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the struct in place; tcsetattr reads it.
        unsafe {
            libc::cfmakeraw(&raw mut raw);
            libc::tcsetattr(fd, libc::TCSANOW, &raw const raw);
        }
        Self { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            // SAFETY: tcsetattr reads the termios saved by `enter`.
            unsafe { libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, saved) };
        }
    }
}

/// Runs `sandbox shell`: the shell's exit status.
pub fn shell(args: &SandboxShell, settings: &Settings) -> Result<u8, String> {
    let client = Client::new(args.server.as_deref(), settings)?;
    let (cols, rows) = terminal_size().unwrap_or((80, 24));
    let mut body = json!({"cols": cols, "rows": rows});
    if !args.argv.is_empty() {
        body["argv"] = json!(args.argv);
    }
    let route = format!("/v1/orgs/{}/sandboxes/{}/terminals", args.org, args.id);
    let response = client
        .agent
        .post(&client.url(&route))
        .header("authorization", &client.auth())
        .send_json(&body)
        .map_err(|e| unreachable(&client.base, &e))?;
    if !response.status().is_success() {
        return Err(failure("terminal", response));
    }
    let terminal: Value = response
        .into_body()
        .read_json()
        .map_err(|e| format!("the server's answer is not a terminal: {e}"))?;
    let id = terminal["id"].as_str().ok_or("the server's answer names no terminal")?.to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let url = format!("{}{route}/{id}", client.base.replacen("http://", "ws://", 1));
    runtime.block_on(attach(&client, &url))
}

/// Attaches to the terminal at `url` until it ends: its exit code.
async fn attach(client: &Client, url: &str) -> Result<u8, String> {
    let mut request = url.into_client_request().map_err(|e| format!("{url}: {e}"))?;
    let auth = client.auth().parse().map_err(|_| "the key is not a valid header value".to_owned())?;
    request.headers_mut().insert("authorization", auth);
    let host = request.uri().host().unwrap_or("localhost").to_owned();
    let port = request.uri().port_u16().unwrap_or(80);
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot reach {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (ws, _) = tokio_tungstenite::client_async(request, tcp).await.map_err(|e| match e {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            format!("attach: {} {}", response.status(), body.trim())
        }
        e => format!("attach: {e}"),
    })?;
    let (mut sink, mut incoming) = ws.split();

    // Keys come from a thread of their own (a blocking read of standard input).
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = signal(SignalKind::window_change()).map_err(|e| format!("SIGWINCH: {e}"))?;
    let mut hangup = signal(SignalKind::hangup()).map_err(|e| format!("SIGHUP: {e}"))?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let _raw = RawMode::enter();
    let resize = |(cols, rows): (u16, u16)| {
        Message::Text(Utf8Bytes::from(json!({"type": "resize", "cols": cols, "rows": rows}).to_string()))
    };
    if let Some(size) = terminal_size() {
        sink.send(resize(size)).await.map_err(|e| format!("the terminal broke off: {e}"))?;
    }
    let mut stdout = std::io::stdout();
    let mut keys_open = true;
    loop {
        tokio::select! {
            message = incoming.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    let _ = stdout.write_all(&bytes);
                    let _ = stdout.flush();
                }
                Some(Ok(Message::Text(text))) => {
                    let control: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                    if control["type"] == "exit" {
                        let code = control["exit_code"].as_i64().unwrap_or(0);
                        return Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(255));
                    }
                }
                Some(Ok(Message::Close(_))) | None => {
                    return Err("the server ended the terminal's connection before its exit".into());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("the terminal broke off: {e}")),
            },
            key = keys.recv(), if keys_open => match key {
                Some(bytes) => {
                    if sink.send(Message::Binary(bytes.into())).await.is_err() {
                        return Err("the terminal's connection closed".into());
                    }
                }
                None => keys_open = false,
            },
            _ = winch.recv() => {
                if let Some(size) = terminal_size() {
                    let _ = sink.send(resize(size)).await;
                }
            }
            _ = hangup.recv() => return Err("hung up; the terminal runs on in the sandbox".into()),
            _ = terminate.recv() => return Err("terminated; the terminal runs on in the sandbox".into()),
        }
    }
}

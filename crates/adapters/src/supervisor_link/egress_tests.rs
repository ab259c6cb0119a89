//! The supervisor's egress side against the real `sandlane-supervisor` (outside a
//! sandbox: a socket path, a free loopback port): held connections announced in order,
//! bounded, relayed both ways once; one events stream at a time; a
//! supervisor started without egress says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::supervisor_link::client::{self, ClientError};
use supervisor::protocol::{Frame, FrameType, read_frame, write_frame};

struct Supervisor {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn start(egress_port: Option<u16>) -> Supervisor {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let mut command = Command::new(crate::supervisor_link::locate_for_tests().unwrap());
    command.arg("--socket").arg(&socket);
    if let Some(port) = egress_port {
        command.args(["--egress-port", &port.to_string()]);
    }
    let child = command.spawn().unwrap();
    let supervisor = Supervisor { child, _dir: dir, socket };
    let deadline = Instant::now() + Duration::from_secs(10);
    while client::ping(&supervisor.socket, Duration::from_secs(1)).await.is_err() {
        assert!(Instant::now() < deadline, "the supervisor did not answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    supervisor
}

fn connect(port: u16) -> std::net::TcpStream {
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()
}

async fn ids(socket: &Path, n: usize) -> (client::Events, Vec<u64>) {
    let mut events = client::events(socket, Duration::from_secs(5)).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < n {
        let id = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
        ids.push(id);
    }
    (events, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_connections_are_announced_and_relayed_once() {
    let port = free_port();
    let s = start(Some(port)).await;
    let (hello, _) = client::ping(&s.socket, Duration::from_secs(5)).await.unwrap();
    assert!(hello.features.iter().any(|f| f == "egress"), "{:?}", hello.features);

    // Connections made before anyone listens wait, and are announced first, in order.
    let mut first = connect(port);
    let _second = connect(port);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut events, got) = ids(&s.socket, 2).await;
    assert!(got[0] < got[1], "{got:?}");
    // A later one is announced as it comes.
    let _third = connect(port);
    let later = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
    assert!(later > got[1]);

    // The tunnel carries the bytes both ways, and ends each direction on its own.
    let (mut rx, mut tx) = client::tunnel(&s.socket, got[0], Duration::from_secs(5)).await.unwrap();
    first.write_all(b"from inside").unwrap();
    let frame = read_frame(&mut rx).await.unwrap().unwrap();
    assert_eq!((frame.kind, frame.payload.as_slice()), (FrameType::Data, &b"from inside"[..]));
    write_frame(&mut tx, &Frame { kind: FrameType::Data, payload: b"from outside".to_vec() }).await.unwrap();
    write_frame(&mut tx, &Frame { kind: FrameType::Data, payload: Vec::new() }).await.unwrap();
    let mut back = Vec::new();
    first.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"from outside", "then the end of the server's direction");
    first.shutdown(std::net::Shutdown::Write).unwrap();
    let end = read_frame(&mut rx).await.unwrap().unwrap();
    assert!(end.kind == FrameType::Data && end.payload.is_empty(), "the client's end: {end:?}");

    // Taken once: a second tunnel for the same id is refused.
    let again = client::tunnel(&s.socket, got[0], Duration::from_secs(5)).await.map(drop);
    assert!(matches!(&again, Err(ClientError::Refused { code, .. }) if code == "not_found"), "{again:?}");

    // While this stream is open, another server is refused: one server serves a sandbox.
    let second = client::events(&s.socket, Duration::from_secs(5)).await.unwrap();
    let mut second = second;
    let busy = tokio::time::timeout(Duration::from_secs(5), second.next()).await.unwrap();
    assert!(matches!(&busy, Err(ClientError::Refused { code, .. }) if code == "busy"), "{busy:?}");
    // Once it closes (its server gone), a new one is served, the held connections first.
    drop(events);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_newer, again) = ids(&s.socket, 2).await;
    assert_eq!(again, vec![got[1], later], "the connections still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_held_connections_wait() {
    let port = free_port();
    let s = start(Some(port)).await;
    let extra = 8;
    let clients: Vec<_> = (0..supervisor::egress::MAX_HELD + extra).map(|_| connect(port)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut events, got) = ids(&s.socket, supervisor::egress::MAX_HELD).await;
    assert_eq!(got.len(), supervisor::egress::MAX_HELD);
    let more = tokio::time::timeout(Duration::from_millis(500), events.next()).await;
    assert!(more.is_err(), "no more than MAX_HELD announced: {more:?}");
    // The ones past the cap were closed.
    let mut closed = 0;
    for mut c in clients {
        c.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let mut buf = [0u8; 1];
        if matches!(c.read(&mut buf), Ok(0)) {
            closed += 1;
        }
    }
    assert_eq!(closed, extra);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_without_egress_says_so() {
    let s = start(None).await;
    let (hello, _) = client::ping(&s.socket, Duration::from_secs(5)).await.unwrap();
    assert!(!hello.features.iter().any(|f| f == "egress"), "{:?}", hello.features);
    let refused = client::events(&s.socket, Duration::from_secs(5)).await;
    // The refusal comes as the first reply on the stream.
    let refused = match refused {
        Ok(mut events) => events.next().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        matches!(&refused, Err(ClientError::Refused { code, .. }) if code == "unsupported"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_connection_is_handed_over_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = free_port();
    let s = start(Some(port)).await;
    let (hello, _) = client::ping(&s.socket, Duration::from_secs(5)).await.unwrap();
    assert!(hello.features.iter().any(|f| f == "egress_take"), "{:?}", hello.features);
    let mut inside = connect(port);
    let (events, got) = ids(&s.socket, 1).await;
    assert!(events.serves("egress_take"));

    // The server holds the client's own connection: bytes both ways, no frames.
    let mut taken = client::take(&s.socket, got[0], Duration::from_secs(5)).await.unwrap();
    inside.write_all(b"from inside").unwrap();
    let mut buf = [0u8; 11];
    taken.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"from inside");
    taken.write_all(b"from outside").await.unwrap();
    taken.shutdown().await.unwrap();
    let mut back = Vec::new();
    inside.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"from outside", "then the end: the supervisor kept no copy open");

    // Taken once: neither a second take nor a tunnel finds it.
    let again = client::take(&s.socket, got[0], Duration::from_secs(5)).await.map(drop);
    assert!(matches!(&again, Err(ClientError::Refused { code, .. }) if code == "not_found"), "{again:?}");
    let tunnel = client::tunnel(&s.socket, got[0], Duration::from_secs(5)).await.map(drop);
    assert!(matches!(&tunnel, Err(ClientError::Refused { code, .. }) if code == "not_found"), "{tunnel:?}");
}

/// A supervisor that listens on the proxy's port itself (started with `--egress-port`:
/// a pod, or a sandbox of an earlier version) is served through `events`: a client that
/// connected before the server came and one after are both announced and taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_supervisor_that_listens_itself_are_announced_and_taken() {
    let port = free_port();
    let s = start(Some(port)).await;
    let (page, hits) = crate::driver_contract::page_server("egress page\n").await;
    let gate = std::sync::Arc::new(crate::driver_contract::TestGate {
        port: page,
        other_port: page,
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let get = move |mut client: std::net::TcpStream| {
        let head = format!(
            "GET http://allowed.test:{page}/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
        );
        client.write_all(head.as_bytes()).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        answer
    };
    let early = connect(port);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (socket, sandbox) = (s.socket.clone(), domain::SandboxId::generate(5, 5));
    let serving = tokio::spawn(async move {
        crate::egress::serve(
            &socket,
            &sandbox,
            gate,
            crate::egress::BrokerTls::without_ca(),
            Duration::from_secs(5),
        )
        .await
    });

    let answer = tokio::task::spawn_blocking(move || get(early)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("egress page\n"), "{answer}");
    let answer = tokio::task::spawn_blocking(move || get(connect(port))).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("egress page\n"), "{answer}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    let counts = client::egress_counts(&s.socket, Duration::from_secs(5)).await.unwrap();
    assert_eq!((counts.taken, counts.tunnelled), (2, 0), "{counts:?}");
    serving.abort();
}

/// How many of this process's descriptors are TCP connections whose local port is `local`
/// or whose peer's port is `remote` (from `/proc/self/fd` and `/proc/self/net/tcp`; a
/// listening socket is not one).
fn sockets_on(local: u16, remote: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for name in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let table = std::fs::read_to_string(name).unwrap_or_default();
        for line in table.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let port = |col: &str| col.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            let listening = cols.get(3) == Some(&"0A");
            if cols.len() > 9 && !listening && (port(cols[1]) == Some(local) || port(cols[2]) == Some(remote))
            {
                inodes.insert(format!("socket:[{}]", cols[9]));
            }
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| inodes.contains(&target.display().to_string()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_transfer_leaves_nothing_behind_on_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = free_port();
    let s = start(Some(port)).await;
    let (endless, ended) = crate::driver_contract::endless_server().await;
    let gate = std::sync::Arc::new(crate::driver_contract::TestGate {
        port: endless,
        other_port: endless,
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let sandbox = domain::SandboxId::generate(5, 5);
    let socket = s.socket.clone();
    let serving = tokio::spawn(async move {
        crate::egress::serve(
            &socket,
            &sandbox,
            gate,
            crate::egress::BrokerTls::without_ca(),
            Duration::from_secs(5),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks = metrics.num_alive_tasks();
    assert_eq!(sockets_on(port, endless), 0);

    let mut client = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!("CONNECT allowed.test:{endless} HTTP/1.1\r\nHost: allowed.test:{endless}\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(client.read(&mut byte).await.unwrap(), 1, "the answer ended early");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head));
    client.write_all(b"go").await.unwrap();
    let mut body = vec![0u8; 1 << 20];
    client.read_exact(&mut body).await.unwrap();
    // Mid-transfer the server holds the client's own connection (taken from the
    // supervisor: the descriptor received, kept for its last close on the closer thread,
    // and the runtime's copy of it) and the destination's.
    assert_eq!(sockets_on(port, endless), 3, "the client's connection (twice) and the upstream one");
    drop(client);

    let deadline = Instant::now() + Duration::from_secs(10);
    while ended.load(std::sync::atomic::Ordering::SeqCst) == 0
        || sockets_on(port, endless) != 0
        || metrics.num_alive_tasks() > tasks
    {
        assert!(
            Instant::now() < deadline,
            "left behind: {} sockets, {} tasks (from {tasks})",
            sockets_on(port, endless),
            metrics.num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serving.abort();
}

/// A client that first ends its own direction (its request sent: a clean end of stream)
/// and then goes away altogether is still told to the server as `gone` once a write to it
/// fails, not only by the tunnel's close: on Kubernetes the pod's gate holds the server's
/// connection for a while after the supervisor closes, and the destination would go on
/// sending for nobody until then.
#[tokio::test]
async fn a_client_gone_after_ending_its_direction_is_told_to_the_server() {
    let port = free_port();
    let s = start(Some(port)).await;
    let client = connect(port);
    let (_events, got) = ids(&s.socket, 1).await;
    let (mut rx, mut tx) = client::tunnel(&s.socket, got[0], Duration::from_secs(5)).await.unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let end = read_frame(&mut rx).await.unwrap().unwrap();
    assert!(end.kind == FrameType::Data && end.payload.is_empty(), "the client's end: {end:?}");
    drop(client);
    // The server's answer goes on; the writes to the client fail.
    let said = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let chunk = Frame { kind: FrameType::Data, payload: vec![b'x'; 64 << 10] };
            if write_frame(&mut tx, &chunk).await.is_err() {
                return None;
            }
            tokio::select! {
                frame = read_frame(&mut rx) => return frame.ok().flatten(),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    })
    .await
    .expect("the tunnel answered within 5 s");
    let said = said.map(|f| f.parse::<supervisor::protocol::Reply>());
    assert!(
        matches!(&said, Some(Ok(supervisor::protocol::Reply::Error { code, .. })) if code == "gone"),
        "the server is told the client is gone, not left with a closed tunnel: {said:?}"
    );
}

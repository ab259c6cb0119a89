//! The framed tunnel's bridge (Kubernetes' path): a client that half-closes and then goes
//! away must still end the pipe when the supervisor says `gone`. Plain-HTTP forwarding:
//! the byte allowance cuts one large download or upload, as it cuts a tunnel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use supervisor::protocol::{Frame, FrameType, Reply, write_frame};

#[tokio::test]
async fn gone_after_a_half_close_ends_the_pipe() {
    let (mut supervisor, rx) = tokio::io::duplex(1 << 20);
    let (tx, mut sink) = tokio::io::duplex(1 << 20);
    // The frames the server sends towards the client are read and dropped.
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(1..) = sink.read(&mut buf).await {}
    });
    let mut pipe = super::bridge(Box::new(rx), Box::new(tx));

    let data = |payload: &[u8]| Frame { kind: FrameType::Data, payload: payload.to_vec() };
    write_frame(&mut supervisor, &data(b"request")).await.unwrap();
    write_frame(&mut supervisor, &data(b"")).await.unwrap();
    let mut got = Vec::new();
    pipe.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"request", "then the client's end");
    // The answer still goes back after the half-close.
    pipe.write_all(b"answer").await.unwrap();

    let gone = Reply::Error { code: "gone".to_owned(), message: "the client went away".to_owned() };
    // Whether anyone reads it is what is tested (a bridge that stopped reading would leave
    // it in the socket's buffer; here, in memory, the write would fail instead).
    let _ = write_frame(&mut supervisor, &Frame::control(&gone).unwrap()).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        let chunk = vec![b'x'; 64 << 10];
        while pipe.write_all(&chunk).await.is_ok() {}
    })
    .await;
    assert!(ended.is_ok(), "the proxy's writes fail once the client is gone");
}

/// The plain-HTTP forwarding path against a destination on the loopback, through
/// [`super::serve_http`] as a sandbox's client connection is served, the gate granting a
/// byte allowance of [`LIMIT`]: a body larger than it is cut at it, either way.
mod forwarding {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use domain::SandboxId;
    use ports::egress::{EgressBudget, EgressGate, EgressGrant, MockEgressGate};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// The sandbox's byte allowance in these tests.
    const LIMIT: u64 = 1 << 20;
    /// The size of the large bodies: far past the allowance and any socket buffer.
    const TOTAL: usize = 32 << 20;
    const CHUNK: usize = 64 << 10;

    /// An allowance of `max` bytes, spent as the gate's lease spends it.
    struct Allowance {
        spent: Arc<AtomicU64>,
        max: u64,
    }

    impl EgressBudget for Allowance {
        fn spend(&self, bytes: u64) -> bool {
            self.spent.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes) <= self.max
        }
    }

    /// The proxy on a loopback port, every destination granted to `upstream`; and what the
    /// sandbox spent.
    async fn proxy(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicU64>) {
        let spent = Arc::new(AtomicU64::new(0));
        let mut gate = MockEgressGate::new();
        let counted = spent.clone();
        gate.expect_open().returning(move |_| {
            Ok(EgressGrant {
                addrs: vec![upstream],
                budget: Box::new(Allowance { spent: counted.clone(), max: LIMIT }),
                broker: None,
            })
        });
        let gate: Arc<dyn EgressGate> = Arc::new(gate);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let gate = gate.clone();
                tokio::spawn(async move {
                    super::super::serve_http(stream, &SandboxId::generate(1, 7), gate).await
                });
            }
        });
        (addr, spent)
    }

    /// Reads up to the end of a message's head.
    async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "the head ended early: {head:?}");
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    /// Reads until `most` bytes came or the connection ends (or fails): what came.
    async fn read_up_to(stream: &mut (impl AsyncRead + Unpin), most: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        while got.len() < most
            && let Ok(n @ 1..) = stream.read(&mut buf).await
        {
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[tokio::test]
    async fn a_download_larger_than_the_allowance_is_cut_at_it() {
        // The destination answers with TOTAL bytes and says how many it could send.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {TOTAL}\r\n\r\n");
            stream.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; CHUNK];
            let mut sent = 0;
            while sent < TOTAL && stream.write_all(&chunk).await.is_ok() {
                sent += CHUNK;
            }
            let _ = sent_tx.send(sent);
        });
        let (proxy, spent) = proxy(upstream).await;

        let mut client = TcpStream::connect(proxy).await.unwrap();
        let request = format!("GET http://up.test:{}/big HTTP/1.1\r\nhost: up.test\r\n\r\n", upstream.port());
        client.write_all(request.as_bytes()).await.unwrap();
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let body = tokio::time::timeout(Duration::from_secs(30), read_up_to(&mut client, TOTAL))
            .await
            .expect("the client's connection ends")
            .len();
        assert!(
            body as u64 <= LIMIT,
            "the client got {body} bytes of the body, past the allowance of {LIMIT}"
        );
        assert!(body > 0, "the bytes within the allowance passed");
        let sent = tokio::time::timeout(Duration::from_secs(30), sent_rx)
            .await
            .expect("the destination's connection is cut: its writes fail")
            .unwrap();
        assert!(sent < TOTAL, "the destination sent its whole answer");
        assert!(spent.load(Ordering::Relaxed) > LIMIT, "the allowance is used up");
    }

    #[tokio::test]
    async fn an_upload_larger_than_the_allowance_is_cut_at_it() {
        // The destination reads the request's body and says how much of it came.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let (got_tx, got_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let head = read_head(&mut stream).await;
            assert!(head.contains(&format!("content-length: {TOTAL}")), "{head}");
            let body = read_up_to(&mut stream, TOTAL).await.len();
            if body == TOTAL {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
            let _ = got_tx.send(body);
        });
        let (proxy, _spent) = proxy(upstream).await;

        let client = TcpStream::connect(proxy).await.unwrap();
        let (mut rx, mut tx) = client.into_split();
        let head = format!(
            "POST http://up.test:{}/up HTTP/1.1\r\nhost: up.test\r\ncontent-length: {TOTAL}\r\n\r\n",
            upstream.port()
        );
        // The upload goes on while it can; the proxy stops reading it at the allowance.
        let writer = tokio::spawn(async move {
            tx.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'y'; CHUNK];
            let mut sent = 0;
            while sent < TOTAL && tx.write_all(&chunk).await.is_ok() {
                sent += CHUNK;
            }
            sent
        });
        let received = tokio::time::timeout(Duration::from_secs(30), got_rx)
            .await
            .expect("the destination's request ends")
            .unwrap();
        assert!(
            received as u64 <= LIMIT,
            "the destination got {received} bytes, past the allowance of {LIMIT}"
        );
        assert!(received > 0, "the bytes within the allowance passed");
        let answer = tokio::time::timeout(Duration::from_secs(30), read_up_to(&mut rx, usize::MAX))
            .await
            .expect("the client's connection ends");
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(
            answer.starts_with("HTTP/1.1 429")
                && answer.contains("x-sandlane-egress: refused")
                && answer.contains("used its egress allowance"),
            "{answer}"
        );
        writer.abort();
    }
}

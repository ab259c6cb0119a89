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
    let (mut pipe, _tasks) = super::bridge(Box::new(rx), Box::new(tx));

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

/// A pipe whose server side is dropped while the peer stays silent (a sandbox's server
/// that keeps its connection open and sends nothing) ends soon after: the frames are not
/// waited for for ever, so the task and the connection under it go.
#[tokio::test]
async fn a_pipe_dropped_here_ends_though_the_peer_stays_silent() {
    let (mut supervisor, rx) = tokio::io::duplex(1 << 20);
    let (tx, mut sink) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(1..) = sink.read(&mut buf).await {}
    });
    let (pipe, _tasks) = super::bridge(Box::new(rx), Box::new(tx));
    drop(pipe);
    tokio::time::sleep(super::OURS_ENDED_GRACE + Duration::from_millis(500)).await;
    // A bridge still reading would take this frame; one that ended dropped its reader, so
    // the write fails at once.
    let data = Frame { kind: FrameType::Data, payload: b"late".to_vec() };
    let late = write_frame(&mut supervisor, &data).await;
    assert!(late.is_err(), "the bridge stopped reading the frames: {late:?}");
}

/// A peer that never reads what the bridge sends it (a supervisor that answers `tunnel`,
/// half-closes and then goes quiet) holds our side's pump in its write, where the end of
/// our side is never seen: once our side is done, the bridge still ends within
/// [`super::BRIDGE_DRAIN`], and the peer sees the connection end. Without it the pump, the
/// frame reader and the connection under them lived as long as the sandbox, one more for
/// each tunnel, though the permit that counted it was given back.
#[tokio::test(start_paused = true)]
async fn a_bridge_whose_peer_never_reads_ends_within_its_drain() {
    let (_supervisor, rx) = tokio::io::duplex(1 << 20);
    let (tx, mut peer) = tokio::io::duplex(64 << 10);
    let (mut pipe, tasks) = super::bridge(Box::new(rx), Box::new(tx));
    // More than the pipe and the peer's buffer hold: the pump is held in its write.
    let written = tokio::time::timeout(Duration::from_secs(1), pipe.write_all(&vec![b'x'; 4 << 20])).await;
    assert!(written.is_err(), "the peer reads nothing, so the writes stop");
    drop(pipe);
    let started = tokio::time::Instant::now();
    tasks.settle().await;
    assert!(started.elapsed() <= super::BRIDGE_DRAIN + Duration::from_secs(1), "{:?}", started.elapsed());
    // (The ended tasks are dropped at the runtime's next turns.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Still reading nothing, the peer finds the connection ended: what it writes fails.
    let late = peer.write_all(b"late").await;
    assert!(late.is_err(), "the connection under the bridge ended: {late:?}");
}

/// The plain-HTTP forwarding path against a destination on the loopback, through
/// [`super::serve_http`] as a sandbox's client connection is served, the gate granting a
/// byte allowance of [`LIMIT`]: a body larger than it is cut at it, either way.
/// An allowance of `max` bytes, spent as the gate's lease spends it (the forwarding and
/// brokered tests' budget).
struct Allowance {
    spent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    max: u64,
}

impl ports::egress::EgressBudget for Allowance {
    fn spend(&self, bytes: u64) -> bool {
        self.spent.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed).saturating_add(bytes) <= self.max
    }
}

mod forwarding {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use domain::SandboxId;
    use ports::egress::{EgressGate, EgressGrant, MockEgressGate};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::Allowance;

    /// The sandbox's byte allowance in these tests.
    const LIMIT: u64 = 1 << 20;
    /// The size of the large bodies: far past the allowance and any socket buffer.
    const TOTAL: usize = 32 << 20;
    const CHUNK: usize = 64 << 10;

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

    /// Headers carry bytes too: requests with large headers and no body, one after another
    /// on one connection, stop at the allowance (each head counted both ways).
    #[tokio::test]
    async fn headers_count_against_the_allowance() {
        const HEADER: usize = 48 << 10;
        const REQUESTS: usize = 64; // 3 MiB of headers, three times the allowance
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let seen = received.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    loop {
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            match stream.read(&mut byte).await {
                                Ok(1) => head.push(byte[0]),
                                _ => return,
                            }
                        }
                        seen.fetch_add(head.len() as u64, Ordering::Relaxed);
                        if stream.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let (proxy, _spent) = proxy(upstream).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let filler = "h".repeat(HEADER);
        let mut answered = 0;
        let mut refused = None;
        for _ in 0..REQUESTS {
            let request = format!(
                "GET http://up.test:{}/ HTTP/1.1\r\nhost: up.test\r\nx-carry: {filler}\r\n\r\n",
                upstream.port()
            );
            if client.write_all(request.as_bytes()).await.is_err() {
                break;
            }
            let head = tokio::time::timeout(Duration::from_secs(30), read_head(&mut client)).await.unwrap();
            if head.starts_with("HTTP/1.1 204") {
                answered += 1;
            } else {
                refused = Some(head);
                break;
            }
        }
        let refused = refused.expect("the proxy refused a request once the headers used the allowance");
        assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
        let got = received.load(Ordering::Relaxed);
        assert!(got <= LIMIT, "the destination got {got} bytes of headers, past the allowance of {LIMIT}");
        assert!(answered > 0 && answered < REQUESTS, "{answered} of {REQUESTS} requests answered");
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

/// Brokered secrets at the proxy, against loopback upstreams: a TLS server whose
/// certificate a test CA signed (given to the proxy as its upstream CA file) that echoes
/// the `authorization` it received, and clients that trust the sandbox's CA.
mod brokered {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;
    use domain::SandboxId;
    use domain::broker::Injection;
    use domain::secret::SecretValue;
    use http_body_util::{BodyExt, Empty, Full, StreamBody};
    use hyper::body::Frame;
    use hyper::{Request, Response};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use ports::egress::{BrokerAudit, BrokerUse, Brokered, EgressGate, EgressGrant, MockEgressGate};
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::Allowance;

    use super::super::ca::SandboxCa;
    use super::super::{BrokerTls, upstream_tls};

    const HOST: &str = "api.test";
    const SECRET: &str = "Bearer s3cret-value";
    /// The allowance in the byte-limit test.
    const LIMIT: u64 = 1 << 20;
    const BIG: usize = 32 << 20;

    /// Every use recorded, and what `record` answers.
    struct Audit {
        uses: Mutex<Vec<BrokerUse>>,
        answer: bool,
    }

    #[async_trait]
    impl BrokerAudit for Audit {
        async fn record(&self, used: &BrokerUse) -> bool {
            self.uses.lock().unwrap().push(used.clone());
            self.answer
        }
    }

    /// A test CA and a leaf of it for [`HOST`]: the upstream's certificate, and the CA
    /// in a PEM file for the proxy.
    struct UpstreamPki {
        chain: Vec<CertificateDer<'static>>,
        key: Vec<u8>,
        ca_file: tempfile::NamedTempFile,
    }

    fn upstream_pki() -> UpstreamPki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "upstream test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf =
            rcgen::CertificateParams::new(vec![HOST.to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
        let mut ca_file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut ca_file, ca_cert.pem().as_bytes()).unwrap();
        UpstreamPki { chain: vec![leaf.der().clone()], key: key.serialize_der(), ca_file }
    }

    /// The upstream: TLS with `alpn`, answering `/big` with [`BIG`] bytes and anything else
    /// with `authorization=<what it received>`; counts the requests it served.
    async fn upstream(pki: &UpstreamPki, alpn: &[&[u8]]) -> (SocketAddr, Arc<AtomicUsize>) {
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    pki.chain.clone(),
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key.clone())),
                )
                .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else { return };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    serve_echo(TokioIo::new(tls), h2, count).await;
                });
            }
        });
        (addr, served)
    }

    type TestBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

    fn echo(request: &Request<hyper::body::Incoming>) -> Response<TestBody> {
        if request.uri().path().ends_with("/big") {
            let chunks = futures_util::stream::iter(
                (0..BIG / (64 << 10))
                    .map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'x'; 64 << 10])))),
            );
            return Response::new(BodyExt::boxed(StreamBody::new(chunks)));
        }
        if request.uri().path().ends_with("/grpc") {
            // As a gRPC server answers: the body, then the status in trailers.
            let te = request.headers().get_all("te").iter().map(|v| v.to_str().unwrap().to_owned());
            let te: Vec<String> = te.collect();
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
            let frames = futures_util::stream::iter([
                Ok::<_, std::io::Error>(Frame::data(Bytes::from(format!("te={}", te.join("|"))))),
                Ok(Frame::trailers(trailers)),
            ]);
            return Response::new(BodyExt::boxed(StreamBody::new(frames)));
        }
        let auth = request.headers().get_all("authorization").iter().map(|v| v.to_str().unwrap().to_owned());
        let auth: Vec<String> = auth.collect();
        let body = format!("authorization={}", auth.join("|"));
        Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed())
    }

    async fn serve_echo<I>(io: TokioIo<I>, h2: bool, count: Arc<AtomicUsize>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |request| {
            count.fetch_add(1, Ordering::SeqCst);
            let response = echo(&request);
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        if h2 {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(io, service)
                .await;
        } else {
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        }
    }

    /// A plain HTTP echo upstream.
    async fn plain_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_echo(TokioIo::new(stream), false, count.clone()));
            }
        });
        (addr, served)
    }

    struct Proxy {
        addr: SocketAddr,
        ca: Arc<SandboxCa>,
        audit: Arc<Audit>,
        spent: Arc<AtomicU64>,
    }

    /// The proxy granting every destination to `upstream`, brokered (GET and POST under
    /// `/repos`) or not, the audit answering `record_ok`.
    async fn proxy(
        upstream: SocketAddr,
        pki: &UpstreamPki,
        brokered: bool,
        record_ok: bool,
        max: u64,
    ) -> Proxy {
        proxy_for(upstream, pki, brokered, record_ok, max, super::super::broker::BROKERED_LIFETIME).await
    }

    /// [`proxy`], its brokered connections taking new requests for `lifetime`.
    async fn proxy_for(
        upstream: SocketAddr,
        pki: &UpstreamPki,
        brokered: bool,
        record_ok: bool,
        max: u64,
        lifetime: Duration,
    ) -> Proxy {
        let sandbox = SandboxId::generate(1, 9);
        let ca = Arc::new(SandboxCa::generate(&sandbox).unwrap());
        let audit = Arc::new(Audit { uses: Mutex::new(Vec::new()), answer: record_ok });
        let spent = Arc::new(AtomicU64::new(0));
        let mut gate = MockEgressGate::new();
        let (counted, audited) = (spent.clone(), audit.clone());
        gate.expect_open().returning(move |_| {
            let broker = brokered.then(|| Brokered {
                injections: vec![Injection {
                    secret: "gh".into(),
                    header: "authorization".into(),
                    value: SecretValue::new(SECRET),
                    methods: vec!["GET".into(), "POST".into()],
                    paths: vec!["/repos".into()],
                }],
                audit: audited.clone(),
            });
            Ok(EgressGrant {
                addrs: vec![upstream],
                budget: Box::new(Allowance { spent: counted.clone(), max }),
                broker,
            })
        });
        let gate: Arc<dyn EgressGate> = Arc::new(gate);
        let mut tls =
            BrokerTls::new(Some(Arc::new(ca.clone())), upstream_tls(Some(pki.ca_file.path())).unwrap());
        tls.lifetime = lifetime;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (gate, tls, sandbox) = (gate.clone(), tls.clone(), sandbox.clone());
                tokio::spawn(async move { super::super::serve_http_with(stream, &sandbox, gate, tls).await });
            }
        });
        Proxy { addr, ca, audit, spent }
    }

    /// A `CONNECT` to `HOST:443` answered 200.
    async fn connect(proxy: SocketAddr) -> TcpStream {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream
            .write_all(format!("CONNECT {HOST}:443 HTTP/1.1\r\nhost: {HOST}:443\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1);
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        stream
    }

    /// TLS through the tunnel, trusting `root` (PEM), with `sni` and `alpn`.
    async fn tls(
        stream: TcpStream,
        root: &str,
        sni: &str,
        alpn: &[u8],
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(root.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        connector.connect(ServerName::try_from(sni.to_owned()).unwrap(), stream).await
    }

    /// Sends `method path` with the sandbox's own `authorization` over `io` (HTTP/2 or 1.1):
    /// the status and the body.
    async fn send<I>(io: I, h2: bool, method: &str, path: &str) -> (u16, String)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        let request = |uri: String| {
            Request::builder()
                .method(method)
                .uri(uri)
                .header("authorization", "Bearer the-sandbox-own")
                .body(Empty::<Bytes>::new())
                .unwrap()
        };
        let response = if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
            tokio::spawn(conn);
            sender.send_request(request(format!("https://{HOST}{path}"))).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let mut r = request(path.to_owned());
            r.headers_mut().insert("host", HOST.parse().unwrap());
            // A sandbox that names the header in `Connection` does not strip the secret.
            r.headers_mut().insert("connection", "authorization".parse().unwrap());
            sender.send_request(r).await.unwrap()
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_secret_replaces_the_sandbox_header_over_http1_and_http2() {
        let pki = upstream_pki();
        for (client_h2, upstream_alpn) in [
            (false, [b"http/1.1".as_slice()]),
            (true, [b"http/1.1".as_slice()]),
            (false, [b"h2".as_slice()]),
            (true, [b"h2".as_slice()]),
        ] {
            let (up, served) = upstream(&pki, &upstream_alpn).await;
            let p = proxy(up, &pki, true, true, u64::MAX).await;
            let alpn: &[u8] = if client_h2 { b"h2" } else { b"http/1.1" };
            let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, alpn)
                .await
                .expect("the sandbox's CA is trusted");
            assert_eq!(stream.get_ref().1.alpn_protocol(), Some(alpn), "ALPN");
            let (status, body) = send(stream, client_h2, "GET", "/repos/acme/x?page=2").await;
            assert_eq!(
                (status, body.as_str()),
                (200, format!("authorization={SECRET}").as_str()),
                "h2 {client_h2}"
            );
            assert_eq!(served.load(Ordering::SeqCst), 1);
            let uses = p.audit.uses.lock().unwrap().clone();
            assert_eq!(uses.len(), 1);
            assert_eq!(
                (
                    uses[0].secret.as_str(),
                    uses[0].host.as_str(),
                    uses[0].method.as_str(),
                    uses[0].path.as_str(),
                    uses[0].allowed
                ),
                ("gh", HOST, "GET", "/repos/acme/x", true)
            );
            assert!(p.spent.load(Ordering::Relaxed) > 0, "the bytes are counted");
            assert_eq!(p.ca.cached_leaves(), 1);
        }
    }

    /// gRPC through the brokered path: `TE: trailers` reaches the server (its other
    /// hop-by-hop headers do not) and the answer's trailers reach the client.
    #[tokio::test]
    async fn grpc_keeps_te_trailers_and_gets_its_trailers() {
        let pki = upstream_pki();
        let (up, served) = upstream(&pki, &[b"h2"]).await;
        let p = proxy(up, &pki, true, true, u64::MAX).await;
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"h2").await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request = Request::builder()
            .method("POST")
            .uri(format!("https://{HOST}/repos/grpc"))
            .header("te", "trailers")
            .header("content-type", "application/grpc")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let collected = response.into_body().collect().await.unwrap();
        let status = collected.trailers().and_then(|t| t.get("grpc-status").cloned());
        assert_eq!(collected.to_bytes(), "te=trailers");
        assert_eq!(status.as_ref().map(|v| v.as_bytes()), Some(b"0".as_slice()), "the trailers came");
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }

    /// The hop-by-hop rules: what one hop says about itself never passes; `TE: trailers`
    /// alone does, on a request.
    #[test]
    fn hop_by_hop_headers_stop_at_the_proxy() {
        let mut headers = hyper::HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic eA=="),
            ("x-kept", "yes"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        let mut response = headers.clone();
        super::super::broker::strip_hop_by_hop(&mut headers, true);
        let mut names: Vec<&str> = headers.keys().map(hyper::header::HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "x-kept"]);
        super::super::broker::strip_hop_by_hop(&mut response, false);
        let names: Vec<&str> = response.keys().map(hyper::header::HeaderName::as_str).collect();
        assert_eq!(names, ["x-kept"]);
        // Any other TE (or more than one) is the client's hop's own.
        let mut other = hyper::HeaderMap::new();
        other.insert("te", "gzip, trailers".parse().unwrap());
        super::super::broker::strip_hop_by_hop(&mut other, true);
        assert!(other.is_empty(), "{other:?}");
    }

    #[tokio::test]
    async fn a_request_outside_the_binding_is_refused_and_recorded() {
        let pki = upstream_pki();
        let (up, served) = upstream(&pki, &[b"http/1.1"]).await;
        let p = proxy(up, &pki, true, true, u64::MAX).await;
        for (method, path) in [("DELETE", "/repos/acme"), ("GET", "/admin"), ("GET", "/repos/../admin")] {
            let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"http/1.1").await.unwrap();
            let (status, body) = send(stream, false, method, path).await;
            assert_eq!(status, 403, "{method} {path}: {body}");
            assert!(!body.contains(SECRET));
        }
        // TRACE is refused whatever the binding allows (405, not the binding's 403): its
        // answer would echo the secret back to the sandbox.
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"http/1.1").await.unwrap();
        let (status, body) = send(stream, false, "TRACE", "/repos/acme").await;
        assert_eq!(status, 405, "{body}");
        assert_eq!(served.load(Ordering::SeqCst), 0, "nothing reached the upstream");
        let uses = p.audit.uses.lock().unwrap().clone();
        assert_eq!(uses.len(), 3);
        assert!(uses.iter().all(|u| !u.allowed && u.secret == "gh"), "{uses:?}");
    }

    /// The secrets of a brokered connection were chosen when it opened: past its lifetime
    /// it takes no new request, so the sandbox's client opens a new one, decided afresh.
    #[tokio::test]
    async fn a_brokered_connection_takes_no_new_request_past_its_lifetime() {
        let pki = upstream_pki();
        let (up, served) = upstream(&pki, &[b"http/1.1"]).await;
        let p = proxy_for(up, &pki, true, true, u64::MAX, Duration::from_millis(300)).await;
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"http/1.1").await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        let get = || Request::get("/repos/acme").header("host", HOST).body(Empty::<Bytes>::new()).unwrap();
        let first = sender.send_request(get()).await.unwrap();
        assert_eq!(first.status(), 200);
        first.into_body().collect().await.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let second = sender.send_request(get()).await;
        assert!(second.is_err(), "a request past the lifetime was taken: {:?}", second.map(|r| r.status()));
        assert_eq!(served.load(Ordering::SeqCst), 1, "only the first reached the upstream");
        // A new connection is served (its decision made afresh).
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"http/1.1").await.unwrap();
        assert_eq!(send(stream, false, "GET", "/repos/acme").await.0, 200);
    }

    #[tokio::test]
    async fn a_use_that_cannot_be_recorded_is_not_sent() {
        let pki = upstream_pki();
        let (up, served) = upstream(&pki, &[b"http/1.1"]).await;
        let p = proxy(up, &pki, true, false, u64::MAX).await;
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"h2").await.unwrap();
        let (status, _) = send(stream, true, "GET", "/repos/acme").await;
        assert_eq!(status, 503);
        assert_eq!(served.load(Ordering::SeqCst), 0, "nothing reached the upstream");
        assert_eq!(p.audit.uses.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_client_hello_naming_another_host_is_refused_brokered_or_not() {
        let pki = upstream_pki();
        let (up, served) = upstream(&pki, &[b"http/1.1"]).await;
        let root = std::fs::read_to_string(pki.ca_file.path()).unwrap();
        // Brokered: no certificate for another name (nor for none).
        let p = proxy(up, &pki, true, true, u64::MAX).await;
        let fronted = tls(connect(p.addr).await, p.ca.cert_pem(), "other.test", b"http/1.1").await;
        assert!(fronted.is_err(), "the proxy ended TLS for another name");
        assert_eq!(p.ca.cached_leaves(), 0, "no leaf was issued");
        // End to end: the upstream's own certificate for other.test would not matter; the
        // tunnel closes before the ClientHello reaches it.
        let p = proxy(up, &pki, false, true, u64::MAX).await;
        let fronted = tls(connect(p.addr).await, &root, "other.test", b"http/1.1").await;
        assert!(fronted.is_err(), "a tunnel carried a ClientHello for another name");
        assert_eq!(served.load(Ordering::SeqCst), 0);
        // Positive control: the same tunnel with the CONNECT's name is end to end (the
        // upstream's own certificate, the sandbox's own header, no secret, no audit).
        let stream = tls(connect(p.addr).await, &root, HOST, b"http/1.1").await.expect("end to end");
        let (status, body) = send(stream, false, "GET", "/repos/acme").await;
        assert_eq!((status, body.as_str()), (200, "authorization=Bearer the-sandbox-own"));
        assert!(p.audit.uses.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_plain_request_gets_the_same_check_record_and_header() {
        let pki = upstream_pki();
        let (up, served) = plain_upstream().await;
        let p = proxy(up, &pki, true, true, u64::MAX).await;
        let ask = |method: &str, path: &str| {
            format!(
                "{method} http://{HOST}:{}{path} HTTP/1.1\r\nhost: {HOST}\r\nauthorization: Bearer the-sandbox-own\r\nAuthorization: x\r\nconnection: close\r\n\r\n",
                up.port()
            )
        };
        let mut client = TcpStream::connect(p.addr).await.unwrap();
        client.write_all(ask("GET", "/repos/acme").as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with(&format!("authorization={SECRET}")),
            "{answer}"
        );
        let mut client = TcpStream::connect(p.addr).await.unwrap();
        client.write_all(ask("PUT", "/repos/acme").as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert_eq!(served.load(Ordering::SeqCst), 1);
        let allowed: Vec<bool> = p.audit.uses.lock().unwrap().iter().map(|u| u.allowed).collect();
        assert_eq!(allowed, [true, false]);
    }

    #[tokio::test]
    async fn a_brokered_download_is_cut_at_the_allowance() {
        let pki = upstream_pki();
        let (up, _) = upstream(&pki, &[b"http/1.1"]).await;
        let p = proxy(up, &pki, true, true, LIMIT).await;
        let stream = tls(connect(p.addr).await, p.ca.cert_pem(), HOST, b"http/1.1").await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request =
            Request::builder().uri("/repos/big").header("host", HOST).body(Empty::<Bytes>::new()).unwrap();
        let response = sender.send_request(request).await.unwrap();
        let mut body = response.into_body();
        let mut got = 0usize;
        let read = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(Ok(frame)) = body.frame().await {
                got += frame.data_ref().map_or(0, Bytes::len);
            }
        })
        .await;
        assert!(read.is_ok(), "the download ends");
        assert!(got > 0 && (got as u64) <= LIMIT, "the client got {got} bytes past an allowance of {LIMIT}");
        assert!(p.spent.load(Ordering::Relaxed) > LIMIT);
    }
}

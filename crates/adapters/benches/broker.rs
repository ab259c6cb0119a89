//! The brokered proxy's cost (issue 35), in-process on the loopback: a 10 MiB HTTPS
//! download from a TLS server (its certificate from a test CA given to the proxy as its
//! upstream CA file) straight from the host, through an end-to-end `CONNECT` tunnel, and
//! through the brokered path (TLS ended with a leaf of the sandbox's CA, the header set,
//! TLS again to the server), interleaved round by round; medians of throughput and of the
//! time to the first byte of the answer (new connection each time), and the brokered
//! handshake with the leaf minted against one from the cache.
//!
//! `cargo bench -p adapters --bench broker -- [--smoke]`. Not a CI gate: it prints.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use adapters::egress::BrokerTls;
use adapters::egress::ca::SandboxCa;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "api.test";
const BIG: usize = 10 << 20;

struct Free;
impl ports::EgressBudget for Free {
    fn spend(&self, _: u64) -> bool {
        true
    }
}

struct Audit;
#[async_trait::async_trait]
impl ports::egress::BrokerAudit for Audit {
    async fn record(&self, _: &ports::egress::BrokerUse) -> bool {
        true
    }
}

struct Gate {
    upstream: SocketAddr,
    brokered: bool,
}

#[async_trait::async_trait]
impl ports::EgressGate for Gate {
    async fn open(&self, _: &ports::EgressRequest) -> Result<ports::EgressGrant, ports::EgressRefusal> {
        let broker = self.brokered.then(|| ports::egress::Brokered {
            injections: vec![domain::broker::Injection {
                secret: "bench".into(),
                header: "authorization".into(),
                value: domain::secret::SecretValue::new("Bearer bench"),
                methods: vec![],
                paths: vec![],
            }],
            audit: Arc::new(Audit),
        });
        Ok(ports::EgressGrant { addrs: vec![self.upstream], budget: Box::new(Free), broker })
    }
}

async fn upstream(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> SocketAddr {
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(vec![b'x'; BIG]);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (acceptor, body) = (acceptor.clone(), body.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |_request| {
                    let body = body.clone();
                    async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

async fn proxy(gate: Gate, tls: BrokerTls) -> SocketAddr {
    let gate: Arc<dyn ports::EgressGate> = Arc::new(gate);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sandbox = domain::SandboxId::generate(1, 1);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (gate, tls, sandbox) = (gate.clone(), tls.clone(), sandbox.clone());
            tokio::spawn(async move { adapters::egress::serve_http_with(stream, &sandbox, gate, tls).await });
        }
    });
    addr
}

fn client_config(root_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One download on a new connection: (handshake done, first byte of the answer, MiB/s).
async fn download(
    via: Option<SocketAddr>,
    direct: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> (f64, f64, f64) {
    let start = Instant::now();
    let mut tcp = TcpStream::connect(via.unwrap_or(direct)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    if via.is_some() {
        tcp.write_all(format!("CONNECT {HOST}:443 HTTP/1.1\r\nhost: {HOST}:443\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            tcp.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"));
    }
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = connector.connect(ServerName::try_from(HOST).unwrap(), tcp).await.unwrap();
    let handshake = start.elapsed().as_secs_f64() * 1000.0;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let request =
        hyper::Request::builder().uri("/big").header("host", HOST).body(Empty::<Bytes>::new()).unwrap();
    let sent = Instant::now();
    let response = sender.send_request(request).await.unwrap();
    let mut body = response.into_body();
    let mut got = 0usize;
    let mut first = None;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.unwrap().data_ref() {
            first.get_or_insert_with(|| sent.elapsed());
            got += data.len();
        }
    }
    assert_eq!(got, BIG);
    let total = sent.elapsed().as_secs_f64();
    (handshake, first.unwrap_or_default().as_secs_f64() * 1000.0, BIG as f64 / (1 << 20) as f64 / total)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let rounds = if smoke { 2 } else { 15 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![HOST.to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        let up = upstream(vec![leaf.der().clone()], PrivateKeyDer::Pkcs8(key.serialize_der().into())).await;
        let upstream_tls = adapters::egress::upstream_tls(Some(&ca_file)).unwrap();
        let sandbox_ca = Arc::new(SandboxCa::generate(&domain::SandboxId::generate(1, 1)).unwrap());
        let tls = BrokerTls::new(Some(Arc::new(sandbox_ca.clone())), upstream_tls);
        let tunnel = proxy(Gate { upstream: up, brokered: false }, tls.clone()).await;
        let brokered = proxy(Gate { upstream: up, brokered: true }, tls).await;
        let to_upstream = client_config(&ca_cert.pem());
        let to_proxy = client_config(sandbox_ca.cert_pem());

        // The first brokered connection mints the leaf.
        let (minted, _, _) = download(Some(brokered), up, to_proxy.clone()).await;
        let mut runs: [(Vec<f64>, Vec<f64>, Vec<f64>); 3] = Default::default();
        for _ in 0..rounds {
            for (i, (via, config)) in [(None, &to_upstream), (Some(tunnel), &to_upstream), (Some(brokered), &to_proxy)]
                .into_iter()
                .enumerate()
            {
                let (hs, first, speed) = download(via, up, config.clone()).await;
                runs[i].0.push(hs);
                runs[i].1.push(first);
                runs[i].2.push(speed);
            }
        }
        let direct_speed = median(runs[0].2.clone());
        let direct_first = median(runs[0].1.clone());
        println!("10 MiB HTTPS download, {rounds} rounds interleaved, medians:");
        for (name, (hs, first, speed)) in ["direct", "tunnel", "brokered"].iter().zip(runs) {
            let (hs, first, speed) = (median(hs), median(first), median(speed));
            println!(
                "  {name:9} {speed:7.0} MiB/s ({:.2}x direct)  first byte {first:6.2} ms (+{:.2} ms)  handshake {hs:6.2} ms",
                speed / direct_speed,
                first - direct_first
            );
        }
        println!("  brokered handshake with the leaf minted: {minted:.2} ms");
    });
}

//! The fake API server's port-forward: a websocket (`v4.channel.k8s.io`) carrying one TCP
//! connection to a pod's port. Each binary message starts with a channel byte: 0 is the
//! port's data, 1 its error text; the first message on each channel from the server is
//! the port number (two bytes, little-endian). The websocket is upgraded on axum's own
//! hyper connection and spoken with kube's tokio-tungstenite (one version in the tree).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Message, handshake::derive_accept_key};

use super::Shared;
use super::store::{Kind, StatusError};

const PROTOCOL: &str = "v4.channel.k8s.io";

fn refuse(code: u16, reason: &'static str, message: String) -> Response {
    let e = StatusError { code, reason, message };
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
        [(header::CONTENT_TYPE, "application/json")],
        e.to_json().to_string(),
    )
        .into_response()
}

pub(super) async fn upgrade(
    shared: Arc<Shared>,
    namespace: String,
    name: String,
    query: &[(String, String)],
    mut req: Request,
) -> Response {
    if shared.store().get(Kind::Pod, &namespace, &name).is_none() {
        return refuse(404, "NotFound", format!("pods \"{name}\" not found"));
    }
    let ports: Vec<u16> =
        query.iter().filter(|(k, _)| k == "ports").filter_map(|(_, v)| v.parse().ok()).collect();
    let [port] = ports.as_slice() else {
        return refuse(400, "BadRequest", "the fake forwards exactly one port per connection".to_owned());
    };
    let port = *port;
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return refuse(400, "BadRequest", "not a websocket upgrade".to_owned());
    };
    let offered = req
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim() == PROTOCOL));
    if !offered {
        return refuse(400, "BadRequest", format!("the client did not offer {PROTOCOL}"));
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        relay(shared, namespace, name, port, ws).await;
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(PROTOCOL));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

async fn relay<S>(shared: Arc<Shared>, namespace: String, name: String, port: u16, ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let [lo, hi] = port.to_le_bytes();
    if sink.send(Message::binary(vec![0, lo, hi])).await.is_err()
        || sink.send(Message::binary(vec![1, lo, hi])).await.is_err()
    {
        return;
    }
    let tcp = match shared.kubelet.connect(&namespace, &name, port).await {
        Ok(t) => t,
        Err(e) => {
            let text = format!("error forwarding port {port} to pod {name}: {e}");
            let mut message = vec![1];
            message.extend_from_slice(text.as_bytes());
            let _ = sink.send(Message::binary(message)).await;
            let _ = sink.send(Message::Close(None)).await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut tcp_rx, mut tcp_tx) = tcp.into_split();
    let inbound = async {
        while let Some(Ok(message)) = stream.next().await {
            let data = match message {
                Message::Binary(bytes) if bytes.len() > 1 && bytes[0] == 0 => bytes,
                Message::Close(_) => break,
                _ => continue,
            };
            if tcp_tx.write_all(&data[1..]).await.is_err() {
                break;
            }
        }
        let _ = tcp_tx.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match tcp_rx.read(&mut buf[1..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf[0] = 0;
                    if sink.send(Message::binary(buf[..=n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    // The pod's side ending ends the forward; the client's side ending closes the
    // connection's input and the pod's side then ends.
    tokio::select! {
        () = outbound => {}
        () = async { inbound.await; std::future::pending::<()>().await } => {}
    }
}

//! The supervisor's side of preview ports (`connect`, see [`crate::protocol`]): a
//! connection to a port of the sandbox's own loopback, made by the supervisor inside the
//! sandbox's network namespace, handed over to the server (its descriptor, over a unix
//! socket) or relayed in frames (a port-forward). Only `127.0.0.1`, and never a port the
//! lane itself serves inside the sandbox: the egress proxy's (a visitor would use the
//! sandbox's egress and its brokered secrets) or the supervisor's own gate.

use std::os::fd::AsFd;
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use crate::protocol::{CONNECT_TIMEOUT_MS, Frame, Reply, write_frame};

/// Whether `port` may be connected to, given the ports the lane serves in this sandbox
/// (`lane_ports`: the supervisor's gate, its egress port); the egress proxy's port and
/// port 0 never may.
pub(crate) fn allowed(port: u16, lane_ports: &[u16]) -> bool {
    port != 0 && port != domain::egress::PROXY_PORT && !lane_ports.contains(&port)
}

async fn send(stream: &mut UnixStream, reply: &Reply) {
    if let Ok(frame) = Frame::control(reply) {
        let _ = write_frame(stream, &frame).await;
    }
}

fn error(code: &str, message: String) -> Reply {
    Reply::Error { code: code.to_owned(), message }
}

/// Serves one `connect`.
pub(crate) async fn connect(mut stream: UnixStream, port: u16, hand_over: bool, lane_ports: &[u16]) {
    if !allowed(port, lane_ports) {
        let message = format!("port {port} is not open to previews (the lane serves it inside the sandbox)");
        send(&mut stream, &error("invalid", message)).await;
        return;
    }
    let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let tcp = match tokio::time::timeout(timeout, TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)))
        .await
    {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            send(&mut stream, &error("unreachable", format!("nothing accepts on port {port}: {e}"))).await;
            return;
        }
        Err(_) => {
            let message = format!("port {port} did not accept within {CONNECT_TIMEOUT_MS} ms");
            send(&mut stream, &error("unreachable", message)).await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    if hand_over {
        crate::egress::send_with_fd(&mut stream, &Reply::Connected, tcp.as_fd()).await;
        drop(tcp);
    } else {
        crate::egress::relay(stream, tcp).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lanes_own_ports_are_refused() {
        assert!(!allowed(0, &[]));
        assert!(!allowed(domain::egress::PROXY_PORT, &[]));
        assert!(!allowed(7000, &[7000]));
        assert!(allowed(3000, &[7000]));
        assert!(allowed(8080, &[]));
    }
}

//! The supervisor channel over the API server: one port-forward per operation.
//!
//! `POST /api/v1/namespaces/{ns}/pods/{pod}/portforward?ports={port}` upgraded to a
//! websocket (`v4.channel.k8s.io`): the kubelet connects to the supervisor's loopback
//! port inside the pod's network namespace and the websocket carries that one TCP
//! connection's bytes (channel 0 data, channel 1 errors). The supervisor admits the
//! connection only after the sandbox's channel key ([`supervisor::gate`]); then
//! it carries [`supervisor::protocol`] unchanged, so every operation of
//! [`crate::supervisor_link::client`] runs over it. Closing the stream closes the websocket,
//! the kubelet closes the TCP connection, and the supervisor ends the operation.
//!
//! Why port-forward rather than `exec` or `attach`: `exec` starts a process in the
//! container for every operation (a container-runtime exec, tens of milliseconds on a
//! node, and a process that the supervisor would have to tell apart from the sandbox's
//! own), and `attach` gives one shared stdin/stdout for the pod's life, so operations
//! would need a multiplexer of their own. A port-forward costs one websocket handshake
//! and one loopback connect, and gives exactly the one-connection-per-operation shape
//! the protocol has on a unix socket.

use std::io;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::io::DuplexStream;

use crate::supervisor_link::client::{ClientError, Connect};
use supervisor::gate::ChannelKey;
use supervisor::protocol::ProtocolError;

/// One sandbox's supervisor, reached through the API server.
#[derive(Clone)]
pub struct PodChannel {
    /// The namespace's pods.
    pub pods: Api<Pod>,
    /// The pod.
    pub name: String,
    /// The supervisor's port inside the pod.
    pub port: u16,
    /// The sandbox's channel key.
    pub key: ChannelKey,
}

impl std::fmt::Debug for PodChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodChannel")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Connect for PodChannel {
    type Stream = DuplexStream;

    async fn open(&self) -> Result<DuplexStream, ClientError> {
        let mut forwarder = match self.pods.portforward(&self.name, &[self.port]).await {
            Ok(f) => f,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(ClientError::Gone(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("pod {} not found", self.name),
                )));
            }
            Err(e) => return Err(ProtocolError::Io(format!("port-forward to pod {}: {e}", self.name)).into()),
        };
        forwarder
            .take_stream(self.port)
            .ok_or_else(|| ProtocolError::Io("the port-forward gave no stream".to_owned()).into())
    }

    /// The channel key, sent with the hello (the client writes both at once).
    fn preamble(&self) -> &[u8] {
        self.key.preamble()
    }
}

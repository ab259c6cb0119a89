//! The framed tunnel's bridge (Kubernetes' path): a client that half-closes and then goes
//! away must still end the pipe when the supervisor says `gone`.

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

//! The connection layer under the router: how many connections are open at once, how long a
//! connection may take to send a request head (or sit idle between requests), noticing that a
//! client went away while its blocking request runs, and shutting down within a bounded time.
//!
//! Hand-written over hyper's HTTP/1 connection rather than `axum::serve`, which has no
//! header-read timeout, no connection cap and no grace period, and never notices a client that
//! disconnects while a blocking response is being computed (hyper does not read the socket then).
use crate::ApiError;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Limits of the connection layer.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Most connections open at once; one more is answered with a 503 and closed.
    pub max_connections: usize,
    /// A connection must send a complete request head within this time, whether it is new or
    /// idle after a response; otherwise it is closed.
    pub header_timeout: Duration,
    /// After SIGINT/SIGTERM, how long running requests get to finish before the rest are ended.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: 512,
            header_timeout: Duration::from_secs(15),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Resolves once the client of a request has closed its connection. Requests served without a
/// connection (tests calling the router directly) carry none.
#[derive(Debug, Clone)]
pub struct ClientGone(watch::Receiver<bool>);

impl ClientGone {
    /// Waits until the client is gone (forever if it stays).
    pub async fn wait(mut self) {
        if self.0.wait_for(|gone| *gone).await.is_err() {
            // The watcher ended without seeing the client go: the connection is over anyway.
            std::future::pending::<()>().await
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets running requests finish for
/// up to `opts.shutdown_grace` and returns.
pub async fn serve(
    app: Router,
    listener: TcpListener,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                // Out of file descriptors and the like: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, opts.max_connections));
            continue;
        };
        let Ok((stream, peer)) = split_watch(stream) else {
            continue;
        };
        let (gone_tx, gone_rx) = watch::channel(false);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req| {
            req.extensions_mut().insert(ClientGone(gone_rx.clone()));
            let mut app = app.clone();
            async move { tower::Service::call(&mut app, req).await }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = &mut conn => {}
                _ = watch_peer(peer) => {
                    let _ = gone_tx.send(true);
                    let _ = conn.await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(opts.shutdown_grace) => {
            eprintln!("shutdown: grace period of {:?} over; ending the remaining requests", opts.shutdown_grace);
        }
    }
    Ok(())
}

/// The connection, and a second handle on its socket to watch for the client closing it.
fn split_watch(stream: TcpStream) -> std::io::Result<(TcpStream, TcpStream)> {
    let std = stream.into_std()?;
    let peer = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, TcpStream::from_std(peer)?))
}

/// Returns when the client has closed the connection (end of stream or an error). Data waiting
/// to be read is the next request (or the body of this one): hyper reads it in its own time, so
/// this only looks again a little later.
async fn watch_peer(peer: TcpStream) {
    let mut byte = [0u8; 1];
    loop {
        match peer.peek(&mut byte).await {
            Ok(0) | Err(_) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Answers a connection over the cap with a 503 in OpenAI's shape and closes it.
async fn refuse(mut stream: TcpStream, cap: usize) {
    let e = ApiError::too_many_connections(cap);
    let body = serde_json::to_string(&e.body()).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        e.status.as_u16(),
        e.status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

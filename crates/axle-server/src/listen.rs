//! The connection layer under the router: how many connections are open at once, how long a
//! connection may take to send a request head (or sit idle between requests) and its body
//! (`body_deadline.rs`), and shutting down within a bounded time. A client that closes its
//! connection while its blocking request runs is noticed by hyper's HTTP/1 connection itself (it
//! reads for end of stream mid-message), which drops the handler and so cancels the request.
//!
//! Hand-written over hyper's HTTP/1 connection rather than `axum::serve`, which has no
//! header-read timeout, no connection cap and no grace period.
use crate::body_deadline::{Pressure, TimedBody};
use crate::ApiError;
use axum::response::IntoResponse;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use smart_default::SmartDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Limits of the connection layer.
#[derive(Debug, Clone, SmartDefault)]
pub struct ServeOptions {
    /// Most connections open at once; one more is answered with a 503 and closed.
    #[default(512)]
    pub max_connections: usize,
    /// A connection must send a complete request head within this time, whether it is new or
    /// idle after a response; otherwise it is closed.
    #[default(Duration::from_secs(15))]
    pub header_timeout: Duration,
    /// A request's body must arrive within this time of its head; otherwise the request is
    /// answered 408 and the connection closed. While every connection slot is taken, bodies
    /// arriving slower than 16 KiB/s for over a second are cut at once.
    #[default(Duration::from_secs(30))]
    pub body_timeout: Duration,
    /// After SIGINT/SIGTERM, how long running requests get to finish before the rest are ended.
    #[default(Duration::from_secs(10))]
    pub shutdown_grace: Duration,
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
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let cap = opts.max_connections;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let pressure = Pressure::default();
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
        let conn = Connection {
            app: app.clone(),
            http: http.clone(),
            body_timeout: opts.body_timeout,
            pressure: pressure.clone(),
            watcher: graceful.watcher(),
        };
        if let Ok(permit) = slots.clone().try_acquire_owned() {
            tokio::spawn(async move {
                conn.serve(stream).await;
                drop(permit);
            });
            continue;
        }
        // No free slot: slow bodies are told to give theirs up, and the newcomer waits a moment
        // for one, while few newcomers wait; past that, or if none frees, it gets a 503 (past
        // that too, it is closed at once, so that a flood cannot hold descriptors through the
        // refusals themselves).
        let Ok(waiting) = refusals.clone().try_acquire_owned() else {
            continue;
        };
        pressure.notify_waiters();
        let slots = slots.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(SLOT_WAIT, slots.acquire_owned()).await {
                Ok(Ok(permit)) => {
                    drop(waiting);
                    conn.serve(stream).await;
                    drop(permit);
                }
                _ => {
                    refuse(stream, cap).await;
                    drop(waiting);
                }
            }
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

/// What serving one connection needs.
struct Connection {
    app: Router,
    http: hyper::server::conn::http1::Builder,
    body_timeout: Duration,
    pressure: Pressure,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Connection {
    /// Serves requests on `stream` until it closes. A request whose body is cut for being slow
    /// is answered 408, and the connection closed.
    async fn serve(self, stream: TcpStream) {
        let Connection {
            app,
            http,
            body_timeout,
            pressure,
            watcher,
        } = self;
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut app = app.clone();
                let cut = Arc::new(AtomicBool::new(false));
                let (head, body) = req.into_parts();
                let body = TimedBody::new(body, body_timeout, pressure.clone(), cut.clone());
                let timed = axum::http::Request::from_parts(head, axum::body::Body::new(body));
                async move {
                    let r = tower::Service::call(&mut app, timed).await;
                    if cut.load(Ordering::Acquire) {
                        let mut late = ApiError::body_timeout(body_timeout).into_response();
                        late.headers_mut().insert(
                            axum::http::header::CONNECTION,
                            axum::http::HeaderValue::from_static("close"),
                        );
                        return Ok(late);
                    }
                    r
                }
            });
        let _ = watcher
            .watch(http.serve_connection(TokioIo::new(stream), service))
            .await;
    }
}

/// Connections over the cap waiting for a slot or answered 503 at once; more are closed
/// without an answer.
const MAX_REFUSALS: usize = 64;

/// How long a connection over the cap waits for a slot that slow bodies give up.
const SLOT_WAIT: Duration = Duration::from_millis(250);

/// Answers a connection over the cap with a 503 in OpenAI's shape and closes it: the answer, the
/// end of our side, then what the client sent is read and dropped for up to a second, so that
/// closing does not reset the connection under the client before it has read the answer.
async fn refuse(mut stream: TcpStream, cap: usize) {
    let e = ApiError::too_many_connections(cap);
    let body = serde_json::to_string(&e.body()).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        e.status.as_u16(),
        e.status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

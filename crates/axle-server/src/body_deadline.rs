//! The request body under a deadline: a body must arrive within the body timeout, and while the
//! server is at its connection cap, a body that has been arriving for over [`PRESSURE_GRACE`]
//! slower than [`MIN_BODY_RATE`] is cut at once, so that clients which send a head and then
//! little or nothing cannot hold the connection slots that others need.
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// Under pressure, how long a body may arrive slowly before it is cut.
pub(crate) const PRESSURE_GRACE: Duration = Duration::from_secs(1);

/// Under pressure, the slowest average rate a body may keep (bytes per second).
pub(crate) const MIN_BODY_RATE: f64 = 16.0 * 1024.0;

/// Why a body stopped: its time ran out.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(crate) struct BodyTooSlow;

/// Shared by the accept loop and every body: the accept loop fires it when no slot is free.
pub(crate) type Pressure = Arc<Notify>;

/// `inner` with a deadline; `cut` is set when the body is stopped for being slow, so that the
/// connection layer answers 408 whatever the handler made of the error.
pub(crate) struct TimedBody<B> {
    inner: B,
    started: Instant,
    deadline: Pin<Box<Sleep>>,
    pressure: Pressure,
    notified: Pin<Box<OwnedNotified>>,
    received: u64,
    cut: Arc<AtomicBool>,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(
        inner: B,
        timeout: Duration,
        pressure: Pressure,
        cut: Arc<AtomicBool>,
    ) -> TimedBody<B> {
        let started = Instant::now();
        let notified = Box::pin(pressure.clone().notified_owned());
        TimedBody {
            inner,
            started,
            deadline: Box::pin(tokio::time::sleep_until(started + timeout)),
            pressure,
            notified,
            received: 0,
            cut,
        }
    }

    /// Slow enough to cut when slots are scarce.
    fn slow(&self) -> bool {
        let elapsed = self.started.elapsed();
        elapsed > PRESSURE_GRACE && (self.received as f64) < MIN_BODY_RATE * elapsed.as_secs_f64()
    }

    /// Marks the body cut and gives the error its reader sees.
    fn stop<E>(&mut self) -> BodyError<E> {
        self.cut.store(true, Ordering::Release);
        BodyError::TooSlow(BodyTooSlow)
    }
}

/// The inner body's error, or the deadline's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError<E> {
    #[error(transparent)]
    Inner(E),
    #[error(transparent)]
    TooSlow(BodyTooSlow),
}

impl<B> Body for TimedBody<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = BodyError<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Ok(f)) = &frame {
                if let Some(d) = f.data_ref() {
                    this.received += hyper::body::Buf::remaining(d) as u64;
                }
            }
            return Poll::Ready(frame.map(|r| r.map_err(BodyError::Inner)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(this.stop())));
        }
        // Each time the accept loop finds no free slot, slow bodies give theirs up.
        while this.notified.as_mut().poll(cx).is_ready() {
            if this.slow() {
                return Poll::Ready(Some(Err(this.stop())));
            }
            this.notified = Box::pin(this.pressure.clone().notified_owned());
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use tokio_stream::wrappers::ReceiverStream;

    type Chunks = StreamBody<ReceiverStream<Result<Frame<Bytes>, std::io::Error>>>;

    fn channel() -> (
        tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
        Chunks,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        (tx, StreamBody::new(ReceiverStream::new(rx)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_comes_is_cut_at_the_deadline() {
        let (_tx, inner) = channel();
        let cut = Arc::new(AtomicBool::new(false));
        let body = TimedBody::new(
            inner,
            Duration::from_secs(5),
            Pressure::default(),
            cut.clone(),
        );
        let r = body.collect().await;
        assert!(matches!(r, Err(BodyError::TooSlow(_))));
        assert!(cut.load(Ordering::Acquire));
    }

    #[tokio::test(start_paused = true)]
    async fn pressure_cuts_slow_bodies_and_spares_fresh_ones() {
        let pressure = Pressure::default();
        let (slow_tx, slow) = channel();
        let (_fresh_tx, fresh) = channel();
        let (slow_cut, fresh_cut) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let long = Duration::from_secs(300);
        slow_tx
            .send(Ok(Frame::data(Bytes::from_static(b"{\"a\""))))
            .await
            .expect("send");
        let slow =
            tokio::spawn(TimedBody::new(slow, long, pressure.clone(), slow_cut.clone()).collect());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let fresh = tokio::spawn(
            TimedBody::new(fresh, long, pressure.clone(), fresh_cut.clone()).collect(),
        );
        tokio::task::yield_now().await;
        pressure.notify_waiters();
        let r = slow.await.expect("task");
        assert!(matches!(r, Err(BodyError::TooSlow(_))));
        assert!(slow_cut.load(Ordering::Acquire));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!fresh.is_finished() && !fresh_cut.load(Ordering::Acquire));
        fresh.abort();
    }
}

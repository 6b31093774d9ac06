//! HTTP/2 settings of every gRPC connection: between roles, and the gateway's
//! client API.
//!
//! - Flow-control windows. h2's defaults (64 KiB per stream and per
//!   connection) make a receiver send a `WINDOW_UPDATE` frame — one more socket
//!   write, and a wake-up of the sender's connection task — each time it has
//!   read half a window: about one per two search answers of ten 2 KB payloads.
//!   With these windows the connection's update goes out every few hundred
//!   answers, and one stream (a batch answer, a manifest) never waits for one.
//!   Windows are credit, not buffers: memory is only taken by data a receiver
//!   has not read yet.
//! - Frame size. h2 writes each `DATA` frame with its own `writev`, and the
//!   default largest frame is 16 KiB: a search answer of ten 2 KB payloads
//!   took two writes (and the receiver two reads). 256 KiB frames carry a whole
//!   answer in one, and still interleave the streams of a connection finely.
//! - A request's end. A unary request's body is one message; tonic's body only
//!   knows it has ended when polled once more, so hyper sent the end of the
//!   stream as a separate empty `DATA` frame — a second write per call, and a
//!   second wake-up of the server's connection task. [`EndAwareBody`] looks
//!   one frame ahead, so the message's frame carries the end.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;
use tonic::transport::{Endpoint, Server};

/// One stream's window.
pub const STREAM_WINDOW_BYTES: u32 = 2 << 20;

/// A connection's window (all its streams).
pub const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// The largest frame this side accepts.
pub const MAX_FRAME_BYTES: u32 = 256 << 10;

/// Returns a gRPC server builder with these settings.
pub fn grpc_server() -> Server {
    Server::builder()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

/// Gives a client endpoint these settings.
pub fn tune_endpoint(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

/// A request body that tells it has ended as soon as its last frame is out:
/// after each data frame it polls the inner body once more, and keeps what
/// that gives (a frame, an error) for the next poll.
pub struct EndAwareBody {
    inner: Body,
    next: Option<Result<Frame<Bytes>, Status>>,
    ended: bool,
}

impl EndAwareBody {
    /// Wraps `inner`.
    pub fn new(inner: Body) -> Self {
        EndAwareBody {
            inner,
            next: None,
            ended: false,
        }
    }
}

impl HttpBody for EndAwareBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let frame = match this.next.take() {
            Some(frame) => frame,
            None if this.ended => return Poll::Ready(None),
            None => match ready!(Pin::new(&mut this.inner).poll_frame(context)) {
                Some(frame) => frame,
                None => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            },
        };
        if !this.ended && matches!(&frame, Ok(frame) if frame.is_data()) {
            // The look ahead: a body with nothing more to give ends here.
            match Pin::new(&mut this.inner).poll_frame(context) {
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(next)) => this.next = Some(next),
                Poll::Pending => {}
            }
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.next.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.next, self.ended) {
            (None, true) => SizeHint::with_exact(0),
            (None, false) => self.inner.size_hint(),
            // A kept frame has a size the inner body no longer counts.
            (Some(_), _) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    fn body(frames: Vec<Result<Frame<Bytes>, Status>>) -> EndAwareBody {
        EndAwareBody::new(Body::new(StreamBody::new(tokio_stream::iter(frames))))
    }

    fn data(text: &'static str) -> Result<Frame<Bytes>, Status> {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    /// Polls one frame (the bodies here never wait).
    fn next(body: &mut EndAwareBody) -> Option<Result<Frame<Bytes>, Status>> {
        let mut context = Context::from_waker(std::task::Waker::noop());
        match Pin::new(body).poll_frame(&mut context) {
            Poll::Ready(frame) => frame,
            Poll::Pending => panic!("a body of ready frames waited"),
        }
    }

    #[test]
    fn a_one_message_body_has_ended_once_its_frame_is_out() {
        let mut one = body(vec![data("message")]);
        assert!(!one.is_end_stream(), "nothing read yet");
        let frame = next(&mut one).unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "message");
        assert!(one.is_end_stream(), "the end is known with the last frame");
        assert!(next(&mut one).is_none());
    }

    #[test]
    fn frames_and_errors_looked_ahead_come_next_in_order() {
        let mut two = body(vec![data("a"), data("b")]);
        assert_eq!(next(&mut two).unwrap().unwrap().into_data().unwrap(), "a");
        assert!(!two.is_end_stream(), "the second frame is kept, not lost");
        assert_eq!(next(&mut two).unwrap().unwrap().into_data().unwrap(), "b");
        assert!(two.is_end_stream());
        assert!(next(&mut two).is_none());

        let mut failing = body(vec![data("a"), Err(Status::internal("broken"))]);
        assert!(next(&mut failing).unwrap().is_ok());
        assert!(!failing.is_end_stream());
        assert_eq!(next(&mut failing).unwrap().unwrap_err().message(), "broken");
    }

    #[tokio::test]
    async fn the_whole_body_reads_the_same() {
        let frames = vec![data("one "), data("two "), data("three")];
        let collected = body(frames).collect().await.unwrap().to_bytes();
        assert_eq!(collected, "one two three");
    }
}

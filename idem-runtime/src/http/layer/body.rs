//! Bodies held in memory: the request the layer read (to fingerprint it)
//! and hands on, and the response it kept (to replay it).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

/// An error of a body, boxed: what `http-body-util`'s combinators return.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body whose bytes are all in memory, with its trailers if it had any:
/// a buffered request handed to the inner service, a kept response given
/// back, or a refusal.
///
/// It yields its bytes as one data frame, then its trailers, then ends. Its
/// size hint is exact only when it has no trailers: a server then sends
/// `Content-Length`; with trailers it must stream (chunked on HTTP/1.1),
/// as a `Content-Length` body has nowhere to put them.
#[derive(Debug, Default)]
pub struct BufferedBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl BufferedBody {
    /// A body of these bytes, followed by these trailers.
    pub fn new(data: impl Into<Bytes>, trailers: Option<HeaderMap>) -> BufferedBody {
        let data: Bytes = data.into();
        BufferedBody {
            data: (!data.is_empty()).then_some(data),
            trailers: trailers.filter(|trailers| !trailers.is_empty()),
        }
    }

    /// An empty body without trailers.
    pub fn empty() -> BufferedBody {
        BufferedBody::default()
    }

    /// The names of the trailers still to come, each once.
    pub(super) fn trailer_names(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.trailers.iter().flat_map(HeaderMap::keys)
    }
}

impl Body for BufferedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // Unpin (its fields are), so no projection is needed.
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(
            this.trailers
                .take()
                .map(|trailers| Ok(Frame::trailers(trailers))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let length = self.data.as_ref().map_or(0, Bytes::len);
        let length = u64::try_from(length).unwrap_or(u64::MAX);
        if self.trailers.is_some() {
            // No upper bound: hyper picks chunked encoding for HTTP/1.1,
            // the only framing that carries trailers.
            let mut hint = SizeHint::new();
            hint.set_lower(length);
            hint
        } else {
            SizeHint::with_exact(length)
        }
    }
}

/// Why a request body was not read whole.
pub(super) enum ReadError {
    /// It is longer than the limit: said by its length, or found reading.
    TooLarge,
    /// The connection failed or the body was malformed mid-way.
    Unreadable(BoxError),
}

/// A whole body: its bytes and its trailers, if any.
pub(super) struct Whole {
    pub(super) data: Bytes,
    pub(super) trailers: Option<HeaderMap>,
}

/// Reads `body` whole, refusing it once it passes `limit` bytes: a body
/// whose length is announced as larger is refused before a byte is read.
pub(super) async fn read_limited<B>(body: B, limit: usize) -> Result<Whole, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if body.size_hint().lower() > limit_u64 {
        return Err(ReadError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(whole(collected)),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ReadError::TooLarge),
        Err(error) => Err(ReadError::Unreadable(error)),
    }
}

/// Reads a response body whole (it has already been produced, so there is
/// no limit to enforce: the service chose to send it).
pub(super) async fn read_whole<B>(body: B) -> Result<Whole, B::Error>
where
    B: Body<Data = Bytes>,
{
    body.collect().await.map(whole)
}

fn whole(collected: http_body_util::Collected<Bytes>) -> Whole {
    let trailers = collected.trailers().cloned();
    Whole {
        data: collected.to_bytes(),
        trailers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http_body_util::Full;

    #[tokio::test]
    async fn a_buffered_body_yields_its_bytes_then_its_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = BufferedBody::new(Bytes::from_static(b"abc"), Some(trailers.clone()));
        // With trailers the length is not announced: HTTP/1.1 must chunk.
        assert_eq!(body.size_hint().exact(), None);
        assert_eq!(body.size_hint().lower(), 3);
        let plain = BufferedBody::new(Bytes::from_static(b"abc"), None);
        assert_eq!(plain.size_hint().exact(), Some(3));
        let read = read_whole(body).await.unwrap();
        assert_eq!(read.data, "abc");
        assert_eq!(read.trailers, Some(trailers));
        assert!(BufferedBody::empty().is_end_stream());
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_too_large_whether_announced_or_found() {
        let announced = Full::new(Bytes::from(vec![b'x'; 11]));
        assert!(matches!(
            read_limited(announced, 10).await,
            Err(ReadError::TooLarge)
        ));
        let streamed = http_body_util::StreamBody::new(futures_util::stream::iter(
            (0..11).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x")))),
        ));
        assert!(matches!(
            read_limited(streamed, 10).await,
            Err(ReadError::TooLarge)
        ));
        let fits = read_limited(Full::new(Bytes::from_static(b"0123456789")), 10).await;
        assert!(matches!(fits, Ok(whole) if whole.data.len() == 10));
    }
}

//! One relay stream: the tonic call, the bounded queue of received frames and its
//! eventfd, and the unbounded queue of frames to write.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{runtime, Connection, TransportError, MAX_RECEIVE, MAX_SEND, METHOD};

#[derive(Clone, Copy, Default)]
pub(super) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Where a stream is: `Open` once the relay accepted it (its response headers arrived),
/// `Ended` with the gRPC status it ended with (code 0 for a clean end or a local close).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Connecting,
    Open,
    Ended { code: i32, message: String },
}

/// What a drain returns: the stream's state, whether the relay ever accepted it, and the
/// frames received since the last drain.
#[derive(Debug)]
pub struct Drained {
    pub state: State,
    pub opened: bool,
    pub frames: Vec<Bytes>,
}

/// Bytes of received frames a stream holds for its reader before it stops reading the
/// relay. Past it, HTTP/2 flow control (the connection's windows) makes the relay stop
/// sending, and the relay's per-stream bound tells the client it lagged: an agent whose
/// loop stops draining holds at most this plus one frame, however much is published.
pub const RECEIVE_HIGH_WATER: usize = 1024 * 1024;

struct Inbox {
    state: State,
    opened: bool,
    frames: VecDeque<Bytes>,
    queued: usize, // bytes in `frames`
    signalled: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: OwnedFd,
    drained: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Inbox)) {
        let mut inbox = self.lock();
        if matches!(inbox.state, State::Ended { .. }) {
            return; // the first end is the one reported
        }
        change(&mut inbox);
        if !inbox.signalled {
            inbox.signalled = true;
            let one = 1u64.to_ne_bytes();
            // An eventfd counter cannot overflow at one write per drain.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    fn end(&self, code: Code, message: &str) {
        let message = message.to_owned();
        self.update(|inbox| {
            inbox.state = State::Ended {
                code: code as i32,
                message,
            }
        });
    }
}

/// One stream to the relay. Dropping it cancels the stream.
pub struct RelayStream {
    shared: Arc<Shared>,
    outgoing: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    task: JoinHandle<()>,
}

impl RelayStream {
    /// Opens a stream on `connection` with `metadata` (header name, value) pairs. Returns
    /// at once; the stream's state says when the relay accepted or refused it.
    pub fn open(connection: &Connection, metadata: &[(String, String)]) -> Result<Self, TransportError> {
        let mut headers = tonic::metadata::MetadataMap::new();
        for (name, value) in metadata {
            // Visible ASCII only: http would pass other bytes through as opaque octets.
            if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(TransportError::Metadata(name.clone()));
            }
            let key =
                AsciiMetadataKey::from_bytes(name.as_bytes()).map_err(|_| TransportError::Metadata(name.clone()))?;
            let value =
                AsciiMetadataValue::try_from(value.as_str()).map_err(|_| TransportError::Metadata(name.clone()))?;
            headers.insert(key, value);
        }
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                state: State::Connecting,
                opened: false,
                frames: VecDeque::new(),
                queued: 0,
                signalled: false,
            }),
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            drained: Notify::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let task = runtime().spawn(run(connection.channel.clone(), headers, rx, shared.clone()));
        Ok(Self {
            shared,
            outgoing: Mutex::new(Some(tx)),
            task,
        })
    }

    /// Readable whenever there is something to drain.
    pub fn wake_fd(&self) -> RawFd {
        self.shared.wake.as_raw_fd()
    }

    /// The state, and every frame received since the last drain; re-arms the wake fd.
    pub fn drain(&self) -> Drained {
        let mut inbox = self.shared.lock();
        let mut counter = [0u8; 8];
        let _ = unsafe { libc::read(self.shared.wake.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len()) };
        inbox.signalled = false;
        let drained = Drained {
            state: inbox.state.clone(),
            opened: inbox.opened,
            frames: inbox.frames.drain(..).collect(),
        };
        inbox.queued = 0;
        drop(inbox);
        // One waiter at most (the reading task); with none, the permit is kept for it.
        self.shared.drained.notify_one();
        drained
    }

    /// Queues `frame` for the relay; false once the stream has ended or been closed.
    pub fn write(&self, frame: Bytes) -> bool {
        let outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        match outgoing.as_ref() {
            Some(tx) if !matches!(self.shared.lock().state, State::Ended { .. }) => tx.send(frame).is_ok(),
            _ => false,
        }
    }

    /// Cancels the stream (the relay sees RST_STREAM); its state becomes Ended with
    /// code 0 unless it had ended already.
    pub fn close(&self) {
        self.outgoing.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.task.abort();
        self.shared.end(Code::Ok, "closed");
    }
}

impl Drop for RelayStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Outgoing = Pin<Box<dyn tokio_stream::Stream<Item = Bytes> + Send>>;

async fn run(
    channel: Channel,
    headers: tonic::metadata::MetadataMap,
    outgoing: mpsc::UnboundedReceiver<Bytes>,
    shared: Arc<Shared>,
) {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(MAX_RECEIVE)
        .max_encoding_message_size(MAX_SEND);
    if let Err(error) = grpc.ready().await {
        return shared.end(Code::Unavailable, &format!("relay unreachable: {error}"));
    }
    let stream: Outgoing = Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing));
    let mut request = tonic::Request::new(stream);
    *request.metadata_mut() = headers;
    let path = PathAndQuery::from_static(METHOD);
    let mut incoming = match grpc.streaming(request, path, RawCodec).await {
        Ok(response) => response.into_inner(),
        Err(status) => return shared.end(status.code(), &describe(&status)),
    };
    shared.update(|inbox| {
        inbox.state = State::Open;
        inbox.opened = true;
    });
    loop {
        while shared.lock().queued >= RECEIVE_HIGH_WATER {
            shared.drained.notified().await;
        }
        match incoming.message().await {
            Ok(Some(frame)) => shared.update(|inbox| {
                inbox.queued += frame.len();
                inbox.frames.push_back(frame);
            }),
            Ok(None) => return shared.end(Code::Ok, ""),
            Err(status) => return shared.end(status.code(), &describe(&status)),
        }
    }
}

/// A status's message, with the transport error under it when there is one (a refused
/// connection says so, not just "transport error").
pub(super) fn describe(status: &Status) -> String {
    use std::error::Error;
    let mut text = status.message().to_owned();
    let mut source = status.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = if text.is_empty() {
                cause_text
            } else {
                format!("{text}: {cause_text}")
            };
        }
        source = cause.source();
    }
    text
}

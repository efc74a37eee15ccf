//! One client stream on the relay's server (server.rs): what the relay's Python side
//! holds of it (`ServerStream`), the state both sides share, its two bounded queues, and
//! the wake fd every stream reports on.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tonic::{Code, Status, Streaming};

/// Bytes of received frames a stream holds for the relay before it stops reading them.
pub const RECEIVE_HIGH_WATER: usize = 1024 * 1024;
/// What a received frame counts toward `RECEIVE_HIGH_WATER` beyond its bytes: what it
/// costs to hold (its `Bytes`, then a Python object), so that a flood of empty frames is
/// bounded like a flood of large ones.
pub(super) const FRAME_OVERHEAD: usize = 128;
/// Bytes written to a stream and not yet taken by the connection past which writes are
/// refused until it drains to half of this. A client that stops reading so costs the
/// relay this, one frame, and h2's send buffer, per stream.
pub const SEND_HIGH_WATER: usize = 512 * 1024;

/// What happened on one stream since the relay last polled it.
#[derive(Debug, Default)]
pub struct StreamEvent {
    pub id: u64,
    pub frames: Vec<Bytes>,
    /// The client has sent its last frame (half-close).
    pub client_done: bool,
    /// The stream is over: (gRPC code, message). Code 0 when it ended cleanly.
    pub ended: Option<(i32, String)>,
    /// A write was refused for lack of room, and there is room again.
    pub writable: bool,
}

struct Ready {
    accepted: Vec<ServerStream>,
    active: Vec<Arc<StreamShared>>,
    signalled: bool,
}

/// The one wake fd and the lists it announces.
pub(super) struct Wakeup {
    ready: Mutex<Ready>,
    fd: OwnedFd,
}

impl Wakeup {
    pub(super) fn new() -> io::Result<Self> {
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ready: Mutex::new(Ready {
                accepted: Vec::new(),
                active: Vec::new(),
                signalled: false,
            }),
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Readable whenever there is something to take.
    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The streams that arrived and what happened on the others since the last call;
    /// re-arms the fd.
    pub(super) fn take_all(&self) -> (Vec<ServerStream>, Vec<StreamEvent>) {
        let mut ready = self.lock();
        let mut counter = [0u8; 8];
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len()) };
        ready.signalled = false;
        let accepted = std::mem::take(&mut ready.accepted);
        let active = std::mem::take(&mut ready.active);
        drop(ready);
        (accepted, active.iter().map(|stream| stream.take()).collect())
    }

    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, ready: &mut Ready) {
        if !ready.signalled {
            ready.signalled = true;
            let one = 1u64.to_ne_bytes();
            // An eventfd counter cannot overflow at one write per poll.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }
}

#[derive(Default)]
struct StreamState {
    frames: VecDeque<Bytes>,
    // Bytes received and not yet released by the relay: in `frames` or handed over.
    queued: usize,
    handed: usize,
    client_done: bool,
    ended: Option<(i32, String)>,
    reported_end: bool,
    unsent: usize,
    blocked: bool,
    writable: bool,
    listed: bool,
}

struct StreamShared {
    id: u64,
    wakeup: Arc<Wakeup>,
    state: Mutex<StreamState>,
    drained: Notify,
}

impl StreamShared {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` and, if it left something to report, lists the stream for the
    /// next poll.
    fn update(self: &Arc<Self>, change: impl FnOnce(&mut StreamState)) {
        let mut state = self.lock();
        if state.reported_end {
            return;
        }
        change(&mut state);
        if !state.listed {
            state.listed = true;
            drop(state);
            let mut ready = self.wakeup.lock();
            ready.active.push(self.clone());
            self.wakeup.signal(&mut ready);
        }
    }

    fn end(self: &Arc<Self>, code: Code, message: String) {
        self.update(|state| {
            if state.ended.is_none() {
                state.ended = Some((code as i32, message));
            }
        });
    }

    fn take(&self) -> StreamEvent {
        let mut state = self.lock();
        state.listed = false;
        let frames: Vec<Bytes> = state.frames.drain(..).collect();
        state.handed += frames.iter().map(|f| f.len() + FRAME_OVERHEAD).sum::<usize>();
        let event = StreamEvent {
            id: self.id,
            frames,
            client_done: state.client_done,
            ended: state.ended.clone(),
            writable: std::mem::take(&mut state.writable),
        };
        state.reported_end = state.ended.is_some();
        event
    }
}

type Decision = Result<(), Status>;

/// One client stream, as the relay's Python side holds it.
pub struct ServerStream {
    shared: Arc<StreamShared>,
    metadata: Vec<(String, String)>,
    decide: Mutex<Option<oneshot::Sender<Decision>>>,
    outgoing: Mutex<Option<mpsc::UnboundedSender<Result<Bytes, Status>>>>,
}

/// What [`ServerStream::write`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Queued,
    /// Over `SEND_HIGH_WATER`: try again after an event with `writable`.
    Full,
    Ended,
}

impl ServerStream {
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The request's ASCII metadata (header name, value), in the order received.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// Accepts the stream: its response headers go out. No-op once decided.
    pub fn accept(&self) {
        if let Some(decide) = self.decide.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = decide.send(Ok(()));
        }
    }

    /// The relay has processed every frame it was handed: reading the client goes on
    /// (it stops while `RECEIVE_HIGH_WATER` bytes are handed over and not released).
    pub fn release(&self) {
        let mut state = self.shared.lock();
        state.queued -= std::mem::take(&mut state.handed);
        drop(state);
        // One waiter at most (the reading task); with none, the permit is kept for it.
        self.shared.drained.notify_one();
    }

    /// Queues `frame`; never blocks.
    pub fn write(&self, frame: Bytes) -> Written {
        let outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = outgoing.as_ref() else {
            return Written::Ended;
        };
        let mut state = self.shared.lock();
        if state.ended.is_some() {
            return Written::Ended;
        }
        if state.unsent >= SEND_HIGH_WATER {
            state.blocked = true;
            return Written::Full;
        }
        state.unsent += frame.len();
        drop(state);
        if tx.send(Ok(frame)).is_err() {
            return Written::Ended;
        }
        Written::Queued
    }

    /// Ends the stream with gRPC status (`code`, `message`): a refusal if it was never
    /// accepted, otherwise after every frame written before. Later calls do nothing.
    pub fn finish(&self, code: i32, message: &str) {
        let status = Status::new(Code::from_i32(code), message);
        if let Some(decide) = self.decide.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = decide.send(Err(status));
        } else if let Some(tx) = self.outgoing.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if code != Code::Ok as i32 {
                let _ = tx.send(Err(status));
            }
        }
    }
}

/// The response body's frames: what the relay writes, until it finishes. Dropped when the
/// stream is over (hyper drops it on a client's cancel or a lost connection too), which
/// ends the stream for the relay and stops reading the client.
pub(super) struct Outgoing {
    rx: mpsc::UnboundedReceiver<Result<Bytes, Status>>,
    shared: Arc<StreamShared>,
    reader: JoinHandle<()>,
}

impl tokio_stream::Stream for Outgoing {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let mut state = self.shared.lock();
            state.unsent = state.unsent.saturating_sub(frame.len());
            if state.blocked && state.unsent <= SEND_HIGH_WATER / 2 {
                state.blocked = false;
                drop(state);
                self.shared.update(|state| state.writable = true);
            }
        }
        polled
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.end(Code::Cancelled, "stream closed".into());
    }
}

/// The relay protocol's one method, as tonic calls it: each call is a new stream, listed
/// for the relay's next poll and held until the relay accepts or refuses it.
#[derive(Clone)]
pub(super) struct Connect {
    pub(super) wakeup: Arc<Wakeup>,
    pub(super) ids: Arc<AtomicU64>,
}

impl tower::Service<tonic::Request<Streaming<Bytes>>> for Connect {
    type Response = tonic::Response<Outgoing>;
    type Error = Status;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let (wakeup, ids) = (self.wakeup.clone(), self.ids.clone());
        Box::pin(async move {
            let metadata = request
                .metadata()
                .iter()
                .filter_map(|entry| match entry {
                    tonic::metadata::KeyAndValueRef::Ascii(key, value) => {
                        Some((key.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                    }
                    tonic::metadata::KeyAndValueRef::Binary(..) => None,
                })
                .collect();
            let shared = Arc::new(StreamShared {
                id: ids.fetch_add(1, Ordering::Relaxed),
                wakeup: wakeup.clone(),
                state: Mutex::new(StreamState::default()),
                drained: Notify::new(),
            });
            let (decide, decided) = oneshot::channel();
            let (tx, rx) = mpsc::unbounded_channel();
            {
                // Listed before its reader starts: the relay learns of a stream before
                // any event of it.
                let mut ready = wakeup.lock();
                ready.accepted.push(ServerStream {
                    shared: shared.clone(),
                    metadata,
                    decide: Mutex::new(Some(decide)),
                    outgoing: Mutex::new(Some(tx)),
                });
                wakeup.signal(&mut ready);
            }
            let reader = tokio::spawn(read(request.into_inner(), shared.clone()));
            // From here, however this future ends (a client that cancels before the relay
            // decides drops it), the relay hears that the stream ended.
            let outgoing = Outgoing { rx, shared, reader };
            match decided.await {
                Ok(Ok(())) => Ok(tonic::Response::new(outgoing)),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(Status::unavailable("the relay is shutting down")),
            }
        })
    }
}

async fn read(mut incoming: Streaming<Bytes>, shared: Arc<StreamShared>) {
    loop {
        loop {
            let notified = shared.drained.notified();
            if shared.lock().queued < RECEIVE_HIGH_WATER {
                break;
            }
            notified.await;
        }
        match incoming.message().await {
            Ok(Some(frame)) => shared.update(|state| {
                state.queued += frame.len() + FRAME_OVERHEAD;
                state.frames.push_back(frame);
            }),
            Ok(None) => return shared.update(|state| state.client_done = true),
            // tonic's one OUT_OF_RANGE here is a frame over the size limit, which gRPC
            // (and the relay's clients) call RESOURCE_EXHAUSTED.
            Err(status) if status.code() == Code::OutOfRange => {
                return shared.end(Code::ResourceExhausted, status.message().to_owned())
            }
            Err(status) => return shared.end(status.code(), super::stream::describe(&status)),
        }
    }
}

//! PyO3 bindings of the relay protocol's frames (`frames.rs`): one encoder per request
//! kind and one decoder of the relay's frames, for `svc_sdk.relay_frames`, which wraps
//! them in typed Python classes (an agent then loads no protobuf runtime); and, for the
//! relay through `svc_sdk.protocol`, the frames of its hot path: a Publish decoded, a
//! Reply and a delivery encoded.

use bytes::Bytes;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::frames::{
    count_publish, decode_event, ClientFrame, Commit, CreateChannel, Delivery, Event, JoinRequest, Publish, Refresh,
    Reply, Request, ServerFrame, Subscribe, Unsubscribe,
};

/// A Python `bytes` as `Bytes`, without copying it (the object is kept alive instead).
fn shared(b: PyBackedBytes) -> Bytes {
    Bytes::from_owner(b)
}

/// Encodes `message` straight into the Python `bytes` object returned: one copy of each
/// payload it holds.
fn encode_into<'py>(py: Python<'py>, message: &impl Message) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, message.encoded_len(), |mut buf: &mut [u8]| {
        message
            .encode(&mut buf)
            .map_err(|e| PyValueError::new_err(format!("cannot encode the frame: {e}")))
    })
}

fn encoded<'py>(py: Python<'py>, request_id: u64, request: Request) -> PyResult<Bound<'py, PyBytes>> {
    let frame = ClientFrame {
        request_id,
        kind: Some(request),
    };
    encode_into(py, &frame)
}

#[pyfunction]
fn encode_create<'py>(
    py: Python<'py>,
    request_id: u64,
    channel: String,
    group_info: PyBackedBytes,
) -> PyResult<Bound<'py, PyBytes>> {
    let group_info = shared(group_info);
    encoded(py, request_id, Request::Create(CreateChannel { channel, group_info }))
}

#[pyfunction]
fn encode_subscribe<'py>(
    py: Python<'py>,
    request_id: u64,
    channel: String,
    after_seq: u64,
    subscription: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let subscribe = Subscribe {
        channel,
        after_seq,
        subscription,
    };
    encoded(py, request_id, Request::Subscribe(subscribe))
}

#[pyfunction]
fn encode_unsubscribe<'py>(py: Python<'py>, request_id: u64, channel: String) -> PyResult<Bound<'py, PyBytes>> {
    encoded(py, request_id, Request::Unsubscribe(Unsubscribe { channel }))
}

#[pyfunction]
fn encode_publish<'py>(
    py: Python<'py>,
    request_id: u64,
    channel: String,
    message: Vec<PyBackedBytes>,
    message_id: Vec<PyBackedBytes>,
) -> PyResult<Bound<'py, PyBytes>> {
    let publish = Publish {
        channel,
        message: message.into_iter().map(shared).collect(),
        message_id: message_id.into_iter().map(shared).collect(),
    };
    encoded(py, request_id, Request::Publish(publish))
}

#[pyfunction]
fn encode_commit<'py>(
    py: Python<'py>,
    request_id: u64,
    channel: String,
    epoch: u64,
    commit: PyBackedBytes,
    welcome: PyBackedBytes,
) -> PyResult<Bound<'py, PyBytes>> {
    let commit = Commit {
        channel,
        epoch,
        commit: shared(commit),
        welcome: shared(welcome),
    };
    encoded(py, request_id, Request::Commit(commit))
}

#[pyfunction]
fn encode_refresh<'py>(py: Python<'py>, request_id: u64, token: String) -> PyResult<Bound<'py, PyBytes>> {
    encoded(py, request_id, Request::Refresh(Refresh { token }))
}

#[pyfunction]
fn encode_join<'py>(
    py: Python<'py>,
    request_id: u64,
    channel: String,
    join_id: String,
) -> PyResult<Bound<'py, PyBytes>> {
    encoded(py, request_id, Request::Join(JoinRequest { channel, join_id }))
}

/// One `Delivery`, every field but `subscription`, as the relay encodes a stored message
/// once for all its subscribers: the message is copied once, into the returned `bytes`.
#[pyfunction]
fn encode_delivery<'py>(
    py: Python<'py>,
    channel: String,
    seq: u64,
    message: PyBackedBytes,
    sender: PyBackedBytes,
    handshake: bool,
    epoch: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let delivery = Delivery {
        channel,
        seq,
        message: shared(message),
        sender: shared(sender),
        handshake,
        epoch,
        subscription: 0,
    };
    encode_into(py, &delivery)
}

/// A `ServerFrame` holding one Reply: what the relay answers each request with.
#[pyfunction]
#[pyo3(signature = (request_id, code, message, seq=0, epoch=0, head_seq=0, cipher_suite=0))]
#[allow(clippy::too_many_arguments)]
fn encode_reply<'py>(
    py: Python<'py>,
    request_id: u64,
    code: i32,
    message: String,
    seq: u64,
    epoch: u64,
    head_seq: u64,
    cipher_suite: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let frame = ServerFrame {
        kind: Some(Event::Reply(Reply {
            request_id,
            code,
            message,
            seq,
            epoch,
            head_seq,
            cipher_suite,
        })),
    };
    encode_into(py, &frame)
}

/// The most messages (and ids) of a Publish `publish_of` decodes: the relay's own limit
/// (`MAX_PUBLISH_BATCH`). A frame of more is only counted (`count_publish`), so that tiny
/// messages in a large frame are never decoded, nor become a Python object each, nor are
/// parsed a second time to be refused.
pub const MAX_DECODED_PUBLISH: usize = 1024;

/// A client's frame as the relay's Python takes it: a Publish as `(request_id, channel,
/// messages, message_ids)`, each message copied once out of `frame` into its own `bytes`,
/// or, for a Publish of more than `MAX_DECODED_PUBLISH` messages or ids, as
/// `(request_id, channel, number of messages, number of ids)`, which the relay refuses;
/// None for any other frame, or bytes that are not a ClientFrame, which the relay parses
/// with its generated module (and refuses as that module does).
pub(crate) fn publish_of<'py>(py: Python<'py>, frame: &Bytes) -> PyResult<Option<Bound<'py, PyTuple>>> {
    // A frame this large may hold more messages than the limit (each takes two bytes at
    // least): counted first, so that one of a million tiny messages is never decoded.
    if frame.len() > 2 * MAX_DECODED_PUBLISH {
        if let Some(c) = count_publish(frame) {
            if c.messages > MAX_DECODED_PUBLISH || c.ids > MAX_DECODED_PUBLISH {
                return Ok(Some((c.request_id, c.channel, c.messages, c.ids).into_pyobject(py)?));
            }
        }
    }
    let Ok(ClientFrame {
        request_id,
        kind: Some(Request::Publish(publish)),
    }) = ClientFrame::decode(frame.clone())
    else {
        return Ok(None);
    };
    let (messages, ids) = (publish.message.len(), publish.message_id.len());
    if messages > MAX_DECODED_PUBLISH || ids > MAX_DECODED_PUBLISH {
        return Ok(Some((request_id, publish.channel, messages, ids).into_pyobject(py)?));
    }
    let messages = PyList::new(py, publish.message.iter().map(|m| PyBytes::new(py, m)))?;
    let ids = PyList::new(py, publish.message_id.iter().map(|m| PyBytes::new(py, m)))?;
    Ok(Some((request_id, publish.channel, messages, ids).into_pyobject(py)?))
}

/// `publish_of` for one frame, as the relay's `poll` applies it to each it hands over.
#[pyfunction]
fn decode_publish<'py>(py: Python<'py>, frame: PyBackedBytes) -> PyResult<Option<Bound<'py, PyTuple>>> {
    publish_of(py, &shared(frame))
}

/// A ServerFrame as `(kind, fields)`: kind 1 a Reply `(request_id, code, message, seq,
/// epoch, head_seq, cipher_suite)`, 2 deliveries (a list of `(channel, seq, message,
/// sender, handshake, epoch, subscription)`), 3 a Welcome `(channel, welcome, seq,
/// epoch)`, 4 Lagged `(channel,)`; 0 and `()` for a frame of a kind this client does not
/// know. ValueError for bytes that are not a ServerFrame.
#[pyfunction]
fn decode_server_frame<'py>(py: Python<'py>, frame: PyBackedBytes) -> PyResult<(u8, Bound<'py, PyAny>)> {
    event_of(py, shared(frame))
}

/// `decode_server_frame` of a frame held as `Bytes`: the transport's frames are read
/// where they were received, each message copied out once, into its own `bytes`.
pub(crate) fn event_of(py: Python<'_>, frame: Bytes) -> PyResult<(u8, Bound<'_, PyAny>)> {
    let event = decode_event(frame).map_err(|e| PyValueError::new_err(format!("malformed ServerFrame: {e}")))?;
    Ok(match event {
        Some(Event::Reply(r)) => {
            let fields = (
                r.request_id,
                r.code,
                r.message,
                r.seq,
                r.epoch,
                r.head_seq,
                r.cipher_suite,
            );
            (1, fields.into_pyobject(py)?.into_any())
        }
        Some(Event::Deliveries(d)) => {
            let items = d.items.into_iter().map(|i| {
                (
                    i.channel,
                    i.seq,
                    PyBytes::new(py, &i.message),
                    PyBytes::new(py, &i.sender),
                    i.handshake,
                    i.epoch,
                    i.subscription,
                )
            });
            (2, PyList::new(py, items)?.into_any())
        }
        Some(Event::Welcome(w)) => {
            let fields = (w.channel, PyBytes::new(py, &w.welcome), w.seq, w.epoch);
            (3, fields.into_pyobject(py)?.into_any())
        }
        Some(Event::Lagged(l)) => (4, (l.channel,).into_pyobject(py)?.into_any()),
        None => (0, PyTuple::empty(py).into_any()),
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode_create, m)?)?;
    m.add_function(wrap_pyfunction!(encode_subscribe, m)?)?;
    m.add_function(wrap_pyfunction!(encode_unsubscribe, m)?)?;
    m.add_function(wrap_pyfunction!(encode_publish, m)?)?;
    m.add_function(wrap_pyfunction!(encode_commit, m)?)?;
    m.add_function(wrap_pyfunction!(encode_refresh, m)?)?;
    m.add_function(wrap_pyfunction!(encode_join, m)?)?;
    m.add_function(wrap_pyfunction!(encode_delivery, m)?)?;
    m.add_function(wrap_pyfunction!(encode_reply, m)?)?;
    m.add_function(wrap_pyfunction!(decode_publish, m)?)?;
    m.add("MAX_DECODED_PUBLISH", MAX_DECODED_PUBLISH)?;
    m.add_function(wrap_pyfunction!(decode_server_frame, m)?)?;
    Ok(())
}

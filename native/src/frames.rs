//! The relay protocol's frames as an agent writes and reads them (`proto/relay.proto`):
//! prost messages with the proto's field numbers, so an agent encodes its requests and
//! decodes the relay's frames without a protobuf runtime in Python. The relay itself
//! parses with the generated Python module; `tests/client/test_frames.py` holds these
//! definitions to it, field by field.

use bytes::Bytes;
use prost::Message;

/// `ClientFrame`: one request, numbered by the client.
#[derive(Clone, PartialEq, Message)]
pub struct ClientFrame {
    #[prost(uint64, tag = "1")]
    pub request_id: u64,
    #[prost(oneof = "Request", tags = "2, 3, 4, 5, 6, 7, 9")]
    pub kind: Option<Request>,
}

/// `ClientFrame.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "2")]
    Create(CreateChannel),
    #[prost(message, tag = "3")]
    Subscribe(Subscribe),
    #[prost(message, tag = "4")]
    Unsubscribe(Unsubscribe),
    #[prost(message, tag = "5")]
    Publish(Publish),
    #[prost(message, tag = "6")]
    Commit(Commit),
    #[prost(message, tag = "7")]
    Refresh(Refresh),
    #[prost(message, tag = "9")]
    Join(JoinRequest),
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateChannel {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub group_info: Bytes,
}

#[derive(Clone, PartialEq, Message)]
pub struct Subscribe {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint64, tag = "2")]
    pub after_seq: u64,
    #[prost(uint64, tag = "3")]
    pub subscription: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Unsubscribe {
    #[prost(string, tag = "1")]
    pub channel: String,
}

/// The messages are `Bytes` so that a payload the caller already holds (a Python
/// `bytes`, through `Bytes::from_owner`) is copied once, into the encoded frame.
#[derive(Clone, PartialEq, Message)]
pub struct Publish {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub message: Vec<Bytes>,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub message_id: Vec<Bytes>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Commit {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(bytes = "bytes", tag = "3")]
    pub commit: Bytes,
    #[prost(bytes = "bytes", tag = "4")]
    pub welcome: Bytes,
}

#[derive(Clone, PartialEq, Message)]
pub struct Refresh {
    #[prost(string, tag = "1")]
    pub token: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct JoinRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(string, tag = "2")]
    pub join_id: String,
}

/// `ServerFrame`: a Reply, deliveries, a Welcome or a lag notice.
#[derive(Clone, PartialEq, Message)]
pub struct ServerFrame {
    #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
    pub kind: Option<Event>,
}

/// `ServerFrame.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Event {
    #[prost(message, tag = "1")]
    Reply(Reply),
    #[prost(message, tag = "2")]
    Deliveries(Deliveries),
    #[prost(message, tag = "3")]
    Welcome(Welcome),
    #[prost(message, tag = "4")]
    Lagged(Lagged),
}

#[derive(Clone, PartialEq, Message)]
pub struct Reply {
    #[prost(uint64, tag = "1")]
    pub request_id: u64,
    #[prost(int32, tag = "2")]
    pub code: i32,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    #[prost(uint64, tag = "5")]
    pub epoch: u64,
    #[prost(uint64, tag = "6")]
    pub head_seq: u64,
    #[prost(uint32, tag = "7")]
    pub cipher_suite: u32,
}

/// Decoded from a `Bytes` frame, `message` and `sender` are slices of it, not copies.
#[derive(Clone, PartialEq, Message)]
pub struct Delivery {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint64, tag = "2")]
    pub seq: u64,
    #[prost(bytes = "bytes", tag = "3")]
    pub message: Bytes,
    #[prost(bytes = "bytes", tag = "4")]
    pub sender: Bytes,
    #[prost(bool, tag = "5")]
    pub handshake: bool,
    #[prost(uint64, tag = "6")]
    pub epoch: u64,
    #[prost(uint64, tag = "7")]
    pub subscription: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Deliveries {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<Delivery>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Welcome {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub welcome: Bytes,
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    #[prost(uint64, tag = "4")]
    pub epoch: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Lagged {
    #[prost(string, tag = "1")]
    pub channel: String,
}

/// A `ServerFrame`, or why it does not decode.
pub fn decode_event(frame: Bytes) -> Result<Option<Event>, prost::DecodeError> {
    Ok(ServerFrame::decode(frame)?.kind)
}

/// A Publish frame's request id, channel, and how many messages and ids it carries.
#[derive(Debug, PartialEq)]
pub struct PublishCounts {
    pub request_id: u64,
    pub channel: String,
    pub messages: usize,
    pub ids: usize,
}

/// What `ClientFrame::decode` would make of a Publish frame, counted without decoding
/// one message: a frame of a million one-byte messages costs a pass over its bytes, not
/// a million `Bytes`. None for a frame this does not follow exactly as prost does (not
/// protobuf, a kind other than Publish anywhere in it, a channel that is not UTF-8):
/// the caller then decodes it whole. Fields appear in any order and a repeated Publish
/// merges into the one before, as in prost.
pub fn count_publish(mut frame: &[u8]) -> Option<PublishCounts> {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

    let mut counts: Option<PublishCounts> = None;
    let mut request_id = 0;
    while !frame.is_empty() {
        let (tag, wire_type) = decode_key(&mut frame).ok()?;
        match (tag, wire_type) {
            (1, WireType::Varint) => request_id = decode_varint(&mut frame).ok()?,
            (5, WireType::LengthDelimited) => {
                let len = usize::try_from(decode_varint(&mut frame).ok()?).ok()?;
                let (mut publish, rest) = (frame.get(..len)?, frame.get(len..)?);
                frame = rest;
                let c = counts.get_or_insert_with(|| PublishCounts {
                    request_id: 0,
                    channel: String::new(),
                    messages: 0,
                    ids: 0,
                });
                while !publish.is_empty() {
                    let (tag, wire_type) = decode_key(&mut publish).ok()?;
                    if !(1..=3).contains(&tag) {
                        skip_field(wire_type, tag, &mut publish, DecodeContext::default()).ok()?;
                        continue;
                    }
                    if wire_type != WireType::LengthDelimited {
                        return None;
                    }
                    let len = usize::try_from(decode_varint(&mut publish).ok()?).ok()?;
                    let (value, rest) = (publish.get(..len)?, publish.get(len..)?);
                    publish = rest;
                    match tag {
                        1 => c.channel = std::str::from_utf8(value).ok()?.to_owned(),
                        2 => c.messages += 1,
                        _ => c.ids += 1,
                    }
                }
            }
            (1..=7 | 9, _) => return None,
            _ => skip_field(wire_type, tag, &mut frame, DecodeContext::default()).ok()?,
        }
    }
    let mut counts = counts?;
    counts.request_id = request_id;
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_round_trips_and_keeps_its_order() {
        let publish = Publish {
            channel: "acme/ns/svc".into(),
            message: vec![Bytes::from_static(b"one"), Bytes::from_static(b"two")],
            message_id: vec![Bytes::from_static(b"1"), Bytes::from_static(b"2")],
        };
        let wire = ClientFrame {
            request_id: u64::MAX,
            kind: Some(Request::Publish(publish.clone())),
        }
        .encode_to_vec();
        let frame = ClientFrame::decode(wire.as_slice()).unwrap();
        assert_eq!(frame.request_id, u64::MAX);
        assert_eq!(frame.kind, Some(Request::Publish(publish)));
    }

    fn publish_frame(request_id: u64, channel: &str, messages: usize, ids: usize) -> Vec<u8> {
        ClientFrame {
            request_id,
            kind: Some(Request::Publish(Publish {
                channel: channel.into(),
                message: vec![Bytes::from_static(b"m"); messages],
                message_id: vec![Bytes::from_static(b"i"); ids],
            })),
        }
        .encode_to_vec()
    }

    /// What prost decodes, as `count_publish` counts it (None when prost does not decode
    /// a Publish).
    fn decoded_counts(wire: &[u8]) -> Option<PublishCounts> {
        match ClientFrame::decode(wire) {
            Ok(ClientFrame {
                request_id,
                kind: Some(Request::Publish(p)),
            }) => Some(PublishCounts {
                request_id,
                channel: p.channel,
                messages: p.message.len(),
                ids: p.message_id.len(),
            }),
            _ => None,
        }
    }

    #[test]
    fn a_publish_is_counted_as_prost_decodes_it() {
        let one = publish_frame(7, "acme/ns/svc", 3000, 2);
        let other = publish_frame(9, "acme/ns/other", 5, 0);
        let subscribe = ClientFrame {
            request_id: 4,
            kind: Some(Request::Subscribe(Subscribe {
                channel: "acme/ns/svc".into(),
                ..Default::default()
            })),
        }
        .encode_to_vec();
        let mut unknown = one.clone();
        unknown.extend_from_slice(&[0x58, 0x01]); // field 11, a varint: skipped
        let cases: Vec<Vec<u8>> = vec![
            one.clone(),
            [one.clone(), other.clone()].concat(), // merged: counts add, the last channel and id
            unknown,
        ];
        for wire in &cases {
            assert_eq!(count_publish(wire), decoded_counts(wire));
            assert!(count_publish(wire).is_some());
        }
        let merged = count_publish(&[one.clone(), other].concat()).unwrap();
        assert_eq!(
            (merged.request_id, merged.channel.as_str(), merged.messages),
            (9, "acme/ns/other", 3005)
        );
        // Not followed here, left to prost: another kind, a cut frame, a bad channel.
        assert_eq!(count_publish(&[one.clone(), subscribe.clone()].concat()), None);
        assert_eq!(count_publish(&subscribe), None);
        assert_eq!(count_publish(&one[..one.len() - 1]), None);
        let bad_channel = publish_frame(1, "x", 1, 0);
        let mut bad_channel = bad_channel.clone();
        let at = bad_channel.iter().position(|b| *b == b'x').unwrap();
        bad_channel[at] = 0xff;
        assert_eq!(count_publish(&bad_channel), None);
        assert_eq!(decoded_counts(&bad_channel), None);
    }

    #[test]
    fn deliveries_are_slices_of_the_frame() {
        let frame = ServerFrame {
            kind: Some(Event::Deliveries(Deliveries {
                items: vec![Delivery {
                    channel: "acme/ns/svc".into(),
                    seq: 7,
                    message: Bytes::from(vec![9u8; 1000]),
                    sender: Bytes::from_static(b"agent"),
                    handshake: false,
                    epoch: 2,
                    subscription: 3,
                }],
            })),
        }
        .encode_to_vec();
        let wire = Bytes::from(frame);
        let Some(Event::Deliveries(d)) = decode_event(wire.clone()).unwrap() else {
            panic!("not deliveries")
        };
        let range = wire.as_ptr_range();
        assert!(range.contains(&d.items[0].message.as_ptr()));
        assert_eq!(d.items[0].message.len(), 1000);
    }

    #[test]
    fn a_frame_cut_short_does_not_decode() {
        let wire = ServerFrame {
            kind: Some(Event::Lagged(Lagged {
                channel: "acme/ns/svc".into(),
            })),
        }
        .encode_to_vec();
        assert!(decode_event(Bytes::copy_from_slice(&wire[..wire.len() - 1])).is_err());
    }
}

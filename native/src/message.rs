//! Reading the public framing of MLS messages (RFC 9420 §6): no keys involved.

use mls_rs::group::ContentType;
use mls_rs::mls_rs_codec::MlsDecode;
use mls_rs::{MlsMessage, MlsMessageDescription, WireFormat};

use crate::engine::MessageInfo;
use crate::error::{EngineError, Result};

pub fn wire_format_name(wf: WireFormat) -> &'static str {
    match wf {
        WireFormat::PublicMessage => "public_message",
        WireFormat::PrivateMessage => "private_message",
        WireFormat::Welcome => "welcome",
        WireFormat::GroupInfo => "group_info",
        WireFormat::KeyPackage => "key_package",
        _ => "unknown",
    }
}

fn content_type_name(ct: ContentType) -> &'static str {
    match ct {
        ContentType::Application => "application",
        ContentType::Proposal => "proposal",
        ContentType::Commit => "commit",
    }
}

pub fn info(msg: &MlsMessage) -> MessageInfo {
    let (group_id, epoch, content_type) = match msg.description() {
        MlsMessageDescription::PrivateProtocolMessage {
            group_id,
            epoch_id,
            content_type,
        } => (
            Some(group_id.to_vec()),
            Some(epoch_id),
            Some(content_type_name(content_type)),
        ),
        MlsMessageDescription::PublicProtocolMessage {
            group_id,
            epoch_id,
            content_type,
            ..
        } => (
            Some(group_id.to_vec()),
            Some(epoch_id),
            Some(content_type_name(content_type)),
        ),
        _ => (msg.group_id().map(<[u8]>::to_vec), msg.epoch(), None),
    };
    let identity = msg.as_key_package().map(|kp| {
        kp.signing_identity()
            .credential
            .as_basic()
            .map(|b| b.identifier.clone())
            .unwrap_or_default()
    });
    MessageInfo {
        wire_format: wire_format_name(msg.wire_format()),
        group_id,
        epoch,
        content_type,
        identity,
    }
}

pub fn is_commit(msg: &MlsMessage) -> bool {
    matches!(
        msg.description(),
        MlsMessageDescription::PrivateProtocolMessage {
            content_type: ContentType::Commit,
            ..
        } | MlsMessageDescription::PublicProtocolMessage {
            content_type: ContentType::Commit,
            ..
        }
    )
}

pub fn expect_kind(msg: &MlsMessage, want: WireFormat, expected: &'static str) -> Result<()> {
    if msg.wire_format() == want {
        Ok(())
    } else {
        Err(EngineError::WrongKind {
            expected,
            got: wire_format_name(msg.wire_format()).replace('_', " "),
        })
    }
}

/// Decodes exactly one message: trailing bytes are an error, so one byte string can never
/// be read as two different messages.
pub fn parse(bytes: &[u8], what: &'static str) -> Result<MlsMessage> {
    let mut rest = bytes;
    let msg = MlsMessage::mls_decode(&mut rest).map_err(|e| EngineError::Malformed {
        what,
        detail: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(EngineError::Malformed {
            what,
            detail: format!("{} unexpected bytes after the message", rest.len()),
        });
    }
    Ok(msg)
}

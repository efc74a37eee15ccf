//! Reading the public framing of MLS messages (RFC 9420 §6): no keys involved.

use mls_rs::group::ContentType;
use mls_rs::mls_rs_codec::MlsDecode;
use mls_rs::{MlsMessage, MlsMessageDescription, WireFormat};

use mls_rs::CryptoProvider;
use mls_rs_core::identity::Credential;

use crate::engine::{Crypto, KeyPackageInfo, MessageInfo};
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
    let key_package = msg.as_key_package().map(|kp| {
        let signing = kp.signing_identity();
        let credential = match &signing.credential {
            Credential::Custom(custom) => custom.data.clone(),
            Credential::Basic(basic) => basic.identifier.clone(),
            _ => Vec::new(),
        };
        let reference = Crypto::default()
            .cipher_suite_provider(kp.cipher_suite)
            .and_then(|cs| kp.to_reference(&cs).ok())
            .map(|r| r.to_vec());
        KeyPackageInfo {
            credential_type: signing.credential.credential_type().raw_value(),
            credential,
            signature_key: signing.signature_key.to_vec(),
            reference,
        }
    });
    MessageInfo {
        wire_format: wire_format_name(msg.wire_format()),
        group_id,
        epoch,
        content_type,
        key_package,
        cipher_suite: msg.cipher_suite().map(u16::from),
        welcome_refs: msg
            .welcome_key_package_references()
            .into_iter()
            .map(|r| r.to_vec())
            .collect(),
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
    // The MLSMessage's version (its first two bytes) is not signed, and mls-rs reads a
    // key package under any version: only MLS 1.0 (0x0001) is a message of ours.
    if let Some(&[hi, lo]) = bytes.get(..2) {
        if [hi, lo] != [0, 1] {
            return Err(EngineError::Malformed {
                what,
                detail: format!("unsupported protocol version 0x{hi:02x}{lo:02x}, not MLS 1.0"),
            });
        }
    }
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

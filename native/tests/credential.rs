//! Agent credentials: the wire format the account API's Python issuer produces, the
//! verifier, and the proof of possession an engine signs.

use _native::credential::{
    verify_credential, verify_credential_request, verify_mls_credential, AgentCredential, AgentCredentialContent,
    CredentialRequestContent, TrustAnchors, CLOCK_SKEW_SECS, CREDENTIAL_LABEL, REQUEST_LABEL, SVC_CREDENTIAL_TYPE,
};
use _native::{Engine, EngineError};
use mls_rs::{CipherSuite, CipherSuiteProvider, CryptoProvider};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
use mls_rs_core::identity::{BasicCredential, Credential, CredentialType, CustomCredential};
use mls_rs_crypto_awslc::AwsLcCryptoProvider;
use tempfile::TempDir;

mod common;
use common::Issuer;

const ACCOUNT: [u8; 16] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];
const NOT_BEFORE: u64 = 1_700_000_000;
const NOT_AFTER: u64 = 1_700_086_400;

fn provider(suite: u16) -> impl CipherSuiteProvider {
    AwsLcCryptoProvider::default()
        .cipher_suite_provider(CipherSuite::from(suite))
        .unwrap()
}

impl Issuer {
    fn anchors(&self) -> TrustAnchors {
        TrustAnchors::new([(self.kid.clone(), self.public.to_vec())]).unwrap()
    }

    /// Encodes `content` signed by this issuer, whatever `content.issuer` says.
    fn sign(&self, content: &AgentCredentialContent) -> Vec<u8> {
        self.credential(content.clone()).to_bytes().unwrap()
    }

    fn content(&self, signature_key: &[u8]) -> AgentCredentialContent {
        AgentCredentialContent {
            issuer: self.kid.as_bytes().to_vec(),
            account: ACCOUNT.to_vec(),
            identity: b"agent-a".to_vec(),
            cipher_suite: 1,
            signature_key: signature_key.to_vec(),
            not_before: NOT_BEFORE,
            not_after: NOT_AFTER,
        }
    }
}

fn agent_key() -> Vec<u8> {
    provider(1).signature_key_generate().unwrap().1.to_vec()
}

// ---- The fixed test vector the Python issuer must reproduce byte for byte. ----
//
// Issuer: RFC 8032 §7.1 TEST 1 key, kid "key-1":
//   seed   9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60
//   public d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a
// Content: account 00112233-4455-6677-8899-aabbccddeeff, identity "agent-a", suite 1,
//   signature_key = RFC 8032 TEST 2 public key, not_before 1700000000, not_after 1700086400.
const VECTOR_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const VECTOR_ISSUER_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const VECTOR_AGENT_KEY: &str = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";

/// encode(AgentCredentialContent), written out field by field (varint length prefixes of
/// fields shorter than 64 bytes are one byte).
fn vector_content_hex() -> String {
    [
        "05",                               // issuer length 5
        "6b65792d31",                       // "key-1"
        "10",                               // account length 16
        "00112233445566778899aabbccddeeff", // account UUID
        "07",                               // identity length 7
        "6167656e742d61",                   // "agent-a"
        "0001",                             // cipher_suite 1
        "20",                               // signature_key length 32
        VECTOR_AGENT_KEY,                   // signature_key
        "000000006553f100",                 // not_before 1700000000
        "0000000065554280",                 // not_after 1700086400
    ]
    .concat()
}

/// The full AgentCredential: content, then the 64-byte signature with its two-byte varint
/// length `4040`. Ed25519 is deterministic, so the issuer must produce exactly this
/// (cross-checked with Python `cryptography`'s Ed25519PrivateKey.from_private_bytes(seed)).
const VECTOR_SIGNATURE: &str = "47f7554047cc64169fb7fa7848d083e2e98d4827238a580d7d112ee4b9fe1d7c\
                                b2ab9a16a6425b9e42bd33e1161d1766c4e9bca2d53acee1139c35636f4d9103";

fn vector_content() -> AgentCredentialContent {
    AgentCredentialContent {
        issuer: b"key-1".to_vec(),
        account: ACCOUNT.to_vec(),
        identity: b"agent-a".to_vec(),
        cipher_suite: 1,
        signature_key: hex::decode(VECTOR_AGENT_KEY).unwrap(),
        not_before: NOT_BEFORE,
        not_after: NOT_AFTER,
    }
}

#[test]
fn content_encoding_matches_the_hand_computed_vector() {
    let content = vector_content();
    assert_eq!(hex::encode(content.to_bytes().unwrap()), vector_content_hex());
    assert_eq!(
        content.signed_data().unwrap(),
        [
            b"svc agent credential v1\x00".as_slice(),
            &hex::decode(vector_content_hex()).unwrap()
        ]
        .concat()
    );
}

#[test]
fn signed_vector_verifies_and_matches() {
    let seed = hex::decode(VECTOR_SEED).unwrap();
    let public = hex::decode(VECTOR_ISSUER_PUBLIC).unwrap();
    // aws-lc's Ed25519 secret key is seed || public.
    let issuer = Issuer {
        kid: "key-1".into(),
        secret: SignatureSecretKey::from([seed, public.clone()].concat()),
        public: SignaturePublicKey::from(public.clone()),
    };
    let bytes = issuer.sign(&vector_content());
    let expected = format!("{}4040{}", vector_content_hex(), VECTOR_SIGNATURE);
    assert_eq!(hex::encode(&bytes), expected);

    let anchors = TrustAnchors::new([("key-1", public)]).unwrap();
    let agent_key = hex::decode(VECTOR_AGENT_KEY).unwrap();
    let cred = verify_credential(&bytes, &anchors, Some(&agent_key), Some(NOT_BEFORE + 10)).unwrap();
    assert_eq!(cred.content, vector_content());
}

#[test]
fn long_fields_use_multi_byte_varint_lengths() {
    let mut content = vector_content();
    content.identity = vec![b'x'; 300];
    let bytes = content.to_bytes().unwrap();
    // issuer (6) + account (17), then identity: 300 = 0x012c as a two-byte varint 0x412c.
    assert_eq!(&bytes[23..25], &[0x41, 0x2c]);
    assert_eq!(bytes.len(), 82 - 8 + 2 + 300);
}

#[test]
fn constants() {
    assert_eq!(SVC_CREDENTIAL_TYPE, 0xF5C1);
    assert_eq!(CREDENTIAL_LABEL, b"svc agent credential v1\0");
    assert_eq!(REQUEST_LABEL, b"svc credential request v1\0");
}

// ---- Verification ----

#[test]
fn round_trip() {
    let issuer = Issuer::new("k1");
    let key = agent_key();
    let content = issuer.content(&key);
    let bytes = issuer.sign(&content);
    let cred = verify_credential(&bytes, &issuer.anchors(), Some(&key), Some(NOT_BEFORE)).unwrap();
    assert_eq!(cred.content, content);
    assert_eq!(cred.to_bytes().unwrap(), bytes);
    assert_eq!(AgentCredential::from_bytes(&bytes).unwrap(), cred);
    // No expected key and no time: signature and issuer only.
    verify_credential(&bytes, &issuer.anchors(), None, None).unwrap();
}

#[test]
fn one_of_several_anchors() {
    let a = Issuer::new("a");
    let b = Issuer::new("b");
    let anchors = TrustAnchors::new([("a", a.public.to_vec()), ("b", b.public.to_vec())]).unwrap();
    let key = agent_key();
    let clone = anchors.clone();
    verify_credential(&b.sign(&b.content(&key)), &clone, Some(&key), None).unwrap();
    verify_credential(&a.sign(&a.content(&key)), &anchors, Some(&key), None).unwrap();
    assert_eq!(anchors.kids(), ["a", "b"]);
}

#[test]
fn unknown_issuer_is_named() {
    let trusted = Issuer::new("trusted");
    let other = Issuer::new("rogue-kid");
    let key = agent_key();
    let err = verify_credential(&other.sign(&other.content(&key)), &trusted.anchors(), Some(&key), None).unwrap_err();
    assert!(
        matches!(&err, EngineError::UnknownIssuer { kid, .. } if kid == "rogue-kid"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("\"rogue-kid\"") && msg.contains("\"trusted\""), "{msg}");
}

#[test]
fn signed_by_the_wrong_key() {
    let trusted = Issuer::new("k1");
    // Claims kid k1 but is signed by another key.
    let forger = Issuer::new("k1");
    let key = agent_key();
    let err = verify_credential(
        &forger.sign(&forger.content(&key)),
        &trusted.anchors(),
        Some(&key),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&err, EngineError::CredentialSignature { kid } if kid == "k1"),
        "{err}"
    );
}

#[test]
fn altered_content_or_signature() {
    let issuer = Issuer::new("k1");
    let key = agent_key();
    let bytes = issuer.sign(&issuer.content(&key));
    // Flip a bit in not_after (the content's last byte, before the 2 + 64 signature bytes)
    // and in the signature's last byte.
    let not_after_last = bytes.len() - 66 - 1;
    for pos in [not_after_last, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[pos] ^= 1;
        let err = verify_credential(&bad, &issuer.anchors(), None, None).unwrap_err();
        assert!(matches!(err, EngineError::CredentialSignature { .. }), "{err}");
    }
}

#[test]
fn signature_key_substitution() {
    let issuer = Issuer::new("k1");
    let certified = agent_key();
    let presented = agent_key();
    let bytes = issuer.sign(&issuer.content(&certified));
    let err = verify_credential(&bytes, &issuer.anchors(), Some(&presented), None).unwrap_err();
    assert!(matches!(err, EngineError::CredentialKeyMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&hex::encode(&presented[..8])), "{err}");
}

#[test]
fn validity_period() {
    let issuer = Issuer::new("k1");
    let key = agent_key();
    let bytes = issuer.sign(&issuer.content(&key));
    let check = |now| verify_credential(&bytes, &issuer.anchors(), Some(&key), Some(now));

    check(NOT_BEFORE).unwrap();
    check(NOT_AFTER).unwrap();
    // Clock skew: up to 5 minutes early is accepted.
    check(NOT_BEFORE - CLOCK_SKEW_SECS).unwrap();
    let err = check(NOT_BEFORE - CLOCK_SKEW_SECS - 1).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::CredentialNotYetValid {
                not_before: NOT_BEFORE,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("2023-11-14T22:13:20Z"), "{err}");

    let err = check(NOT_AFTER + 1).unwrap_err();
    assert!(
        matches!(err, EngineError::CredentialExpired { not_after: NOT_AFTER, now } if now == NOT_AFTER + 1),
        "{err}"
    );
    assert!(err.to_string().contains("2023-11-15T22:13:20Z"), "{err}");

    // No time: an expired credential still verifies (tree re-validation on join).
    verify_credential(&bytes, &issuer.anchors(), Some(&key), None).unwrap();
}

fn malformed(bytes: &[u8], anchors: &TrustAnchors) -> String {
    match verify_credential(bytes, anchors, None, None) {
        Err(EngineError::Malformed { what, detail }) => {
            assert_eq!(what, "agent credential");
            detail
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn truncated_garbage_and_trailing_bytes() {
    let issuer = Issuer::new("k1");
    let anchors = issuer.anchors();
    let bytes = issuer.sign(&issuer.content(&agent_key()));
    for len in 0..bytes.len() {
        malformed(&bytes[..len], &anchors);
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(malformed(&trailing, &anchors).contains("trailing"));
    malformed(b"\xff\xff\xff\xff garbage", &anchors);
    malformed(&[0x42; 200], &anchors);
}

#[test]
fn non_minimal_varint_is_rejected() {
    let issuer = Issuer::new("k1");
    let bytes = issuer.sign(&issuer.content(&agent_key()));
    // The issuer length 0x02 written as the two-byte varint 0x4002.
    let padded = [&[0x40][..], &bytes].concat();
    malformed(&padded, &issuer.anchors());
}

type Mutation = Box<dyn Fn(&mut AgentCredentialContent)>;

#[test]
fn field_rules() {
    let issuer = Issuer::new("k1");
    let anchors = issuer.anchors();
    let key = agent_key();
    let cases: Vec<(&str, Mutation)> = vec![
        ("identity must be 1 to 1024", Box::new(|c| c.identity.clear())),
        (
            "identity must be 1 to 1024",
            Box::new(|c| c.identity = vec![b'a'; 1025]),
        ),
        ("account must be a 16-byte UUID", Box::new(|c| c.account.truncate(15))),
        ("account must be a 16-byte UUID", Box::new(|c| c.account.push(0))),
        ("unsupported cipher suite 3", Box::new(|c| c.cipher_suite = 3)),
        ("must be a 32-byte Ed25519 key", Box::new(|c| c.signature_key.push(0))),
        ("must be a 65-byte uncompressed P-256", Box::new(|c| c.cipher_suite = 2)),
        ("not_before", Box::new(|c| c.not_after = c.not_before - 1)),
        ("issuer must be a non-empty ASCII", Box::new(|c| c.issuer.clear())),
    ];
    for (want, mutate) in cases {
        let mut content = issuer.content(&key);
        mutate(&mut content);
        // Signed properly: the rule itself rejects it.
        let detail = malformed(&issuer.sign(&content), &anchors);
        assert!(detail.contains(want), "{detail} lacks {want}");
    }
    // The limits themselves are fine.
    let mut content = issuer.content(&key);
    content.identity = vec![b'a'; 1024];
    verify_credential(&issuer.sign(&content), &anchors, Some(&key), None).unwrap();
    content.identity = vec![b'a'];
    verify_credential(&issuer.sign(&content), &anchors, Some(&key), None).unwrap();
}

#[test]
fn suite_2_agent_key() {
    let issuer = Issuer::new("k1");
    let key = provider(2).signature_key_generate().unwrap().1.to_vec();
    assert_eq!(key.len(), 65);
    let mut content = issuer.content(&key);
    content.cipher_suite = 2;
    verify_credential(&issuer.sign(&content), &issuer.anchors(), Some(&key), Some(NOT_BEFORE)).unwrap();
}

#[test]
fn mls_credential_type() {
    let issuer = Issuer::new("k1");
    let key = agent_key();
    let cred = AgentCredential::from_bytes(&issuer.sign(&issuer.content(&key))).unwrap();
    let mls = cred.to_mls_credential().unwrap();
    assert_eq!(mls.credential_type(), CredentialType::new(0xF5C1));
    assert_eq!(
        verify_mls_credential(&mls, &issuer.anchors(), Some(&key), None).unwrap(),
        cred
    );

    let basic = Credential::Basic(BasicCredential::new(b"agent-a".to_vec()));
    let err = verify_mls_credential(&basic, &issuer.anchors(), None, None).unwrap_err();
    assert!(matches!(err, EngineError::WrongCredentialType { got: 1 }), "{err}");
    assert!(err.to_string().contains("0x0001 (basic)"), "{err}");

    let other = Credential::Custom(CustomCredential::new(
        CredentialType::new(0xF5C2),
        cred.to_bytes().unwrap(),
    ));
    let err = verify_mls_credential(&other, &issuer.anchors(), None, None).unwrap_err();
    assert!(matches!(err, EngineError::WrongCredentialType { got: 0xF5C2 }), "{err}");
}

#[test]
fn trust_anchor_rules() {
    assert!(TrustAnchors::new([("k", vec![0u8; 31])]).is_err());
    assert!(TrustAnchors::new([("", vec![0u8; 32])]).is_err());
    assert!(TrustAnchors::new([("ké", vec![0u8; 32])]).is_err());
    let empty = TrustAnchors::default();
    assert!(empty.is_empty());
    let issuer = Issuer::new("k1");
    let err = verify_credential(&issuer.sign(&issuer.content(&agent_key())), &empty, None, None).unwrap_err();
    assert!(err.to_string().contains("trusted keys: none"), "{err}");
}

// ---- Proof of possession ----

struct Agent {
    _dir: TempDir,
    engine: Engine,
}

fn agent(name: &str, suite: u16) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("data"), name.as_bytes(), Some(suite)).unwrap();
    Agent { _dir: dir, engine }
}

#[test]
fn proof_of_possession_both_suites() {
    for suite in [1u16, 2] {
        let a = agent("agent-a", suite);
        let (content, proof) = a.engine.credential_request(&ACCOUNT, 1_700_000_123).unwrap();
        let req = verify_credential_request(&content, &proof).unwrap();
        assert_eq!(
            req,
            CredentialRequestContent {
                account: ACCOUNT.to_vec(),
                identity: b"agent-a".to_vec(),
                cipher_suite: suite,
                signature_key: a.engine.signature_key().to_vec(),
                issued_at: 1_700_000_123,
            }
        );
        assert_eq!(req.to_bytes().unwrap(), content);
        // The proof is a plain MLS-scheme signature over label || content.
        provider(suite)
            .verify(
                &SignaturePublicKey::from(req.signature_key.clone()),
                &proof,
                &[REQUEST_LABEL, &content].concat(),
            )
            .unwrap();
    }
}

#[test]
fn request_encoding() {
    let a = agent("agent-a", 1);
    let (content, _) = a.engine.credential_request(&ACCOUNT, 0x0102030405060708).unwrap();
    let expected = [
        "10",
        "00112233445566778899aabbccddeeff",
        "07",
        "6167656e742d61",
        "0001",
        "20",
        &hex::encode(a.engine.signature_key()),
        "0102030405060708",
    ]
    .concat();
    assert_eq!(hex::encode(content), expected);
}

#[test]
fn proof_rejects_tampering_and_other_keys() {
    for suite in [1u16, 2] {
        let a = agent("agent-a", suite);
        let b = agent("agent-a", suite);
        let (content, proof) = a.engine.credential_request(&ACCOUNT, 1_700_000_000).unwrap();

        // Tampered content: issued_at changed.
        let mut tampered = content.clone();
        *tampered.last_mut().unwrap() ^= 1;
        let err = verify_credential_request(&tampered, &proof).unwrap_err();
        assert!(matches!(err, EngineError::CredentialRequestSignature), "{err}");

        // B's proof over B's request, with A's key swapped in: not A's signature.
        let (b_content, b_proof) = b.engine.credential_request(&ACCOUNT, 1_700_000_000).unwrap();
        let mut req = CredentialRequestContent::from_bytes(&b_content).unwrap();
        req.signature_key = a.engine.signature_key().to_vec();
        let err = verify_credential_request(&req.to_bytes().unwrap(), &b_proof).unwrap_err();
        assert!(matches!(err, EngineError::CredentialRequestSignature), "{err}");
        // A's content with B's proof.
        let err = verify_credential_request(&content, &b_proof).unwrap_err();
        assert!(matches!(err, EngineError::CredentialRequestSignature), "{err}");

        // Garbage and trailing bytes.
        assert!(matches!(
            verify_credential_request(&content[..content.len() - 1], &proof),
            Err(EngineError::Malformed {
                what: "credential request",
                ..
            })
        ));
        let trailing = [&content[..], &[0]].concat();
        assert!(matches!(
            verify_credential_request(&trailing, &proof),
            Err(EngineError::Malformed {
                what: "credential request",
                ..
            })
        ));
        assert!(verify_credential_request(&content, b"not a signature").is_err());
    }
}

#[test]
fn request_account_must_be_a_uuid() {
    let a = agent("agent-a", 1);
    let err = a.engine.credential_request(&ACCOUNT[..15], 0).unwrap_err();
    assert!(
        matches!(err, EngineError::Malformed { what: "account id", .. }),
        "{err}"
    );
}

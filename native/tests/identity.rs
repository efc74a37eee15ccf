//! `SvcIdentityProvider` in real mls-rs groups: who may join, who may stay, who may
//! renew, and what mls-rs checks at which time.

use _native::credential::{AgentCredential, AgentCredentialContent, TrustAnchors, SVC_CREDENTIAL_TYPE};
use _native::{EngineError, SvcIdentityError, SvcIdentityProvider};
use mls_rs::client_builder::{ClientBuilder, MlsConfig};
use mls_rs::error::MlsError;
use mls_rs::group::ReceivedMessage;
use mls_rs::identity::basic::BasicCredential;
use mls_rs::identity::{Credential, CredentialType, SigningIdentity};
use mls_rs::time::MlsTime;
use mls_rs::{
    CipherSuite, CipherSuiteProvider, Client, CryptoProvider, ExtensionList, Group, IdentityProvider, MlsMessage,
};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
use mls_rs_core::identity::MemberValidationContext;
use mls_rs_crypto_awslc::AwsLcCryptoProvider;

const T0: u64 = 1_700_000_000;
const DAY: u64 = 86_400;
const ACCOUNT_A: [u8; 16] = [0xaa; 16];
const ACCOUNT_B: [u8; 16] = [0xbb; 16];
const SUITE: CipherSuite = CipherSuite::CURVE25519_AES128;

fn at(secs: u64) -> MlsTime {
    MlsTime::from(secs)
}

fn suite() -> impl CipherSuiteProvider {
    AwsLcCryptoProvider::default().cipher_suite_provider(SUITE).unwrap()
}

fn key_pair() -> (SignatureSecretKey, SignaturePublicKey) {
    suite().signature_key_generate().unwrap()
}

struct Issuer {
    kid: String,
    secret: SignatureSecretKey,
    public: SignaturePublicKey,
}

impl Issuer {
    fn new(kid: &str) -> Self {
        let (secret, public) = key_pair();
        Self {
            kid: kid.into(),
            secret,
            public,
        }
    }

    /// A credential naming `kid` as its issuer, signed with this issuer's key.
    fn issue_as(
        &self,
        kid: &str,
        account: &[u8],
        identity: &str,
        key: &SignaturePublicKey,
        window: (u64, u64),
    ) -> Credential {
        let content = AgentCredentialContent {
            issuer: kid.as_bytes().to_vec(),
            account: account.to_vec(),
            identity: identity.as_bytes().to_vec(),
            cipher_suite: SUITE.into(),
            signature_key: key.to_vec(),
            not_before: window.0,
            not_after: window.1,
        };
        let signature = suite().sign(&self.secret, &content.signed_data().unwrap()).unwrap();
        AgentCredential { content, signature }.to_mls_credential().unwrap()
    }

    fn issue(&self, account: &[u8], identity: &str, key: &SignaturePublicKey, window: (u64, u64)) -> Credential {
        self.issue_as(&self.kid, account, identity, key, window)
    }
}

fn anchors(issuers: &[&Issuer]) -> TrustAnchors {
    TrustAnchors::new(issuers.iter().map(|i| (i.kid.clone(), i.public.to_vec()))).unwrap()
}

/// An agent's signing key pair and the credential it presents.
struct Agent {
    secret: SignatureSecretKey,
    public: SignaturePublicKey,
    credential: Credential,
}

impl Agent {
    fn new(issuer: &Issuer, account: &[u8], identity: &str, window: (u64, u64)) -> Self {
        let (secret, public) = key_pair();
        let credential = issuer.issue(account, identity, &public, window);
        Self {
            secret,
            public,
            credential,
        }
    }

    fn signing_identity(&self) -> SigningIdentity {
        SigningIdentity::new(self.credential.clone(), self.public.clone())
    }

    fn client(&self, anchors: &TrustAnchors) -> Client<impl MlsConfig> {
        self.client_with(SvcIdentityProvider::new(anchors.clone()))
    }

    fn client_with<I: IdentityProvider + Clone + 'static>(&self, provider: I) -> Client<impl MlsConfig> {
        ClientBuilder::new()
            .crypto_provider(AwsLcCryptoProvider::default())
            .identity_provider(provider)
            .signing_identity(self.signing_identity(), self.secret.clone(), SUITE)
            .build()
    }
}

/// What a forger runs: accepts anything and advertises the svc and basic credential
/// types, so it can make key packages and commits an honest client would refuse.
#[derive(Clone)]
struct AcceptAll(SvcIdentityProvider);

impl IdentityProvider for AcceptAll {
    type Error = SvcIdentityError;

    fn validate_member(
        &self,
        _: &SigningIdentity,
        _: Option<MlsTime>,
        _: MemberValidationContext<'_>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn validate_external_sender(
        &self,
        _: &SigningIdentity,
        _: Option<MlsTime>,
        _: Option<&ExtensionList>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn identity(&self, si: &SigningIdentity, ext: &ExtensionList) -> Result<Vec<u8>, Self::Error> {
        match &si.credential {
            Credential::Basic(basic) => Ok(basic.identifier.clone()),
            _ => self.0.identity(si, ext),
        }
    }

    fn valid_successor(
        &self,
        _: &SigningIdentity,
        _: &SigningIdentity,
        _: &ExtensionList,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }

    fn supported_types(&self) -> Vec<CredentialType> {
        vec![CredentialType::new(SVC_CREDENTIAL_TYPE), CredentialType::BASIC]
    }
}

fn key_package<C: MlsConfig>(client: &Client<C>, time: u64) -> MlsMessage {
    client
        .generate_key_package_message(ExtensionList::new(), ExtensionList::new(), Some(at(time)))
        .unwrap()
}

fn new_group<C: MlsConfig>(client: &Client<C>, time: u64) -> Group<C> {
    client
        .create_group(ExtensionList::new(), ExtensionList::new(), Some(at(time)))
        .unwrap()
}

/// `group` adds `kp` at `time`; returns the Welcome. Commit applied by the committer only.
fn add<C: MlsConfig>(group: &mut Group<C>, kp: MlsMessage, time: u64) -> MlsMessage {
    let commit = group
        .commit_builder()
        .add_member(kp)
        .unwrap()
        .commit_time(at(time))
        .build()
        .unwrap();
    group.apply_pending_commit().unwrap();
    commit.welcome_messages[0].clone()
}

fn send<C: MlsConfig, D: MlsConfig>(from: &mut Group<C>, to: &mut Group<D>, text: &[u8]) {
    let msg = from.encrypt_application_message(text, vec![]).unwrap();
    match to.process_incoming_message(msg).unwrap() {
        ReceivedMessage::ApplicationMessage(m) => assert_eq!(m.data(), text),
        other => panic!("expected an application message, got {other:?}"),
    }
}

fn expect_commit(received: ReceivedMessage) {
    assert!(
        matches!(received, ReceivedMessage::Commit(_)),
        "expected a commit, got {received:?}"
    );
}

/// The provider's error inside an mls-rs error.
fn provider_error(err: &MlsError) -> &SvcIdentityError {
    match err {
        MlsError::IdentityProviderError(any) => any
            .inner_dyn_error()
            .downcast_ref::<SvcIdentityError>()
            .expect("an SvcIdentityError"),
        other => panic!("expected an identity provider error, got {other:?}"),
    }
}

fn engine_error(err: &MlsError) -> &EngineError {
    provider_error(err).engine_error().expect("a credential error")
}

fn member_id(account: &[u8], identity: &str) -> Vec<u8> {
    [account, identity.as_bytes()].concat()
}

// ---- 1. the happy path, and identity() ----

#[test]
fn agents_of_two_accounts_with_the_same_identity_share_a_group() {
    let issuer = Issuer::new("key-1");
    let trust = anchors(&[&issuer]);
    let alice_a = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let alice_b = Agent::new(&issuer, &ACCOUNT_B, "alice", (T0, T0 + DAY));
    let (client_a, client_b) = (alice_a.client(&trust), alice_b.client(&trust));

    let mut group_a = new_group(&client_a, T0);
    let welcome = add(&mut group_a, key_package(&client_b, T0), T0 + 10);
    let (mut group_b, _) = client_b.join_group(None, &welcome, None).unwrap();

    assert_eq!(group_a.current_epoch(), 1);
    assert_eq!(group_b.current_epoch(), 1);
    send(&mut group_a, &mut group_b, b"hello from account A");
    send(&mut group_b, &mut group_a, b"hello from account B");

    let provider = SvcIdentityProvider::new(trust.clone());
    let ids: Vec<Vec<u8>> = group_b
        .roster()
        .members()
        .iter()
        .map(|m| provider.identity(&m.signing_identity, &ExtensionList::new()).unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![member_id(&ACCOUNT_A, "alice"), member_id(&ACCOUNT_B, "alice")]
    );
    assert_ne!(ids[0], ids[1]);

    // A second agent of account A named "alice" (another key) is the same member as far
    // as MLS is concerned: mls-rs refuses a duplicate identity() in the tree.
    let alice_a2 = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let client_a2 = alice_a2.client(&trust);
    let err = group_a
        .commit_builder()
        .add_member(key_package(&client_a2, T0))
        .unwrap()
        .commit_time(at(T0 + 20))
        .build()
        .unwrap_err();
    assert!(matches!(err, MlsError::DuplicateLeafData(0)), "{err:?}");
    assert_eq!(group_a.current_epoch(), 1);
}

#[test]
fn identity_needs_no_verification_and_rejects_other_credential_types() {
    let issuer = Issuer::new("key-1");
    let stranger = Issuer::new("stranger");
    // Unknown issuer and long expired: identity() still names it (mls-rs only calls it on
    // leaves validate_member accepted).
    let agent = Agent::new(&stranger, &ACCOUNT_A, "bob", (T0, T0 + 1));
    let provider = SvcIdentityProvider::new(anchors(&[&issuer]));
    assert_eq!(
        provider
            .identity(&agent.signing_identity(), &ExtensionList::new())
            .unwrap(),
        member_id(&ACCOUNT_A, "bob")
    );
    let basic = SigningIdentity::new(
        Credential::Basic(BasicCredential::new(b"bob".to_vec())),
        agent.public.clone(),
    );
    let err = provider.identity(&basic, &ExtensionList::new()).unwrap_err();
    assert!(
        matches!(err.engine_error(), Some(EngineError::WrongCredentialType { got: 1 })),
        "{err}"
    );
    let err = provider
        .validate_external_sender(&agent.signing_identity(), None, None)
        .unwrap_err();
    assert!(matches!(err, SvcIdentityError::ExternalSender), "{err}");
    assert_eq!(
        provider.supported_types(),
        vec![CredentialType::new(SVC_CREDENTIAL_TYPE)]
    );
}

//! `SvcIdentityProvider` in real mls-rs groups: who may join, who may stay, who may
//! renew, and what mls-rs checks at which time.

use _native::credential::{AgentCredentialContent, TrustAnchors, SVC_CREDENTIAL_TYPE};
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
use mls_rs_crypto_awslc::AwsLcCryptoProvider;

mod common;
use common::{AcceptAll, Issuer};

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

impl Issuer {
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
        self.credential(content).to_mls_credential().unwrap()
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

// ---- 2. the committer refuses bad key packages ----

/// `group` tries to add `kp` at `time`: the commit must fail, the group stay as it was.
fn add_fails<C: MlsConfig>(group: &mut Group<C>, kp: MlsMessage, time: u64) -> MlsError {
    let (epoch, members) = (group.current_epoch(), group.roster().members().len());
    let err = group
        .commit_builder()
        .add_member(kp)
        .and_then(|b| b.commit_time(at(time)).build())
        .unwrap_err();
    assert_eq!(group.current_epoch(), epoch);
    assert_eq!(group.roster().members().len(), members);
    assert!(!group.has_pending_commit());
    err
}

#[test]
fn the_committer_refuses_bad_key_packages_with_the_reason() {
    let issuer = Issuer::new("key-1");
    let rogue = Issuer::new("rogue");
    let trust = anchors(&[&issuer]);
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let client = alice.client(&trust);
    let mut group = new_group(&client, T0);
    let now = T0 + 1_000;

    // Expired: valid for 100 s from T0, added at T0 + 1000.
    let expired = Agent::new(&issuer, &ACCOUNT_B, "expired", (T0, T0 + 100));
    let err = add_fails(&mut group, key_package(&expired.client(&trust), T0), now);
    assert!(
        matches!(engine_error(&err), EngineError::CredentialExpired { not_after, now: n } if *not_after == T0 + 100 && *n == now),
        "{err}"
    );
    assert!(err.to_string().contains("expired"), "{err}");

    // Not yet valid: starts well beyond the clock-skew allowance.
    let early = Agent::new(&issuer, &ACCOUNT_B, "early", (now + 10_000, now + DAY));
    let err = add_fails(&mut group, key_package(&early.client(&trust), T0), now);
    assert!(
        matches!(engine_error(&err), EngineError::CredentialNotYetValid { not_before, .. } if *not_before == now + 10_000),
        "{err}"
    );

    // Unknown issuer: its own client trusts the rogue key; alice's does not.
    let stranger = Agent::new(&rogue, &ACCOUNT_B, "stranger", (T0, T0 + DAY));
    let err = add_fails(
        &mut group,
        key_package(&stranger.client(&anchors(&[&issuer, &rogue])), T0),
        now,
    );
    assert!(
        matches!(engine_error(&err), EngineError::UnknownIssuer { kid, trusted } if kid == "rogue" && trusted == &["key-1".to_string()]),
        "{err}"
    );
    assert!(err.to_string().contains("unknown key \"rogue\""), "{err}");

    // Key substitution: bob's genuine credential, in a key package signed by mallory's key.
    let bob = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0, T0 + DAY));
    let (secret, public) = key_pair();
    let substitute = Agent {
        secret,
        public,
        credential: bob.credential.clone(),
    };
    let kp = key_package(
        &substitute.client_with(AcceptAll(SvcIdentityProvider::new(trust.clone()))),
        T0,
    );
    let err = add_fails(&mut group, kp, now);
    assert!(
        matches!(engine_error(&err), EngineError::CredentialKeyMismatch { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("key substitution"), "{err}");

    // A basic credential.
    let (secret, public) = key_pair();
    let basic = Agent {
        secret,
        public,
        credential: Credential::Basic(BasicCredential::new(b"bob".to_vec())),
    };
    let kp = key_package(
        &basic.client_with(AcceptAll(SvcIdentityProvider::new(trust.clone()))),
        T0,
    );
    let err = add_fails(&mut group, kp, now);
    assert!(
        matches!(engine_error(&err), EngineError::WrongCredentialType { got: 1 }),
        "{err}"
    );

    // The group still works: a good key package is accepted at the same time.
    add(&mut group, key_package(&bob.client(&trust), T0), now);
    assert_eq!(group.roster().members().len(), 2);
}

// ---- 3. expiry: who checks it, at which time ----

#[test]
fn a_member_that_expired_does_not_make_the_group_unjoinable() {
    let issuer = Issuer::new("key-1");
    let trust = anchors(&[&issuer]);
    // alice's credential is valid for 100 s only; bob's and carol's for a day.
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + 100));
    let bob = Agent::new(&issuer, &ACCOUNT_A, "bob", (T0, T0 + DAY));
    let carol = Agent::new(&issuer, &ACCOUNT_B, "carol", (T0, T0 + DAY));
    let (ca, cb, cc) = (alice.client(&trust), bob.client(&trust), carol.client(&trust));

    let mut ga = new_group(&ca, T0);
    let welcome = add(&mut ga, key_package(&cb, T0), T0 + 10);
    let (mut gb, _) = cb.join_group(None, &welcome, None).unwrap();

    // Long after alice expired, bob adds carol: the committer checks only the new key
    // package at the commit time, not the existing leaves.
    let later = T0 + 1_000;
    let commit = gb
        .commit_builder()
        .add_member(key_package(&cc, later))
        .unwrap()
        .commit_time(at(later))
        .build()
        .unwrap();
    gb.apply_pending_commit().unwrap();
    expect_commit(ga.process_incoming_message(commit.commit_message.clone()).unwrap());
    let welcome = &commit.welcome_messages[0];

    // Joining with a time would revalidate alice's leaf at that time and fail...
    let err = cc
        .join_group(None, welcome, Some(at(later)))
        .err()
        .expect("join must fail");
    assert!(
        matches!(engine_error(&err), EngineError::CredentialExpired { not_after, .. } if *not_after == T0 + 100),
        "{err}"
    );
    // ...which is why joiners pass None: carol joins, and everyone talks.
    let (mut gc, _) = cc.join_group(None, welcome, None).unwrap();
    assert_eq!(gc.roster().members().len(), 3);
    send(&mut ga, &mut gc, b"still here");
    send(&mut gc, &mut ga, b"welcome back");
    send(&mut gb, &mut gc, b"hi carol");
}

#[test]
fn receivers_check_added_credentials_only_when_given_a_time() {
    let issuer = Issuer::new("key-1");
    let trust = anchors(&[&issuer]);
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let bob = Agent::new(&issuer, &ACCOUNT_A, "bob", (T0, T0 + DAY));
    let carol = Agent::new(&issuer, &ACCOUNT_B, "carol", (T0, T0 + 100));
    let (ca, cb, cc) = (alice.client(&trust), bob.client(&trust), carol.client(&trust));
    let mut ga = new_group(&ca, T0);
    let welcome = add(&mut ga, key_package(&cb, T0), T0 + 10);
    let (mut gb, _) = cb.join_group(None, &welcome, None).unwrap();

    // alice adds carol while carol's credential is valid (commit time T0 + 50)...
    let commit = ga
        .commit_builder()
        .add_member(key_package(&cc, T0))
        .unwrap()
        .commit_time(at(T0 + 50))
        .build()
        .unwrap();
    // ...bob processing it with a time after carol expired rejects it...
    let err = gb
        .process_incoming_message_with_time(commit.commit_message.clone(), at(T0 + 1_000))
        .unwrap_err();
    assert!(
        matches!(engine_error(&err), EngineError::CredentialExpired { not_after, .. } if *not_after == T0 + 100),
        "{err}"
    );
    assert_eq!(gb.current_epoch(), 1);
    // ...with the time it was sent it accepts it, and without a time too.
    let mut gb2 = gb.clone();
    expect_commit(
        gb2.process_incoming_message_with_time(commit.commit_message.clone(), at(T0 + 50))
            .unwrap(),
    );
    expect_commit(gb.process_incoming_message(commit.commit_message).unwrap());
    assert_eq!(gb.current_epoch(), 2);
}

// ---- 4. a forged leaf in a Welcome ----

#[test]
fn a_welcome_with_a_forged_leaf_is_refused() {
    let issuer = Issuer::new("key-1");
    let rogue = Issuer::new("rogue");
    let honest = anchors(&[&issuer]);
    let lenient = anchors(&[&issuer, &rogue]);

    // The group is built by clients that trust the rogue key; carol trusts only key-1.
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let mallory = Agent::new(&rogue, &ACCOUNT_B, "mallory", (T0, T0 + DAY));
    let carol = Agent::new(&issuer, &ACCOUNT_B, "carol", (T0, T0 + DAY));
    let (ca, cm, cc) = (alice.client(&lenient), mallory.client(&lenient), carol.client(&honest));
    let mut ga = new_group(&ca, T0);
    let commit = ga
        .commit_builder()
        .add_member(key_package(&cm, T0))
        .unwrap()
        .add_member(key_package(&cc, T0))
        .unwrap()
        .commit_time(at(T0 + 10))
        .build()
        .unwrap();
    let err = cc
        .join_group(None, &commit.welcome_messages[0], None)
        .err()
        .expect("join must fail");
    assert!(
        matches!(engine_error(&err), EngineError::UnknownIssuer { kid, .. } if kid == "rogue"),
        "{err}"
    );
    assert!(err.to_string().contains("unknown key \"rogue\""), "{err}");

    // A leaf that names the trusted kid but was signed by another key: built by a
    // committer that accepts anything.
    let forged = Agent {
        credential: rogue.issue_as("key-1", &ACCOUNT_B, "mallory", &mallory.public, (T0, T0 + DAY)),
        secret: mallory.secret.clone(),
        public: mallory.public.clone(),
    };
    let dave = Agent::new(&issuer, &ACCOUNT_B, "dave", (T0, T0 + DAY));
    let cd = dave.client(&honest);
    let lax = alice.client_with(AcceptAll(SvcIdentityProvider::new(honest.clone())));
    let cf = forged.client_with(AcceptAll(SvcIdentityProvider::new(honest.clone())));
    let mut gl = new_group(&lax, T0);
    let commit = gl
        .commit_builder()
        .add_member(key_package(&cf, T0))
        .unwrap()
        .add_member(key_package(&cd, T0))
        .unwrap()
        .commit_time(at(T0 + 10))
        .build()
        .unwrap();
    let err = cd
        .join_group(None, &commit.welcome_messages[0], None)
        .err()
        .expect("join must fail");
    assert!(
        matches!(engine_error(&err), EngineError::CredentialSignature { kid } if kid == "key-1"),
        "{err}"
    );
}

// ---- 5. renewal and self-updates ----

#[test]
fn a_member_renews_its_credential_but_cannot_change_who_it_is() {
    let issuer = Issuer::new("key-1");
    let trust = anchors(&[&issuer]);
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let bob = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0, T0 + DAY));
    let (ca, cb) = (alice.client(&trust), bob.client(&trust));
    let mut ga = new_group(&ca, T0);
    let welcome = add(&mut ga, key_package(&cb, T0), T0 + 10);
    let (mut gb, _) = cb.join_group(None, &welcome, None).unwrap();

    // A plain self-update: same credential, new HPKE keys.
    let commit = gb.commit_builder().commit_time(at(T0 + 20)).build().unwrap();
    gb.apply_pending_commit().unwrap();
    expect_commit(ga.process_incoming_message(commit.commit_message).unwrap());
    assert_eq!(ga.current_epoch(), 2);

    // Renewal: a new key and a new credential for the same account and identity.
    let renewed = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0 + DAY / 2, T0 + 2 * DAY));
    let commit = gb
        .commit_builder()
        .set_new_signing_identity(renewed.secret.clone(), renewed.signing_identity())
        .commit_time(at(T0 + DAY / 2))
        .build()
        .unwrap();
    gb.apply_pending_commit().unwrap();
    expect_commit(ga.process_incoming_message(commit.commit_message).unwrap());
    let bob_leaf = ga.roster().member_with_index(1).unwrap();
    assert_eq!(bob_leaf.signing_identity, renewed.signing_identity());
    send(&mut gb, &mut ga, b"signed with the renewed key");
    send(&mut ga, &mut gb, b"got it");

    // Another identity of the same account, or the same identity of another account:
    // rejected by the others.
    for (account, identity) in [(ACCOUNT_B, "mallory"), (ACCOUNT_A, "bob")] {
        let other = Agent::new(&issuer, &account, identity, (T0, T0 + 2 * DAY));
        let epoch = ga.current_epoch();
        let built = gb
            .commit_builder()
            .set_new_signing_identity(other.secret.clone(), other.signing_identity())
            .commit_time(at(T0 + DAY / 2))
            .build();
        let commit = match built {
            Ok(commit) => commit,
            Err(e) => panic!("committer refused {identity}: {e:?}"),
        };
        gb.clear_pending_commit();
        let err = ga.process_incoming_message(commit.commit_message).unwrap_err();
        assert!(matches!(err, MlsError::InvalidSuccessor), "{err:?}");
        assert_eq!(ga.current_epoch(), epoch);
    }
    send(&mut gb, &mut ga, b"still bob");
}

// ---- what mls-rs checks on the sending side (the engine must check the rest) ----

#[test]
fn mls_rs_checks_the_senders_own_leaf_only_when_creating_a_group() {
    let issuer = Issuer::new("key-1");
    let rogue = Issuer::new("rogue");
    let trust = anchors(&[&issuer]);
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let bob = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0, T0 + 100));
    let (ca, cb) = (alice.client(&trust), bob.client(&trust));
    let later = T0 + 1_000;

    // Creating a group validates the creator's own leaf at the given time.
    let err = cb
        .create_group(ExtensionList::new(), ExtensionList::new(), Some(at(later)))
        .err()
        .expect("an expired creator");
    assert!(
        matches!(engine_error(&err), EngineError::CredentialExpired { .. }),
        "{err}"
    );
    let stranger = Agent::new(&rogue, &ACCOUNT_B, "stranger", (T0, T0 + DAY));
    let err = stranger
        .client(&trust)
        .create_group(ExtensionList::new(), ExtensionList::new(), None)
        .err()
        .expect("an unknown issuer");
    assert!(matches!(engine_error(&err), EngineError::UnknownIssuer { .. }), "{err}");

    // Key packages are not checked at all by the client that makes them: an expired or
    // unknown-issuer credential still yields one (committers refuse it, test 2).
    cb.generate_key_package_message(ExtensionList::new(), ExtensionList::new(), Some(at(later)))
        .unwrap();
    key_package(&stranger.client(&trust), T0);

    let mut ga = new_group(&ca, T0);
    let welcome = add(&mut ga, key_package(&cb, T0), T0 + 10);
    let (mut gb, _) = cb.join_group(None, &welcome, None).unwrap();

    // An expired member can still commit: the committer does not revalidate its leaf.
    // Receivers accept it without a time and refuse it at a time after expiry.
    let commit = gb.commit_builder().commit_time(at(later)).build().unwrap();
    gb.clear_pending_commit();
    let err = ga
        .clone()
        .process_incoming_message_with_time(commit.commit_message.clone(), at(later))
        .unwrap_err();
    assert!(
        matches!(engine_error(&err), EngineError::CredentialExpired { .. }),
        "{err}"
    );
    expect_commit(ga.clone().process_incoming_message(commit.commit_message).unwrap());

    // Nor does it check a new signing identity: a credential from an unknown issuer
    // builds fine and only the receivers refuse it. (The engine must validate a new
    // signing identity itself before committing, or its commit is rejected by all.)
    let forged = Agent::new(&rogue, &ACCOUNT_B, "bob", (T0, T0 + DAY));
    let commit = gb
        .commit_builder()
        .set_new_signing_identity(forged.secret.clone(), forged.signing_identity())
        .commit_time(at(T0 + 50))
        .build()
        .unwrap();
    gb.clear_pending_commit();
    let err = ga.process_incoming_message(commit.commit_message).unwrap_err();
    assert!(
        matches!(engine_error(&err), EngineError::UnknownIssuer { kid, .. } if kid == "rogue"),
        "{err}"
    );
    assert_eq!(ga.current_epoch(), 1);
}

#[test]
fn update_proposals_renew_but_cannot_change_who_it_is() {
    let issuer = Issuer::new("key-1");
    let trust = anchors(&[&issuer]);
    let alice = Agent::new(&issuer, &ACCOUNT_A, "alice", (T0, T0 + DAY));
    let bob = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0, T0 + DAY));
    let (ca, cb) = (alice.client(&trust), bob.client(&trust));
    let mut ga = new_group(&ca, T0);
    let welcome = add(&mut ga, key_package(&cb, T0), T0 + 10);
    let (mut gb, _) = cb.join_group(None, &welcome, None).unwrap();

    // bob proposes a renewal; alice commits it.
    let renewed = Agent::new(&issuer, &ACCOUNT_B, "bob", (T0, T0 + 2 * DAY));
    let proposal = gb
        .propose_update_with_identity(renewed.secret.clone(), renewed.signing_identity(), vec![])
        .unwrap();
    ga.process_incoming_message(proposal).unwrap();
    let commit = ga.commit_builder().commit_time(at(T0 + 20)).build().unwrap();
    assert!(commit.unused_proposals.is_empty());
    ga.apply_pending_commit().unwrap();
    expect_commit(gb.process_incoming_message(commit.commit_message).unwrap());
    assert_eq!(
        ga.roster().member_with_index(1).unwrap().signing_identity,
        renewed.signing_identity()
    );
    send(&mut gb, &mut ga, b"renewed by proposal");

    // bob proposes to become another identity: alice's commit leaves the proposal out.
    let other = Agent::new(&issuer, &ACCOUNT_B, "mallory", (T0, T0 + 2 * DAY));
    let proposal = gb
        .propose_update_with_identity(other.secret.clone(), other.signing_identity(), vec![])
        .unwrap();
    ga.process_incoming_message(proposal).unwrap();
    let commit = ga.commit_builder().commit_time(at(T0 + 30)).build().unwrap();
    assert_eq!(commit.unused_proposals.len(), 1);
    ga.apply_pending_commit().unwrap();
    expect_commit(gb.process_incoming_message(commit.commit_message).unwrap());
    assert_eq!(
        ga.roster().member_with_index(1).unwrap().signing_identity,
        renewed.signing_identity()
    );
    send(&mut gb, &mut ga, b"still bob");
}

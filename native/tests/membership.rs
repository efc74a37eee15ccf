//! Channel roles and the relay's view of a group: the same policy enforced by the member
//! building a commit, by every member receiving it and by the relay's tracker, including
//! against a rogue member whose client does not enforce it.

use std::sync::Arc;

use _native::credential::AgentCredentialContent;
use _native::policy::{Role, RolesExt, ROLES_EXTENSION};
use _native::tracker::{Observed, TrackedGroup, Tracker};
use _native::{Engine, GroupHandle, Received, SvcIdentityProvider, TrustAnchors};
use mls_rs::client_builder::MlsConfig;
use mls_rs::identity::SigningIdentity;
use mls_rs::mls_rules::{DefaultMlsRules, EncryptionOptions};
use mls_rs::{CipherSuite, CipherSuiteProvider, Client, CryptoProvider, ExtensionList, MlsMessage};
use mls_rs_core::extension::ExtensionType;
use mls_rs_crypto_awslc::AwsLcCryptoProvider;
use tempfile::TempDir;

mod common;

const GROUP: &[u8] = b"org/ns/svc";

struct Agent {
    _dir: TempDir,
    engine: Engine,
}

fn agent(name: &str) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::certified(&dir.path().join("data"), name.as_bytes(), None);
    Agent { _dir: dir, engine }
}

fn mid(name: &str) -> Vec<u8> {
    [common::ACCOUNT.as_slice(), name.as_bytes()].concat()
}

fn tracker() -> Tracker {
    let t = Tracker::new();
    let i = common::issuer();
    t.set_trust_anchors(TrustAnchors::new([(i.kid.clone(), i.public.to_vec())]).unwrap());
    t
}

fn policy_error(r: Result<impl std::fmt::Debug, _native::EngineError>) -> String {
    let e = r.expect_err("expected the policy to refuse");
    assert!(
        matches!(e, _native::EngineError::Policy { .. }),
        "not a policy refusal: {e}"
    );
    e.to_string()
}

/// A commit accepted by the relay's tracker and every listed member.
fn deliver(commit: &[u8], tracked: &mut TrackedGroup, members: &[&Arc<GroupHandle>]) -> Observed {
    let observed = tracked.process(commit).unwrap();
    for m in members {
        assert!(matches!(m.process(commit).unwrap(), Received::Commit(_)));
    }
    observed
}

/// alice (owner) with bob and carol, and the tracker following from the GroupInfo.
fn channel(a: &Agent, b: &Agent, c: &Agent) -> (Vec<Arc<GroupHandle>>, TrackedGroup) {
    let g = a.engine.create_group(GROUP).unwrap();
    let mut tracked = tracker().observe(&g.group_info().unwrap()).unwrap();
    let mut handles = vec![g.clone()];
    for other in [b, c] {
        let kp = other.engine.generate_key_package().unwrap();
        let pending = g.add_members(&[kp]).unwrap();
        g.apply_pending_commit().unwrap();
        let members: Vec<&Arc<GroupHandle>> = handles[1..].iter().collect();
        deliver(&pending.commit, &mut tracked, &members);
        handles.push(other.engine.join_group(&pending.welcome.unwrap()).unwrap());
    }
    (handles, tracked)
}

/// alice (the owner) makes bob an admin; the relay and every member follow.
fn make_bob_admin(g: &[Arc<GroupHandle>], tracked: &mut TrackedGroup) {
    let promote = g[0].set_role(&mid("bob"), Role::Admin).unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&promote.commit, tracked, &[&g[1], &g[2]]);
}

#[test]
fn the_tracker_follows_adds_and_knows_the_welcome_recipients() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = a.engine.create_group(GROUP).unwrap();
    let t = tracker();
    let mut tracked = t.observe(&g.group_info().unwrap()).unwrap();
    assert_eq!(tracked.group_id(), GROUP);
    assert_eq!(tracked.members(), vec![(mid("alice"), Role::Owner)]);

    let kp = b.engine.generate_key_package().unwrap();
    let reference = _native::inspect(&kp).unwrap().key_package.unwrap().reference.unwrap();
    let pending = g.add_members(std::slice::from_ref(&kp)).unwrap();
    g.apply_pending_commit().unwrap();
    let Observed::Commit(event) = tracked.process(&pending.commit).unwrap() else {
        panic!("expected a commit");
    };
    assert!(event.removed.is_empty() && event.left.is_empty() && !event.roles_changed);
    assert_eq!((event.epoch, event.committer.clone()), (1, mid("alice")));
    assert_eq!(event.added, vec![(mid("bob"), reference.clone())]);
    // The key package's HPKE init key (X25519 in suite 1), what the relay keeps so that
    // no key package is added twice.
    let [init_key] = event.added_init_keys.as_slice() else {
        panic!("one init key per added key package");
    };
    assert_eq!(init_key.len(), 32);
    assert!(kp.windows(32).any(|w| w == init_key.as_slice()));
    let welcome_refs = _native::inspect(pending.welcome.as_ref().unwrap())
        .unwrap()
        .welcome_refs;
    assert_eq!(welcome_refs, vec![reference]);

    // A snapshot brings back the same group: a relay restart resumes from the store.
    let reloaded = t.load(&tracked.snapshot().unwrap()).unwrap();
    assert_eq!(reloaded.epoch(), 1);
    assert_eq!(
        reloaded.members(),
        vec![(mid("alice"), Role::Owner), (mid("bob"), Role::Member)]
    );
}

#[test]
fn handshakes_travel_in_the_clear_and_application_messages_do_not() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, _) = channel(&a, &b, &c);
    let update = g[0].self_update().unwrap();
    assert_eq!(_native::inspect(&update.commit).unwrap().wire_format, "public_message");
    g[0].clear_pending_commit().unwrap();
    let proposal = g[1].propose_update().unwrap();
    assert_eq!(_native::inspect(&proposal).unwrap().wire_format, "public_message");
    let ct = g[0].encrypt(b"secret", b"").unwrap();
    assert_eq!(_native::inspect(&ct).unwrap().wire_format, "private_message");
}

#[test]
fn a_plain_member_cannot_add_remove_or_change_roles() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, _) = channel(&a, &b, &c);
    let dave = agent("dave");
    policy_error(g[1].add_members(&[dave.engine.generate_key_package().unwrap()]));
    policy_error(g[1].remove_members(&[mid("carol")]));
    policy_error(g[1].set_role(&mid("bob"), Role::Admin));
    policy_error(g[1].set_members_invite(true));
    // Nor does it commit its own key update: a commit carries secrets that only members
    // can check, so a spoiled one would strand them (docs/security.md).
    policy_error(g[1].self_update());
}

#[test]
fn a_members_key_update_is_a_proposal_the_owner_commits() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    let proposal = g[1].propose_update().unwrap();
    assert!(matches!(tracked.process(&proposal).unwrap(), Observed::Update { member } if member == mid("bob")));
    // Sent again (a resent Publish), the same proposal is the same reference: a repeat.
    let before = tracked.snapshot().unwrap();
    assert!(matches!(tracked.process(&proposal).unwrap(), Observed::Repeat { member } if member == mid("bob")));
    assert_eq!(tracked.snapshot().unwrap(), before);
    for m in [&g[0], &g[2]] {
        assert!(matches!(m.process(&proposal).unwrap(), Received::Proposal { .. }));
    }
    let commit = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&commit.commit, &mut tracked, &[&g[1], &g[2]]);
    let ct = g[1].encrypt(b"fresh keys", b"").unwrap();
    assert!(matches!(g[2].process(&ct).unwrap(), Received::Application { .. }));
}

#[test]
fn a_member_has_one_update_and_one_leave_proposal_per_epoch() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    tracked.process(&g[1].propose_update().unwrap()).unwrap();
    tracked.process(&g[1].propose_leave().unwrap()).unwrap();
    let before = tracked.snapshot().unwrap();
    let err = tracked.process(&g[1].propose_update().unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .contains("one key update and one leave proposal per epoch"),
        "{err}"
    );
    assert_eq!(tracked.snapshot().unwrap(), before);
    // Another member's are its own.
    tracked.process(&g[2].propose_update().unwrap()).unwrap();
}

#[test]
fn the_owner_is_never_removed_and_hands_ownership_over() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    make_bob_admin(&g, &mut tracked);
    assert_eq!(g[2].roles().unwrap().role(&mid("bob")), Role::Admin);

    // An admin removes members, but not the owner, and cannot take ownership.
    policy_error(g[1].remove_members(&[mid("alice")]));
    policy_error(g[1].set_role(&mid("bob"), Role::Owner));

    let handover = g[0].set_role(&mid("bob"), Role::Owner).unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&handover.commit, &mut tracked, &[&g[1], &g[2]]);
    let roles = tracked.roles();
    assert_eq!(
        (roles.role(&mid("bob")), roles.role(&mid("alice"))),
        (Role::Owner, Role::Admin)
    );

    let removal = g[1].remove_members(&[mid("alice")]).unwrap();
    g[1].apply_pending_commit().unwrap();
    deliver(&removal.commit, &mut tracked, &[&g[2]]);
    assert_eq!(
        tracked.members(),
        vec![(mid("bob"), Role::Owner), (mid("carol"), Role::Member)]
    );
}

#[test]
fn a_leaving_admin_takes_its_role_along() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    make_bob_admin(&g, &mut tracked);

    let leave = g[1].propose_leave().unwrap();
    assert!(matches!(tracked.process(&leave).unwrap(), Observed::Leave { member } if member == mid("bob")));
    for m in [&g[0], &g[2]] {
        assert!(matches!(m.process(&leave).unwrap(), Received::Proposal { .. }));
    }
    // alice, the owner, commits bob's own removal; the roles change comes with it.
    let commit = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    let Observed::Commit(event) = deliver(&commit.commit, &mut tracked, &[&g[2]]) else {
        panic!("expected a commit");
    };
    assert_eq!((event.left, event.removed), (vec![mid("bob")], vec![]));
    assert!(event.roles_changed);
    assert_eq!(tracked.roles(), RolesExt::new(mid("alice")));
    assert_eq!(g[0].roles().unwrap(), RolesExt::new(mid("alice")));
}

#[test]
fn forged_replayed_and_foreign_handshakes_change_nothing() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    let before = tracked.snapshot().unwrap();

    let update = g[0].self_update().unwrap();
    let mut forged = update.commit.clone();
    let n = forged.len();
    forged[n / 2] ^= 1; // inside the signed content
    assert!(tracked.process(&forged).is_err());
    assert!(tracked.process(b"\x00\x01junk").is_err());
    assert!(tracked.process(&g[0].encrypt(b"hi", b"").unwrap()).is_err());
    g[0].clear_pending_commit().unwrap();

    // Another group's commit, however valid there.
    let (d, e) = (agent("dave"), agent("erin"));
    let other = d.engine.create_group(b"org/ns/other").unwrap();
    let add = other.add_members(&[e.engine.generate_key_package().unwrap()]).unwrap();
    assert!(tracked.process(&add.commit).is_err());
    assert_eq!(tracked.snapshot().unwrap(), before);

    // The channel still commits, and the accepted commit cannot be replayed.
    let update = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&update.commit, &mut tracked, &[&g[1], &g[2]]);
    assert!(tracked.process(&update.commit).is_err());
    assert_eq!(tracked.epoch(), 3);
}

/// A member whose client enforces nothing: mls-rs's default rules, svc credentials.
fn rogue_client(name: &str) -> Client<impl MlsConfig> {
    let cs = AwsLcCryptoProvider::default()
        .cipher_suite_provider(CipherSuite::CURVE25519_AES128)
        .unwrap();
    let (secret, public) = cs.signature_key_generate().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let issuer = common::issuer();
    let credential = issuer.credential(AgentCredentialContent {
        issuer: issuer.kid.as_bytes().to_vec(),
        account: common::ACCOUNT.to_vec(),
        identity: name.as_bytes().to_vec(),
        cipher_suite: 1,
        signature_key: public.to_vec(),
        not_before: now - 60,
        not_after: now + 3600,
    });
    let signing = SigningIdentity::new(credential.to_mls_credential().unwrap(), public);
    let anchors = TrustAnchors::new([(issuer.kid.clone(), issuer.public.to_vec())]).unwrap();
    Client::builder()
        .crypto_provider(AwsLcCryptoProvider::default())
        .identity_provider(SvcIdentityProvider::new(anchors))
        .mls_rules(DefaultMlsRules::new().with_encryption_options(EncryptionOptions::new(false, Default::default())))
        .extension_type(ExtensionType::new(ROLES_EXTENSION))
        .signing_identity(signing, secret, CipherSuite::CURVE25519_AES128)
        .build()
}

#[test]
fn a_rogue_members_policy_breaking_commits_are_refused_by_the_relay_and_members() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    let rogue = rogue_client("mallory");
    let kp = rogue
        .generate_key_package_message(ExtensionList::default(), ExtensionList::default(), None)
        .unwrap();
    let add = g[0].add_members(&[kp.to_bytes().unwrap()]).unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&add.commit, &mut tracked, &[&g[1], &g[2]]);
    let welcome = MlsMessage::from_bytes(add.welcome.as_ref().unwrap()).unwrap();
    let (mut group, _) = rogue.join_group(None, &welcome, None).unwrap();
    let before = tracked.snapshot().unwrap();

    let attempts: Vec<(&str, Vec<u8>)> = vec![
        ("remove the owner", {
            let out = group.commit_builder().remove_member(0).unwrap().build().unwrap();
            group.clear_pending_commit();
            out.commit_message.to_bytes().unwrap()
        }),
        ("remove another member", {
            let out = group.commit_builder().remove_member(1).unwrap().build().unwrap();
            group.clear_pending_commit();
            out.commit_message.to_bytes().unwrap()
        }),
        ("make itself owner", {
            let roles = RolesExt::new(mid("mallory"));
            let ext = _native::policy::with_roles(&group.context().extensions, roles);
            let out = group
                .commit_builder()
                .set_group_context_ext(ext)
                .unwrap()
                .build()
                .unwrap();
            group.clear_pending_commit();
            out.commit_message.to_bytes().unwrap()
        }),
        ("update its own keys (a commit a plain member could spoil)", {
            let out = group.commit_builder().build().unwrap();
            group.clear_pending_commit();
            out.commit_message.to_bytes().unwrap()
        }),
        ("add a member", {
            let d = agent("dave");
            let kp = MlsMessage::from_bytes(&d.engine.generate_key_package().unwrap()).unwrap();
            let out = group.commit_builder().add_member(kp).unwrap().build().unwrap();
            group.clear_pending_commit();
            out.commit_message.to_bytes().unwrap()
        }),
    ];
    for (what, commit) in attempts {
        eprintln!("attempt: {what}"); // shown if it is not refused
        policy_error(tracked.process(&commit));
        for m in [&g[0], &g[1]] {
            policy_error(m.process(&commit));
        }
    }
    assert_eq!(tracked.snapshot().unwrap(), before);
    // The channel is not wedged: the owner still commits.
    let update = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    deliver(&update.commit, &mut tracked, &[&g[1], &g[2]]);
}

#[test]
fn an_update_key_members_cannot_encrypt_to_is_refused() {
    let cs = AwsLcCryptoProvider::default()
        .cipher_suite_provider(CipherSuite::CURVE25519_AES128)
        .unwrap();
    let (_, good) = cs.kem_generate().unwrap();
    let check = |key: &[u8]| _native::tracker::check_encryption_key(1, key, "the update's leaf key");
    check(good.as_ref()).unwrap();
    // Points of small order give an all-zero shared secret, which X25519 refuses.
    let mut one = [0u8; 32];
    one[0] = 1;
    for bad in [[0u8; 32], one] {
        let err = check(&bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("members cannot encrypt to the update's leaf key"),
            "{err}"
        );
    }
    assert!(check(b"short").is_err());
}

/// Proposals reach the owner's cache (and the relay's) and wait there for a commit.
fn proposed(p: &[u8], tracked: &mut TrackedGroup, members: &[&Arc<GroupHandle>]) {
    tracked.process(p).unwrap();
    for m in members {
        assert!(matches!(m.process(p).unwrap(), Received::Proposal { .. }));
    }
}

#[test]
fn the_update_of_a_member_that_leaves_stays_out_of_the_commit() {
    // mls-rs leaves it in when another member's update applies too, and every receiver
    // would refuse the commit (RFC 9420: no update of a removed leaf).
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    let (update_b, leave_b, update_c) = (
        g[1].propose_update().unwrap(),
        g[1].propose_leave().unwrap(),
        g[2].propose_update().unwrap(),
    );
    for p in [&update_b, &leave_b, &update_c] {
        proposed(p, &mut tracked, &[&g[0], &g[2]]);
    }
    let commit = g[0].self_update().unwrap();
    let info = g[0].apply_pending_commit().unwrap();
    assert_eq!(info.updated, vec![mid("carol")]);
    let Observed::Commit(event) = deliver(&commit.commit, &mut tracked, &[&g[2]]) else {
        panic!("expected a commit");
    };
    assert_eq!(event.left, vec![mid("bob")]);
}

#[test]
fn removing_a_member_whose_update_waits_leaves_the_update_out() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    for p in [g[1].propose_update().unwrap(), g[2].propose_update().unwrap()] {
        proposed(&p, &mut tracked, &[&g[0]]);
    }
    let removal = g[0].remove_members(&[mid("bob")]).unwrap();
    g[0].apply_pending_commit().unwrap();
    let Observed::Commit(event) = tracked.process(&removal.commit).unwrap() else {
        panic!("expected a commit");
    };
    assert_eq!(event.removed, vec![mid("bob")]);
}

#[test]
fn an_admin_with_its_own_leave_pending_commits_without_it() {
    // Its rules used to take its role away in that commit, in a change that mls-rs then
    // left out with the admin's own removal: the others could not process the commit.
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    make_bob_admin(&g, &mut tracked);
    let leave = g[1].propose_leave().unwrap();
    proposed(&leave, &mut tracked, &[&g[0], &g[2]]);
    let update = g[2].propose_update().unwrap();
    proposed(&update, &mut tracked, &[&g[0], &g[1]]);

    let commit = g[1].self_update().unwrap();
    g[1].apply_pending_commit().unwrap();
    let Observed::Commit(event) = deliver(&commit.commit, &mut tracked, &[&g[0], &g[2]]) else {
        panic!("expected a commit");
    };
    assert!(event.left.is_empty() && !event.roles_changed);
    assert_eq!(g[0].roles().unwrap().role(&mid("bob")), Role::Admin);
    // The owner commits bob's leave when he proposes again in the new epoch.
    let leave = g[1].propose_leave().unwrap();
    proposed(&leave, &mut tracked, &[&g[0], &g[2]]);
    let commit = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    let Observed::Commit(event) = deliver(&commit.commit, &mut tracked, &[&g[2]]) else {
        panic!("expected a commit");
    };
    assert_eq!(event.left, vec![mid("bob")]);
}

#[test]
fn an_update_whose_leaf_key_is_a_joiners_stays_out_of_the_commit() {
    // Join requests are in the channel's log, so a member can copy a joiner's leaf key
    // into its update (no private key needed); the add would then fail as a duplicate.
    use _native::policy::{check_update, key_package_leaf_key, update_leaf_key};
    use mls_rs::group::proposal::UpdateProposal;
    use mls_rs::group::Sender;
    use mls_rs_codec::{MlsDecode, MlsEncode};

    let joiner = agent("dave");
    let kp = MlsMessage::from_bytes(&joiner.engine.generate_key_package().unwrap())
        .unwrap()
        .into_key_package()
        .unwrap();
    // The key package's leaf node, read as an update (an update is its leaf node).
    let encoded = kp.mls_encode_to_vec().unwrap();
    let mut rest = &encoded[4..]; // version, cipher suite
    let init_key = Vec::<u8>::mls_decode(&mut rest).unwrap();
    assert_eq!(init_key, kp.hpke_init_key.as_ref());
    let copied = UpdateProposal::mls_decode(&mut rest).unwrap();
    let joiner_key = key_package_leaf_key(&kp).unwrap();
    assert_eq!(update_leaf_key(&copied).unwrap(), joiner_key);
    assert_ne!(joiner_key, init_key);

    let bob = Sender::Member(1);
    let err = check_update(&[], std::slice::from_ref(&joiner_key), &bob, &copied).unwrap_err();
    assert!(err.to_string().contains("a joiner's"), "{err}");
    let err = check_update(&[1], &[], &bob, &copied).unwrap_err();
    assert!(err.to_string().contains("removes"), "{err}");
    check_update(&[2], &[b"another key".to_vec()], &bob, &copied).unwrap();
}

#[test]
fn a_commit_carries_one_members_key_update_and_the_next_the_other() {
    // mls-rs cannot undo one of several updates that fail together (two members can make
    // theirs collide on purpose), so each commit carries one.
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let (g, mut tracked) = channel(&a, &b, &c);
    proposed(&g[1].propose_update().unwrap(), &mut tracked, &[&g[0], &g[2]]);
    proposed(&g[2].propose_update().unwrap(), &mut tracked, &[&g[0], &g[1]]);
    let commit = g[0].self_update().unwrap();
    let first = g[0].apply_pending_commit().unwrap().updated;
    assert_eq!(first.len(), 1);
    deliver(&commit.commit, &mut tracked, &[&g[1], &g[2]]);
    // The other proposes again in the new epoch; the next commit carries it.
    let (waiting, other) = if first == vec![mid("bob")] {
        (&g[2], &g[1])
    } else {
        (&g[1], &g[2])
    };
    proposed(&waiting.propose_update().unwrap(), &mut tracked, &[&g[0], other]);
    let commit = g[0].self_update().unwrap();
    let second = g[0].apply_pending_commit().unwrap().updated;
    assert_eq!(second.len(), 1);
    assert_ne!(first, second);
    deliver(&commit.commit, &mut tracked, &[&g[1], &g[2]]);
}

//! Post-quantum channels: groups of the hybrid ML-KEM-768+X25519 suite (65100) made by
//! agents whose own suite is 1, side by side with their suite-1 groups.

use _native::credential::TrustAnchors;
use _native::engine::PQ_CIPHER_SUITE;
use _native::tracker::{Observed, Tracker};
use _native::{inspect, Engine, EngineError, Received};
use tempfile::TempDir;

mod common;

struct Agent {
    _dir: TempDir,
    engine: Engine,
}

fn agent(name: &str, suite: Option<u16>) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::certified(&dir.path().join("data"), name.as_bytes(), suite);
    Agent { _dir: dir, engine }
}

fn tracker() -> Tracker {
    let t = Tracker::new();
    let i = common::issuer();
    t.set_trust_anchors(TrustAnchors::new([(i.kid.clone(), i.public.to_vec())]).unwrap());
    t
}

fn suite_of(message: &[u8]) -> Option<u16> {
    inspect(message).unwrap().cipher_suite
}

fn data(r: Received) -> Vec<u8> {
    match r {
        Received::Application { data, .. } => data,
        other => panic!("expected an application message, got {other:?}"),
    }
}

#[test]
fn a_pq_group_adds_talks_removes_and_the_tracker_follows_it() {
    let (a, b, c) = (agent("alice", None), agent("bob", None), agent("carol", None));
    assert_eq!(a.engine.channel_cipher_suites(), vec![1, PQ_CIPHER_SUITE]);
    let g = a.engine.create_group_with_suite(b"pq", Some(PQ_CIPHER_SUITE)).unwrap();
    assert_eq!(g.cipher_suite().unwrap(), PQ_CIPHER_SUITE);
    let info = g.group_info().unwrap();
    assert_eq!(suite_of(&info), Some(PQ_CIPHER_SUITE));
    let mut tracked = tracker().observe(&info).unwrap();
    assert_eq!(tracked.cipher_suite(), PQ_CIPHER_SUITE);

    let kps = [
        b.engine.generate_key_package_for(Some(PQ_CIPHER_SUITE)).unwrap(),
        c.engine.generate_key_package_for(Some(PQ_CIPHER_SUITE)).unwrap(),
    ];
    assert!(kps.iter().all(|kp| suite_of(kp) == Some(PQ_CIPHER_SUITE)));
    let pending = g.add_members(&kps).unwrap();
    let welcome = pending.welcome.clone().unwrap();
    assert_eq!(suite_of(&welcome), Some(PQ_CIPHER_SUITE));
    assert!(matches!(tracked.process(&pending.commit).unwrap(), Observed::Commit(_)));
    g.apply_pending_commit().unwrap();
    let gb = b.engine.join_group(&welcome).unwrap();
    let gc = c.engine.join_group(&welcome).unwrap();
    assert_eq!(gb.cipher_suite().unwrap(), PQ_CIPHER_SUITE);

    let ct = g.encrypt(b"to both", b"").unwrap();
    assert_eq!(data(gb.process(&ct).unwrap()), b"to both");
    assert_eq!(data(gc.process(&ct).unwrap()), b"to both");
    let ct = gb.encrypt(b"from bob", b"").unwrap();
    assert_eq!(data(g.process(&ct).unwrap()), b"from bob");

    // Removing carol takes a commit whose update path is encrypted to bob with X-Wing.
    let mut carol = b"test-account-01!".to_vec();
    carol.extend_from_slice(b"carol");
    let removal = g.remove_members(&[carol]).unwrap();
    assert!(matches!(tracked.process(&removal.commit).unwrap(), Observed::Commit(_)));
    g.apply_pending_commit().unwrap();
    assert!(matches!(gb.process(&removal.commit).unwrap(), Received::Commit(_)));
    match gc.process(&removal.commit).unwrap() {
        Received::Commit(info) => assert!(info.self_removed),
        other => panic!("expected carol's removal, got {other:?}"),
    }
    let ct = g.encrypt(b"after", b"").unwrap();
    assert_eq!(data(gb.process(&ct).unwrap()), b"after");
    assert_eq!(tracked.epoch(), g.epoch().unwrap());
}

#[test]
fn suite_one_is_unchanged_beside_pq() {
    let (a, b) = (agent("alice", None), agent("bob", None));
    let classic = a.engine.create_group(b"classic").unwrap();
    let pq = a.engine.create_group_with_suite(b"pq", Some(PQ_CIPHER_SUITE)).unwrap();
    assert_eq!(classic.cipher_suite().unwrap(), 1);
    let kp = b.engine.generate_key_package().unwrap();
    assert_eq!(suite_of(&kp), Some(1));
    // A suite-1 key package does not fit a post-quantum group, nor the other way round.
    assert!(matches!(
        pq.add_members(std::slice::from_ref(&kp)),
        Err(EngineError::KeyPackageSuite { got: 1, want: 65100 })
    ));
    let pq_kp = b.engine.generate_key_package_for(Some(PQ_CIPHER_SUITE)).unwrap();
    assert!(matches!(
        classic.add_members(&[pq_kp]),
        Err(EngineError::KeyPackageSuite { got: 65100, want: 1 })
    ));
    let pending = classic.add_members(&[kp]).unwrap();
    classic.apply_pending_commit().unwrap();
    let welcome = pending.welcome.unwrap();
    assert_eq!(suite_of(&welcome), Some(1));
    let gb = b.engine.join_group(&welcome).unwrap();
    assert_eq!(data(gb.process(&classic.encrypt(b"hi", b"").unwrap()).unwrap()), b"hi");
}

#[test]
fn a_p256_agent_cannot_use_the_pq_suite_and_bad_suites_are_refused() {
    let (a, p) = (agent("alice", None), agent("pam", Some(2)));
    assert_eq!(p.engine.channel_cipher_suites(), vec![2]);
    for e in [
        p.engine.generate_key_package_for(Some(PQ_CIPHER_SUITE)).unwrap_err(),
        p.engine
            .create_group_with_suite(b"g", Some(PQ_CIPHER_SUITE))
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(e.to_string().contains("needs an Ed25519 signature key"), "{e}");
    }
    // A Welcome to a post-quantum group names a suite this agent cannot use.
    let g = a.engine.create_group_with_suite(b"pq", Some(PQ_CIPHER_SUITE)).unwrap();
    let b = agent("bob", None);
    let pending = g
        .add_members(&[b.engine.generate_key_package_for(Some(PQ_CIPHER_SUITE)).unwrap()])
        .unwrap();
    let e = p.engine.join_group(&pending.welcome.unwrap()).map(|_| ()).unwrap_err();
    assert!(
        e.to_string()
            .contains("cipher suite 65100 is not one this agent can use"),
        "{e}"
    );

    for bad in [0u16, 2, 3, 65001, 65002, 65535] {
        let e = a
            .engine
            .create_group_with_suite(b"bad", Some(bad))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, EngineError::ChannelCipherSuite { got, .. } if got == i64::from(bad)),
            "{bad}: {e}"
        );
        assert!(a.engine.generate_key_package_for(Some(bad)).is_err());
    }
    assert!(a.engine.suite_arg(Some(70_000)).is_err());
    assert!(a.engine.suite_arg(Some(-1)).is_err());
    assert_eq!(a.engine.suite_arg(Some(65100)).unwrap(), Some(65100));
}

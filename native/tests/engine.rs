//! Engine behaviour through its public Rust API: membership changes, the delivery-service
//! commit flow, persistence and hostile input.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use _native::policy::Role;
use _native::{Engine, EngineError, GroupHandle, Received};
use tempfile::TempDir;

mod common;

struct Agent {
    _dir: TempDir,
    engine: Engine,
}

fn agent(name: &str) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::certified(&dir.path().join("data"), name.as_bytes(), None);
    Agent { _dir: dir, engine }
}

/// `creator` makes a group and adds each of `others`; returns every member's handle.
fn group_of(creator: &Agent, others: &[&Agent]) -> Vec<Arc<GroupHandle>> {
    let g = creator.engine.create_group(b"org/ns/svc").unwrap();
    let mut handles = vec![g.clone()];
    for other in others {
        let kp = other.engine.generate_key_package().unwrap();
        let pending = g.add_members(&[kp]).unwrap();
        g.apply_pending_commit().unwrap();
        for h in &handles[1..] {
            assert!(matches!(h.process(&pending.commit).unwrap(), Received::Commit(_)));
        }
        handles.push(other.engine.join_group(&pending.welcome.unwrap()).unwrap());
    }
    handles
}

/// How groups name a test agent: the test account, then the identity.
fn mid(name: &str) -> Vec<u8> {
    [common::ACCOUNT.as_slice(), name.as_bytes()].concat()
}

fn app_data(r: Received) -> (Vec<u8>, Vec<u8>) {
    match r {
        Received::Application { sender, data, .. } => (sender, data),
        other => panic!("expected application message, got {other:?}"),
    }
}

#[test]
fn two_members_exchange_both_ways() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    let ct = g[0].encrypt(b"hi bob", b"").unwrap();
    assert_eq!(app_data(g[1].process(&ct).unwrap()), (mid("alice"), b"hi bob".to_vec()));
    let ct = g[1].encrypt(b"hi alice", b"").unwrap();
    assert_eq!(app_data(g[0].process(&ct).unwrap()), (mid("bob"), b"hi alice".to_vec()));
    assert_eq!(g[0].epoch().unwrap(), g[1].epoch().unwrap());
    let ids: Vec<_> = g[1].members().unwrap().into_iter().map(|(_, id)| id).collect();
    assert_eq!(ids, vec![mid("alice"), mid("bob")]);
}

#[test]
fn three_members_all_decrypt() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b, &c]);
    let ct = g[2].encrypt(b"from carol", b"").unwrap();
    assert_eq!(app_data(g[0].process(&ct).unwrap()).1, b"from carol");
    assert_eq!(app_data(g[1].process(&ct).unwrap()).1, b"from carol");
    assert_eq!(g[0].members().unwrap().len(), 3);
}

#[test]
fn removed_member_cannot_decrypt_and_forgets_group() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b, &c]);
    let pending = g[0].remove_members(&[mid("bob")]).unwrap();
    let info = g[0].apply_pending_commit().unwrap();
    assert_eq!(info.removed, vec![mid("bob")]);
    match g[1].process(&pending.commit).unwrap() {
        Received::Commit(c) => assert!(c.self_removed),
        other => panic!("unexpected {other:?}"),
    }
    g[2].process(&pending.commit).unwrap();
    let ct = g[0].encrypt(b"secret after removal", b"").unwrap();
    assert!(matches!(g[1].process(&ct), Err(EngineError::Removed)));
    assert!(b.engine.group_ids().unwrap().is_empty());
    assert_eq!(app_data(g[2].process(&ct).unwrap()).1, b"secret after removal");
}

/// Makes `name` an admin of the group of `g` (alice, the owner, at index 0).
fn promote(g: &[Arc<GroupHandle>], name: &str) {
    let pending = g[0].set_role(&mid(name), Role::Admin).unwrap();
    g[0].apply_pending_commit().unwrap();
    for other in &g[1..] {
        other.process(&pending.commit).unwrap();
    }
}

#[test]
fn self_update_advances_epoch_for_everyone() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    let before = g[0].epoch().unwrap();
    let pending = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    g[1].process(&pending.commit).unwrap();
    assert_eq!(g[1].epoch().unwrap(), before + 1);
    let ct = g[1].encrypt(b"new epoch", b"").unwrap();
    assert_eq!(app_data(g[0].process(&ct).unwrap()).1, b"new epoch");
}

#[test]
fn a_plain_member_does_not_commit() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    assert!(matches!(g[1].self_update(), Err(EngineError::Policy { .. })));
    assert!(!g[1].has_pending_commit().unwrap());
}

#[test]
fn a_members_update_proposal_is_committed_by_the_owner() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b, &c]);
    let before = g[0].epoch().unwrap();
    let proposal = g[1].propose_update().unwrap();
    for other in [&g[0], &g[2]] {
        assert!(matches!(other.process(&proposal).unwrap(), Received::Proposal { .. }));
    }
    let commit = g[0].self_update().unwrap();
    let info = g[0].apply_pending_commit().unwrap();
    assert_eq!(info.updated, vec![mid("bob")]);
    for other in [&g[1], &g[2]] {
        match other.process(&commit.commit).unwrap() {
            Received::Commit(c) => assert_eq!(c.updated, vec![mid("bob")]),
            r => panic!("unexpected {r:?}"),
        }
    }
    assert_eq!(g[1].epoch().unwrap(), before + 1);
    let ct = g[1].encrypt(b"with fresh keys", b"").unwrap();
    assert_eq!(app_data(g[0].process(&ct).unwrap()).1, b"with fresh keys");
    assert_eq!(app_data(g[2].process(&ct).unwrap()).1, b"with fresh keys");
}

#[test]
fn concurrent_commits_resolved_by_delivery_service() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b]);
    promote(&g, "bob");
    // Both admins commit in the same epoch; the delivery service accepts alice's.
    let kp = c.engine.generate_key_package().unwrap();
    let alice_commit = g[0].add_members(&[kp]).unwrap();
    let bob_commit = g[1].self_update().unwrap();
    assert_eq!(alice_commit.epoch, bob_commit.epoch);
    g[0].apply_pending_commit().unwrap();
    // Bob's commit is rejected: he clears it, processes the winner, and rebuilds.
    g[1].clear_pending_commit().unwrap();
    g[1].process(&alice_commit.commit).unwrap();
    let carol = c.engine.join_group(&alice_commit.welcome.unwrap()).unwrap();
    let retry = g[1].self_update().unwrap();
    g[1].apply_pending_commit().unwrap();
    g[0].process(&retry.commit).unwrap();
    carol.process(&retry.commit).unwrap();
    let epochs: Vec<_> = [&g[0], &g[1], &carol].iter().map(|h| h.epoch().unwrap()).collect();
    assert!(epochs.windows(2).all(|w| w[0] == w[1]), "{epochs:?}");
    let ct = carol.encrypt(b"all in sync", b"").unwrap();
    assert_eq!(app_data(g[0].process(&ct).unwrap()).1, b"all in sync");
    assert_eq!(app_data(g[1].process(&ct).unwrap()).1, b"all in sync");
}

#[test]
fn losing_commit_cannot_be_processed_by_others() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    promote(&g, "bob");
    let loser = g[1].self_update().unwrap();
    let winner = g[0].self_update().unwrap();
    g[0].apply_pending_commit().unwrap();
    g[1].clear_pending_commit().unwrap();
    g[1].process(&winner.commit).unwrap();
    assert!(matches!(
        g[0].process(&loser.commit),
        Err(EngineError::WrongEpoch { .. })
    ));
}

#[test]
fn pending_commit_blocks_a_second_commit() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    g[0].self_update().unwrap();
    assert!(matches!(g[0].self_update(), Err(EngineError::CommitPending(_))));
    g[0].clear_pending_commit().unwrap();
    assert!(matches!(g[0].clear_pending_commit(), Err(EngineError::NoPendingCommit)));
}

#[test]
fn state_survives_reopen() {
    let dir_a = tempfile::tempdir().unwrap();
    let b = agent("bob");
    let (commit_epoch, welcome) = {
        let a = common::certified(dir_a.path(), b"alice", None);
        let g = a.create_group(b"g1").unwrap();
        let p = g.add_members(&[b.engine.generate_key_package().unwrap()]).unwrap();
        g.apply_pending_commit().unwrap();
        (g.epoch().unwrap(), p.welcome.unwrap())
    };
    let bob = b.engine.join_group(&welcome).unwrap();
    let a = common::certified(dir_a.path(), b"alice", None);
    assert_eq!(a.group_ids().unwrap(), vec![b"g1".to_vec()]);
    let g = a.group(b"g1").unwrap();
    assert_eq!(g.epoch().unwrap(), commit_epoch);
    let ct = g.encrypt(b"after restart", b"").unwrap();
    assert_eq!(app_data(bob.process(&ct).unwrap()).1, b"after restart");
}

#[test]
fn welcome_for_key_package_made_before_restart() {
    let dir_b = tempfile::tempdir().unwrap();
    let kp = common::certified(dir_b.path(), b"bob", None)
        .generate_key_package()
        .unwrap();
    let a = agent("alice");
    let g = a.engine.create_group(b"g").unwrap();
    let p = g.add_members(&[kp]).unwrap();
    g.apply_pending_commit().unwrap();
    let bob = common::certified(dir_b.path(), b"bob", None);
    let gb = bob.join_group(&p.welcome.unwrap()).unwrap();
    assert_eq!(gb.epoch().unwrap(), g.epoch().unwrap());
}

#[test]
fn data_dir_is_private_and_bound_to_identity() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("agent");
    common::certified(&data, b"alice", None);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for entry in std::fs::read_dir(&data).unwrap() {
        assert_eq!(
            mode(&entry.unwrap().path()) & 0o077,
            0,
            "group/other bits on a store file"
        );
    }
    assert!(matches!(
        Engine::open(&data, b"mallory", None),
        Err(EngineError::IdentityMismatch { .. })
    ));
    assert!(matches!(
        Engine::open(&data, b"alice", Some(2)),
        Err(EngineError::CipherSuiteMismatch { .. })
    ));
    assert!(matches!(
        Engine::open(&data, b"", None),
        Err(EngineError::BadIdentity { .. })
    ));
    assert!(matches!(
        Engine::open(&data, b"alice", Some(9)),
        Err(EngineError::UnsupportedCipherSuite(9))
    ));
}

fn set_mode(p: &std::path::Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Gives `p` to another user; false where this process may not (not root).
fn give_away(p: &std::path::Path) -> bool {
    std::os::unix::fs::chown(p, Some(65534), None).is_ok()
}

fn refused(result: Result<Engine, EngineError>, needle: &str) {
    match result {
        Err(EngineError::DataDir { detail, .. }) => assert!(detail.contains(needle), "{detail}"),
        Err(other) => panic!("expected a data_dir refusal containing {needle:?}, got {other}"),
        Ok(_) => panic!("expected a data_dir refusal containing {needle:?}, got an engine"),
    }
}

#[test]
fn one_process_at_a_time_per_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::certified(dir.path(), b"alice", None);
    match Engine::open(dir.path(), b"alice", None) {
        Err(e @ EngineError::DataDirInUse { .. }) => {
            assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}")
        }
        Err(other) => panic!("expected DataDirInUse, got {other}"),
        Ok(_) => panic!("a second engine opened a data_dir in use"),
    }
    first.close();
    let second = common::certified(dir.path(), b"alice", None);
    drop(second); // dropping releases it too
    common::certified(dir.path(), b"alice", None);
}

#[test]
fn a_closed_engine_writes_nothing_more_to_its_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::certified(dir.path(), b"alice", None);
    let group = first.create_group(b"org/ns/svc").unwrap();
    let sent = group.encrypt(b"before", b"").unwrap();
    first.close();
    // Another engine may own the data_dir now: the group handed out before, the
    // engine's group calls, all refuse instead of writing a ratchet state of their own.
    let second = common::certified(dir.path(), b"alice", None);
    let closed = |r: Result<_, EngineError>| matches!(r, Err(EngineError::Closed));
    assert!(closed(group.encrypt(b"after", b"").map(drop)));
    assert!(closed(
        group
            .encrypt_queued(&[(1, b"id".as_slice(), b"after".as_slice())])
            .map(drop)
    ));
    assert!(closed(group.epoch().map(drop)));
    assert!(closed(group.save()));
    assert!(group
        .process_batch(&[sent.as_slice()], true)
        .into_iter()
        .all(|r| closed(r.map(drop))));
    assert!(closed(first.group(b"org/ns/svc").map(drop)));
    assert!(closed(first.create_group(b"org/ns/other").map(drop)));
    assert!(closed(first.delete_group(b"org/ns/svc")));
    let again = second.group(b"org/ns/svc").unwrap();
    assert_eq!(again.epoch().unwrap(), 0);
    again.encrypt(b"from the second engine", b"").unwrap();
}

#[test]
fn a_closed_engine_holds_no_file_of_its_data_dir_open() {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::certified(dir.path(), b"alice", None);
    let group = engine.create_group(b"org/ns/svc").unwrap();
    group.encrypt(b"before", b"").unwrap();
    assert!(open_files_under(dir.path()) > 0);
    engine.close();
    // Both still alive (a caller may keep them for a while): neither keeps a connection
    // or the checkpoint thread's, nor the identity's.
    assert_eq!(open_files_under(dir.path()), 0);
    assert!(matches!(engine.group_ids(), Err(EngineError::Closed)));
    assert!(matches!(engine.generate_key_package(), Err(EngineError::Closed)));
    drop(group);
}

/// How many of this process's open files are in `dir`.
fn open_files_under(dir: &Path) -> usize {
    let dir = dir.canonicalize().unwrap(); // as the kernel names open files
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|path| path.starts_with(&dir))
        .count()
}

#[test]
fn data_dir_readable_by_others_is_refused_unless_empty() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    set_mode(&empty, 0o755);
    common::certified(&empty, b"alice", None);
    assert_eq!(std::fs::metadata(&empty).unwrap().permissions().mode() & 0o777, 0o700);

    set_mode(&empty, 0o750);
    refused(Engine::open(&empty, b"alice", None), "chmod 700");
    set_mode(&empty, 0o700);
    let db = empty.join("mls.sqlite3");
    set_mode(&db, 0o644);
    refused(
        Engine::open(&empty, b"alice", None),
        "mls.sqlite3 in it is readable by other users",
    );
    set_mode(&db, 0o600);
    common::certified(&empty, b"alice", None);

    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    refused(Engine::open(&file, b"alice", None), "not a directory");
}

#[test]
fn data_dir_of_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    set_mode(&theirs, 0o700);
    if !give_away(&theirs) {
        eprintln!("skipped: only root can hand a directory to another user");
        return;
    }
    refused(Engine::open(&theirs, b"alice", None), "owned by uid 65534");
    assert_eq!(
        std::fs::read_dir(&theirs).unwrap().count(),
        0,
        "nothing written into it"
    );

    // A private directory of ours with a planted file another user owns.
    let ours = dir.path().join("ours");
    common::certified(&ours, b"alice", None);
    let planted = ours.join("client.sqlite3");
    std::fs::write(&planted, b"").unwrap();
    set_mode(&planted, 0o600);
    assert!(give_away(&planted));
    refused(
        Engine::open(&ours, b"alice", None),
        "client.sqlite3 in it is owned by uid 65534",
    );
}

#[test]
fn bad_input_is_a_clear_error_and_changes_nothing() {
    let (a, b, m) = (agent("alice"), agent("bob"), agent("mallory"));
    let g = group_of(&a, &[&b]);
    let ct = g[0].encrypt(b"one", b"").unwrap();
    let epoch = g[1].epoch().unwrap();

    assert!(matches!(g[1].process(b""), Err(EngineError::Malformed { .. })));
    assert!(matches!(g[1].process(&[0xff; 64]), Err(EngineError::Malformed { .. })));
    assert!(matches!(
        g[1].process(&ct[..ct.len() / 2]),
        Err(EngineError::Malformed { .. })
    ));
    let mut flipped = ct.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert!(g[1].process(&flipped).is_err());
    // A key package is not a group message.
    let kp = m.engine.generate_key_package().unwrap();
    assert!(matches!(g[1].process(&kp), Err(EngineError::WrongKind { .. })));
    // The genuine message still decrypts after all of that, exactly once.
    assert_eq!(app_data(g[1].process(&ct).unwrap()).1, b"one");
    assert!(g[1].process(&ct).is_err(), "replay must fail");
    assert_eq!(g[1].epoch().unwrap(), epoch);
    let ct2 = g[0].encrypt(b"two", b"").unwrap();
    assert_eq!(app_data(g[1].process(&ct2).unwrap()).1, b"two");
}

#[test]
fn foreign_group_and_own_messages_rejected() {
    let (a, b, m) = (agent("alice"), agent("bob"), agent("mallory"));
    let g = group_of(&a, &[&b]);
    let other = m.engine.create_group(b"elsewhere").unwrap();
    let foreign = other.encrypt(b"x", b"").unwrap();
    assert!(matches!(g[1].process(&foreign), Err(EngineError::WrongGroup { .. })));
    // A non-member forging a message for this group id is rejected too.
    let fake = m.engine.create_group(b"org/ns/svc").unwrap();
    let forged = fake.encrypt(b"forged", b"").unwrap();
    assert!(g[1].process(&forged).is_err());
    let own = g[0].encrypt(b"mine", b"").unwrap();
    assert!(g[0].process(&own).is_err());
}

#[test]
fn key_package_errors() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = a.engine.create_group(b"g").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p256 = common::certified(dir.path(), b"carol", Some(2));
    let other_suite = p256.generate_key_package().unwrap();
    assert!(matches!(
        g.add_members(&[other_suite]),
        Err(EngineError::KeyPackageSuite { got: 2, want: 1 })
    ));
    assert!(matches!(
        g.add_members(&[vec![1, 2, 3]]),
        Err(EngineError::Malformed { .. })
    ));
    assert!(matches!(g.add_members(&[]), Err(EngineError::Malformed { .. })));
    let kp = b.engine.generate_key_package().unwrap();
    assert!(g.add_members(&[kp.clone(), kp]).is_err(), "same identity twice");
    assert!(!g.has_pending_commit().unwrap());
    assert_eq!(g.epoch().unwrap(), 0);
}

#[test]
fn welcome_for_someone_else_is_rejected() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = a.engine.create_group(b"g").unwrap();
    let p = g.add_members(&[b.engine.generate_key_package().unwrap()]).unwrap();
    let welcome = p.welcome.unwrap();
    assert!(matches!(
        c.engine.join_group(&welcome),
        Err(EngineError::WelcomeNotForUs)
    ));
    assert!(matches!(
        c.engine.join_group(b"nonsense"),
        Err(EngineError::Malformed { .. })
    ));
    assert!(c.engine.group_ids().unwrap().is_empty());
    // Bob can still use it, once.
    b.engine.join_group(&welcome).unwrap();
    assert!(b.engine.join_group(&welcome).is_err());
}

#[test]
fn inspect_reads_public_framing() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    let ct = g[0].encrypt(b"x", b"").unwrap();
    let info = _native::inspect(&ct).unwrap();
    assert_eq!(info.wire_format, "private_message");
    assert_eq!(info.content_type, Some("application"));
    assert_eq!(info.group_id.as_deref(), Some(&b"org/ns/svc"[..]));
    assert_eq!(info.epoch, Some(g[0].epoch().unwrap()));
    let commit = g[0].self_update().unwrap();
    assert_eq!(_native::inspect(&commit.commit).unwrap().content_type, Some("commit"));
    assert!(_native::inspect(b"\x00").is_err());
}

#[test]
fn one_group_from_many_threads() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    let sender = g[0].clone();
    let cts: Vec<Vec<u8>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let sender = sender.clone();
                s.spawn(move || {
                    (0..25)
                        .map(|i| sender.encrypt(format!("{t}-{i}").as_bytes(), b"").unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let mut got: Vec<_> = cts.iter().map(|ct| app_data(g[1].process(ct).unwrap()).1).collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 100);
}

#[test]
fn trailing_bytes_are_rejected() {
    let (a, b) = (agent("alice"), agent("bob"));
    let g = group_of(&a, &[&b]);
    let mut ct = g[0].encrypt(b"x", b"").unwrap();
    ct.push(0);
    assert!(matches!(g[1].process(&ct), Err(EngineError::Malformed { .. })));
    assert!(_native::inspect(&ct).is_err());
    ct.pop();
    assert_eq!(app_data(g[1].process(&ct).unwrap()).1, b"x");
}

/// A copy of `dir` as a restarted process would find it (SQLite's WAL included).
fn snapshot(dir: &std::path::Path) -> TempDir {
    let copy = tempfile::tempdir().unwrap();
    set_mode(copy.path(), 0o700); // a data_dir keeps its mode
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
    }
    copy
}

/// Alice's group with Bob, whose engine lives in `dir_b` (so a test can reopen it), and
/// three messages from Alice.
fn alice_and_bob(dir_b: &std::path::Path) -> (Agent, Arc<GroupHandle>, Arc<GroupHandle>, Vec<Vec<u8>>) {
    let a = agent("alice");
    let bob = common::certified(dir_b, b"bob", None);
    let g = a.engine.create_group(b"g").unwrap();
    let p = g.add_members(&[bob.generate_key_package().unwrap()]).unwrap();
    g.apply_pending_commit().unwrap();
    let gb = bob.join_group(&p.welcome.unwrap()).unwrap();
    let cts = g.encrypt_batch(&[b"m0", b"m1", b"m2"], b"").unwrap();
    (a, g, gb, cts)
}

/// The ciphertext with its authentication tag broken: it parses, then fails to decrypt.
fn tampered(ct: &[u8]) -> Vec<u8> {
    let mut bad = ct.to_vec();
    let n = bad.len();
    bad[n - 3] ^= 0xff;
    bad
}

#[test]
fn unsaved_processing_reaches_disk_only_on_save() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, g, gb, cts) = alice_and_bob(dir_b.path());
    let (bad1, bad2) = (tampered(&cts[1]), tampered(&cts[2]));
    // Two failures in one unsaved batch: each rolls back to the stored state and replays
    // every good message before it, not only those since the last failure.
    let results = gb.process_batch(&[&cts[0], &bad1, &cts[1], &bad2, &cts[2]], false);
    let ok: Vec<bool> = results.iter().map(|r| r.is_ok()).collect();
    assert_eq!(ok, vec![true, false, true, false, true]);
    // On disk nothing moved yet: a process that crashed now decrypts them again.
    let crashed = snapshot(dir_b.path());
    let before = common::certified(crashed.path(), b"bob", None).group(b"g").unwrap();
    for (ct, text) in cts.iter().zip([b"m0", b"m1", b"m2"]) {
        assert_eq!(app_data(before.process(ct).unwrap()).1, text);
    }
    gb.save().unwrap();
    assert!(gb.process(&cts[0]).is_err(), "the keys are used");
    let saved = snapshot(dir_b.path());
    let after = common::certified(saved.path(), b"bob", None).group(b"g").unwrap();
    for ct in &cts {
        assert!(after.process(ct).is_err(), "saved: consumed keys stay consumed");
    }
    // Any other change writes unsaved processing first (here an encrypt).
    let more = g.encrypt_batch(&[b"m3"], b"").unwrap();
    assert!(gb.process_batch(&[&more[0]], false)[0].is_ok());
    gb.encrypt(b"reply", b"").unwrap();
    let written = snapshot(dir_b.path());
    let later = common::certified(written.path(), b"bob", None).group(b"g").unwrap();
    assert!(later.process(&more[0]).is_err());
}

#[test]
fn batch_keeps_good_messages_around_a_bad_one() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, g, gb, cts) = alice_and_bob(dir_b.path());
    let bad = tampered(&cts[1]);
    let results = gb.process_batch(&[&cts[0], &bad, &cts[1], &cts[2], b"junk"], true);
    let got: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|x| app_data(x.clone()).1))
        .collect();
    assert_eq!(
        got,
        vec![
            Some(b"m0".to_vec()),
            None,
            Some(b"m1".to_vec()),
            Some(b"m2".to_vec()),
            None
        ]
    );
    // The good messages were persisted: a fresh process cannot decrypt them a second time.
    drop(gb);
    let bob = common::certified(dir_b.path(), b"bob", None);
    let gb = bob.group(b"g").unwrap();
    for ct in &cts {
        assert!(
            gb.process(ct).is_err(),
            "consumed keys must stay consumed after restart"
        );
    }
    assert_eq!(app_data(gb.process(&g.encrypt(b"m3", b"").unwrap()).unwrap()).1, b"m3");
}

#[test]
fn batch_with_commit_and_removal() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b, &c]);
    let before = g[0].encrypt(b"before", b"").unwrap();
    let removal = g[0].remove_members(&[mid("bob")]).unwrap();
    g[0].apply_pending_commit().unwrap();
    let after = g[0].encrypt(b"after", b"").unwrap();
    let results = g[1].process_batch(&[&before, &removal.commit, &after], true);
    assert_eq!(app_data(results[0].as_ref().unwrap().clone()).1, b"before");
    assert!(matches!(results[1], Ok(Received::Commit(ref c)) if c.self_removed));
    assert!(matches!(results[2], Err(EngineError::Removed)));
    assert!(b.engine.group_ids().unwrap().is_empty());
    let results = g[2].process_batch(&[&before, &removal.commit, &after], true);
    assert!(results.iter().all(|r| r.is_ok()));
}

#[test]
fn leave_proposal_committed_by_another_member_removes_the_leaver() {
    let (a, b, c) = (agent("alice"), agent("bob"), agent("carol"));
    let g = group_of(&a, &[&b, &c]);
    let proposal = g[2].propose_leave().unwrap();
    assert_eq!(_native::inspect(&proposal).unwrap().content_type, Some("proposal"));
    assert!(matches!(g[0].process(&proposal).unwrap(), Received::Proposal { .. }));
    assert!(matches!(g[1].process(&proposal).unwrap(), Received::Proposal { .. }));
    // Any commit by a member carries the proposal along.
    let commit = g[0].self_update().unwrap();
    let info = g[0].apply_pending_commit().unwrap();
    assert_eq!(info.removed, vec![mid("carol")]);
    g[1].process(&commit.commit).unwrap();
    match g[2].process(&commit.commit).unwrap() {
        Received::Commit(info) => assert!(info.self_removed),
        other => panic!("expected a commit, got {other:?}"),
    }
    assert_eq!(g[0].members().unwrap().len(), 2);
    assert!(c.engine.group_ids().unwrap().is_empty());
}

#[test]
fn inspect_names_the_identity_of_a_key_package() {
    let a = agent("alice");
    let kp = a.engine.generate_key_package().unwrap();
    let info = _native::inspect(&kp).unwrap();
    assert_eq!(info.wire_format, "key_package");
    let kp_info = info.key_package.expect("key package details");
    assert_eq!(kp_info.credential_type, _native::credential::SVC_CREDENTIAL_TYPE);
    let cred = _native::credential::AgentCredential::from_bytes(&kp_info.credential).unwrap();
    assert_eq!(cred.content.identity, b"alice");
    assert_eq!(cred.content.account, common::ACCOUNT);
    assert_eq!(kp_info.signature_key, a.engine.signature_key());
}

// -- agent credentials in the engine ------------------------------------------------------

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A credential for `engine` with explicit fields, signed by `issuer`.
fn credential(
    issuer: &common::Issuer,
    engine: &Engine,
    account: [u8; 16],
    identity: &[u8],
    key: &[u8],
    validity: (u64, u64),
) -> Vec<u8> {
    issuer
        .credential(_native::credential::AgentCredentialContent {
            issuer: issuer.kid.as_bytes().to_vec(),
            account: account.to_vec(),
            identity: identity.to_vec(),
            cipher_suite: engine.cipher_suite(),
            signature_key: key.to_vec(),
            not_before: validity.0,
            not_after: validity.1,
        })
        .to_bytes()
        .unwrap()
}

fn bare(name: &str) -> (TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("data"), name.as_bytes(), None).unwrap();
    (dir, engine)
}

fn trust_test_issuer(engine: &Engine) {
    let i = common::issuer();
    engine
        .set_trust_anchors(vec![(i.kid.clone(), i.public.to_vec())])
        .unwrap();
}

#[test]
fn nothing_is_made_without_anchors_and_a_credential() {
    let (_d, e) = bare("alice");
    assert!(matches!(e.generate_key_package(), Err(EngineError::NoCredential)));
    assert!(matches!(e.create_group(b"g"), Err(EngineError::NoCredential)));
    assert!(matches!(
        e.install_credential(&common::credential_for(&e, common::ACCOUNT)),
        Err(EngineError::NoTrustAnchors)
    ));
    trust_test_issuer(&e);
    e.install_credential(&common::credential_for(&e, common::ACCOUNT))
        .unwrap();
    assert_eq!(e.member_id().unwrap(), mid("alice"));
    e.generate_key_package().unwrap();
}

#[test]
fn install_credential_refuses_what_is_not_ours_and_keeps_the_old_one() {
    let (_d, e) = bare("alice");
    trust_test_issuer(&e);
    let key = e.signature_key().to_vec();
    let t = now();
    let good = (t - 10, t + 3600);
    let i = common::issuer();
    let foreign = common::Issuer::new("test-issuer"); // same kid, other key
    let (_d2, other) = bare("bob");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            credential(&foreign, &e, common::ACCOUNT, b"alice", &key, good),
            "signature check failed",
        ),
        (
            credential(i, &e, common::ACCOUNT, b"alice", other.signature_key(), good),
            "key substitution",
        ),
        (
            credential(i, &e, common::ACCOUNT, b"mallory", &key, good),
            "identity \"mallory\"",
        ),
        (
            credential(i, &e, common::ACCOUNT, b"alice", &key, (t - 100, t - 50)),
            "expired",
        ),
        (
            credential(i, &e, common::ACCOUNT, b"alice", &key, (t + 10_000, t + 20_000)),
            "not valid before",
        ),
        (b"garbage".to_vec(), "malformed agent credential"),
    ];
    for (bytes, want) in &cases {
        let err = e.install_credential(bytes).unwrap_err().to_string();
        assert!(err.contains(want), "{want:?} not in {err:?}");
        assert!(e.credential().is_none());
    }
    e.install_credential(&common::credential_for(&e, common::ACCOUNT))
        .unwrap();
    // A renewal cannot move the agent to another account.
    let err = e
        .install_credential(&credential(i, &e, *b"another-account!", b"alice", &key, good))
        .unwrap_err();
    assert!(
        matches!(err, EngineError::NotOurCredential { what: "account", .. }),
        "{err}"
    );
    assert_eq!(e.member_id().unwrap(), mid("alice"));
}

#[test]
fn an_expired_own_credential_blocks_commits_until_renewed_and_the_renewal_reaches_members() {
    let (_da, a) = bare("alice");
    trust_test_issuer(&a);
    let key = a.signature_key().to_vec();
    let t = now();
    // Valid for two seconds: long enough to create the group and add bob.
    a.install_credential(&credential(
        common::issuer(),
        &a,
        common::ACCOUNT,
        b"alice",
        &key,
        (t - 10, t + 2),
    ))
    .unwrap();
    let b = agent("bob");
    let g = a.create_group(b"renew").unwrap();
    let p = g.add_members(&[b.engine.generate_key_package().unwrap()]).unwrap();
    g.apply_pending_commit().unwrap();
    let gb = b.engine.join_group(&p.welcome.unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3100));

    let err = g.self_update().unwrap_err();
    assert!(
        matches!(&err, EngineError::OwnCredential(inner) if matches!(**inner, EngineError::CredentialExpired { .. })),
        "{err}"
    );
    assert!(matches!(a.generate_key_package(), Err(EngineError::OwnCredential(_))));
    assert!(!g.has_pending_commit().unwrap());

    // Renewed: the next commit carries the new credential, and bob accepts it.
    let renewed = credential(
        common::issuer(),
        &a,
        common::ACCOUNT,
        b"alice",
        &key,
        (now() - 10, now() + 3600),
    );
    a.install_credential(&renewed).unwrap();
    let update = g.self_update().unwrap();
    g.apply_pending_commit().unwrap();
    assert!(matches!(gb.process(&update.commit).unwrap(), Received::Commit(_)));
    assert_eq!(
        gb.members().unwrap().iter().map(|(_, m)| m.clone()).collect::<Vec<_>>(),
        vec![mid("alice"), mid("bob")]
    );
    let ct = g.encrypt(b"after renewal", b"").unwrap();
    assert_eq!(
        app_data(gb.process(&ct).unwrap()),
        (mid("alice"), b"after renewal".to_vec())
    );

    // A stale leaf is renewed by any commit, not only self_update: bob's credential in the
    // group is his first one; after reinstalling, his removal-free add moves it too.
    let promote = g.set_role(&mid("bob"), Role::Admin).unwrap();
    g.apply_pending_commit().unwrap();
    assert!(matches!(gb.process(&promote.commit).unwrap(), Received::Commit(_)));
    b.engine
        .install_credential(&common::credential_for(&b.engine, common::ACCOUNT))
        .unwrap();
    let c = agent("carol");
    let add = gb.add_members(&[c.engine.generate_key_package().unwrap()]).unwrap();
    gb.apply_pending_commit().unwrap();
    assert!(matches!(g.process(&add.commit).unwrap(), Received::Commit(_)));
    c.engine.join_group(&add.welcome.unwrap()).unwrap();
}

#[test]
fn a_group_holding_an_expired_leaf_stays_joinable() {
    let a = agent("alice");
    let (_dc, c) = bare("carol");
    trust_test_issuer(&c);
    let key = c.signature_key().to_vec();
    let t = now();
    c.install_credential(&credential(
        common::issuer(),
        &c,
        common::ACCOUNT,
        b"carol",
        &key,
        (t - 10, t + 2),
    ))
    .unwrap();
    let g = a.engine.create_group(b"lapsed").unwrap();
    let p = g.add_members(&[c.generate_key_package().unwrap()]).unwrap();
    g.apply_pending_commit().unwrap();
    c.join_group(&p.welcome.unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3100));
    // Carol's credential has lapsed (she is offline); alice adds dave, who joins.
    let d = agent("dave");
    let p = g.add_members(&[d.engine.generate_key_package().unwrap()]).unwrap();
    g.apply_pending_commit().unwrap();
    let gd = d.engine.join_group(&p.welcome.unwrap()).unwrap();
    assert_eq!(gd.members().unwrap().len(), 3);
}

#[test]
fn key_packages_from_a_foreign_issuer_or_expired_are_refused_at_add() {
    let a = agent("alice");
    let g = a.engine.create_group(b"strict").unwrap();
    // Mallory trusts her own issuer and holds a credential from it.
    let (_dm, m) = bare("mallory");
    let rogue = common::Issuer::new("rogue");
    m.set_trust_anchors(vec![(rogue.kid.clone(), rogue.public.to_vec())])
        .unwrap();
    let t = now();
    let key = m.signature_key().to_vec();
    m.install_credential(&credential(
        &rogue,
        &m,
        common::ACCOUNT,
        b"mallory",
        &key,
        (t - 10, t + 3600),
    ))
    .unwrap();
    let err = g
        .add_members(&[m.generate_key_package().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown key \"rogue\""), "{err}");
    // A key package made while its credential was valid, offered after it expired.
    let (_de, e) = bare("erin");
    trust_test_issuer(&e);
    let key = e.signature_key().to_vec();
    e.install_credential(&credential(
        common::issuer(),
        &e,
        common::ACCOUNT,
        b"erin",
        &key,
        (t - 10, t + 2),
    ))
    .unwrap();
    let kp = e.generate_key_package().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3100));
    let err = g.add_members(&[kp]).unwrap_err().to_string();
    assert!(err.contains("expired"), "{err}");
    assert_eq!(g.epoch().unwrap(), 0);
    assert!(!g.has_pending_commit().unwrap());
}

/// A forger's client: accepts every credential, so it builds trees an honest member would
/// refuse. Its own credential is a real one from the test issuer.
fn forger_client(name: &str) -> mls_rs::Client<impl mls_rs::client_builder::MlsConfig> {
    use mls_rs::mls_rules::{CommitOptions, DefaultMlsRules};
    use mls_rs::CryptoProvider;
    let (secret, public) = mls_rs_crypto_awslc::AwsLcCryptoProvider::default()
        .cipher_suite_provider(mls_rs::CipherSuite::CURVE25519_AES128)
        .unwrap()
        .signature_key_generate()
        .unwrap();
    use mls_rs::CipherSuiteProvider;
    let t = now();
    let content = _native::credential::AgentCredentialContent {
        issuer: common::issuer().kid.as_bytes().to_vec(),
        account: common::ACCOUNT.to_vec(),
        identity: name.as_bytes().to_vec(),
        cipher_suite: 1,
        signature_key: public.to_vec(),
        not_before: t - 10,
        not_after: t + 3600,
    };
    // A name with "forged" in it gets a credential signed by a key that is not the issuer's.
    let signer = if name.contains("forged") {
        common::Issuer::new("test-issuer")
    } else {
        common::Issuer {
            kid: common::issuer().kid.clone(),
            secret: common::issuer().secret.clone(),
            public: common::issuer().public.clone(),
        }
    };
    let credential = signer.credential(content).to_mls_credential().unwrap();
    let anchors =
        _native::TrustAnchors::new([(common::issuer().kid.clone(), common::issuer().public.to_vec())]).unwrap();
    mls_rs::client_builder::ClientBuilder::new()
        .mls_rules(DefaultMlsRules::new().with_commit_options(CommitOptions::new().with_ratchet_tree_extension(true)))
        .crypto_provider(mls_rs_crypto_awslc::AwsLcCryptoProvider::default())
        .identity_provider(common::AcceptAll(_native::SvcIdentityProvider::new(anchors)))
        .signing_identity(
            mls_rs::identity::SigningIdentity::new(credential, public),
            secret,
            mls_rs::CipherSuite::CURVE25519_AES128,
        )
        .build()
}

/// A Welcome from a forger's group of `size`, one member of which ("forged") holds a
/// credential the issuer never signed, for `victim`'s key package.
fn forged_welcome(victim: &Engine, size: usize, forged: bool) -> Vec<u8> {
    use mls_rs::mls_rs_codec::MlsDecode;
    use mls_rs::ExtensionList;
    let forger = forger_client("forger");
    let mut group = forger
        .create_group(ExtensionList::new(), ExtensionList::new(), None)
        .unwrap();
    let mut builder = group.commit_builder();
    for i in 0..size {
        let name = if forged && i == size / 2 {
            format!("forged{i}")
        } else {
            format!("m{i}")
        };
        let kp = forger_client(&name)
            .generate_key_package_message(ExtensionList::new(), ExtensionList::new(), None)
            .unwrap();
        builder = builder.add_member(kp).unwrap();
    }
    builder.build().unwrap();
    group.apply_pending_commit().unwrap();
    let kp = victim.generate_key_package().unwrap();
    let kp = mls_rs::MlsMessage::mls_decode(&mut kp.as_slice()).unwrap();
    let out = group.commit_builder().add_member(kp).unwrap().build().unwrap();
    out.welcome_messages[0].to_bytes().unwrap()
}

#[test]
fn a_welcome_whose_tree_holds_a_forged_credential_is_refused_and_nothing_is_kept() {
    let v = agent("victim");
    // Big enough that the tree's signatures are checked in batches, and small.
    for size in [3, 40] {
        let Err(err) = v.engine.join_group(&forged_welcome(&v.engine, size, true)) else {
            panic!("a tree with a forged credential was accepted");
        };
        let text = err.to_string();
        assert!(
            text.contains("signature check failed") && text.contains("join from Welcome"),
            "{text}"
        );
        assert!(v.engine.group_ids().unwrap().is_empty());
    }
    // Nothing is left deferred: an honest forger-built group (all credentials real) joins,
    // and a forged one after it is still refused.
    v.engine.join_group(&forged_welcome(&v.engine, 40, false)).unwrap();
    assert_eq!(v.engine.group_ids().unwrap().len(), 1);
    assert!(v.engine.join_group(&forged_welcome(&v.engine, 40, true)).is_err());
}

#[test]
fn own_credential_stops_working_when_its_issuer_is_no_longer_trusted() {
    let a = agent("alice");
    a.engine.generate_key_package().unwrap(); // verified once, then remembered
    let rotated = common::Issuer::new("rotated");
    a.engine
        .set_trust_anchors(vec![(rotated.kid.clone(), rotated.public.to_vec())])
        .unwrap();
    let err = a.engine.generate_key_package().unwrap_err();
    assert!(
        matches!(&err, EngineError::OwnCredential(inner) if matches!(**inner, EngineError::UnknownIssuer { .. })),
        "{err}"
    );
}

#[test]
fn discarded_processing_leaves_the_messages_decryptable() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, _g, gb, cts) = alice_and_bob(dir_b.path());
    let refs: Vec<&[u8]> = cts.iter().map(|c| c.as_slice()).collect();
    assert!(gb.process_batch(&refs, false).iter().all(|r| r.is_ok()));
    // Storing what they decrypted failed: back to the stored state, and again.
    gb.discard_unsaved().unwrap();
    let again = gb.process_batch(&refs, true);
    let texts: Vec<Vec<u8>> = again.into_iter().map(|r| app_data(r.unwrap()).1).collect();
    assert_eq!(texts, vec![b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec()]);
    gb.discard_unsaved().unwrap(); // nothing unsaved: a no-op
    assert!(gb.process(&cts[0]).is_err(), "saved: the keys stay used");
}

#[test]
fn queued_messages_are_stored_with_the_ratchet_or_not_at_all() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, g, gb, _) = alice_and_bob(dir_b.path());
    let (epoch, cts) = gb.encrypt_queued(&[(1, b"id-1", b"q1"), (2, b"id-2", b"q2")]).unwrap();
    let rows = gb.outbox().unwrap();
    let stored: Vec<_> = rows
        .iter()
        .map(|r| (r.pos, r.id.clone(), r.epoch, r.payload.clone()))
        .collect();
    assert_eq!(
        stored,
        vec![
            (1, b"id-1".to_vec(), epoch, b"q1".to_vec()),
            (2, b"id-2".to_vec(), epoch, b"q2".to_vec())
        ]
    );
    assert_eq!(rows[0].ciphertext, cts[0]);

    // A restarted process finds the rows, and a ratchet past the keys they used.
    let copy = snapshot(dir_b.path());
    let restarted = common::certified(copy.path(), b"bob", None).group(b"g").unwrap();
    assert_eq!(restarted.outbox().unwrap(), rows);
    let (_, after) = restarted.encrypt_queued(&[(3, b"id-3", b"q3")]).unwrap();
    for (ct, text) in cts.iter().chain(&after).zip([b"q1", b"q2", b"q3"]) {
        assert_eq!(app_data(g.process(ct).unwrap()).1, text);
    }

    // The outbox write fails inside the transaction: the ratchet state is not stored
    // either, and in memory the group is back at the stored state. (From here on the
    // restarted copy is Bob.)
    let gb = restarted;
    let db = rusqlite::Connection::open(copy.path().join("mls.sqlite3")).unwrap();
    let state = || -> Vec<u8> {
        db.query_row("SELECT snapshot FROM mls_group WHERE group_id = ?1", [b"g"], |r| {
            r.get(0)
        })
        .unwrap()
    };
    let before = state();
    db.execute_batch("CREATE TRIGGER full BEFORE INSERT ON svc_outbox BEGIN SELECT RAISE(ABORT, 'disk full'); END;")
        .unwrap();
    assert!(matches!(
        gb.encrypt_queued(&[(4, b"id-4", b"lost")]),
        Err(EngineError::Mls { .. } | EngineError::Storage(_))
    ));
    assert!(state() == before, "no ratchet write without its outbox row");
    assert_eq!(gb.outbox().unwrap().len(), 3);
    db.execute_batch("DROP TRIGGER full;").unwrap();
    let (_, next) = gb.encrypt_queued(&[(4, b"id-4", b"q4")]).unwrap();
    assert_eq!(app_data(g.process(&next[0]).unwrap()).1, b"q4");

    // Acknowledged rows go; a group's rows go with it.
    gb.retire_outbox(2).unwrap();
    assert_eq!(
        gb.outbox().unwrap().iter().map(|r| r.pos).collect::<Vec<_>>(),
        vec![3, 4]
    );
    let count = || -> i64 {
        db.query_row("SELECT COUNT(*) FROM svc_outbox", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(count(), 2);
    drop(gb);
    common::certified(copy.path(), b"bob", None).delete_group(b"g").unwrap();
    assert_eq!(count(), 0);
}

#[test]
fn an_outbox_in_the_without_rowid_layout_is_moved_to_the_rowid_table() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, g, gb, _) = alice_and_bob(dir_b.path());
    gb.encrypt_queued(&[(1, b"id-1", b"q1"), (2, b"id-2", b"q2")]).unwrap();
    let rows = gb.outbox().unwrap();
    drop(gb);

    // Rewrite the table in the layout data dirs had before, rows included.
    let copy = snapshot(dir_b.path());
    let layout = |db: &rusqlite::Connection| -> String {
        db.query_row("SELECT sql FROM sqlite_master WHERE name = 'svc_outbox'", [], |r| {
            r.get(0)
        })
        .unwrap()
    };
    {
        let db = rusqlite::Connection::open(copy.path().join("mls.sqlite3")).unwrap();
        db.execute_batch(
            "ALTER TABLE svc_outbox RENAME TO current;
             CREATE TABLE svc_outbox (group_id BLOB NOT NULL, pos INTEGER NOT NULL, id BLOB NOT NULL,
                 epoch INTEGER NOT NULL, payload BLOB NOT NULL, ciphertext BLOB NOT NULL,
                 PRIMARY KEY (group_id, pos)) WITHOUT ROWID;
             INSERT INTO svc_outbox SELECT group_id, pos, id, epoch, payload, ciphertext FROM current;
             DROP TABLE current;",
        )
        .unwrap();
        assert!(layout(&db).contains("WITHOUT ROWID"));
    }

    let restarted = common::certified(copy.path(), b"bob", None).group(b"g").unwrap();
    assert_eq!(restarted.outbox().unwrap(), rows, "every row moved, in order");
    let db = rusqlite::Connection::open(copy.path().join("mls.sqlite3")).unwrap();
    assert!(!layout(&db).contains("WITHOUT ROWID"), "{}", layout(&db));
    let (_, next) = restarted.encrypt_queued(&[(3, b"id-3", b"q3")]).unwrap();
    assert_eq!(app_data(g.process(&next[0]).unwrap()).1, b"q3");
    assert_eq!(restarted.outbox().unwrap().len(), 3);
}

#[test]
fn an_outbox_that_kept_only_plaintexts_gets_its_ciphertext_column_back() {
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, g, gb, _) = alice_and_bob(dir_b.path());
    gb.encrypt_queued(&[(1, b"id-1", b"q1"), (2, b"id-2", b"q2")]).unwrap();
    let rows = gb.outbox().unwrap();
    drop(gb);

    // The layout one release wrote: each row without its ciphertext.
    let copy = snapshot(dir_b.path());
    let db = rusqlite::Connection::open(copy.path().join("mls.sqlite3")).unwrap();
    db.execute_batch("ALTER TABLE svc_outbox DROP COLUMN ciphertext;")
        .unwrap();

    let restarted = common::certified(copy.path(), b"bob", None).group(b"g").unwrap();
    let restored = restarted.outbox().unwrap();
    assert_eq!(restored.len(), 2, "every row kept");
    for (old, new) in rows.iter().zip(&restored) {
        assert_eq!(
            (old.pos, &old.id, old.epoch, &old.payload),
            (new.pos, &new.id, new.epoch, &new.payload)
        );
        assert!(new.ciphertext.is_empty(), "to be encrypted again before it is sent");
    }
    let (_, next) = restarted.encrypt_queued(&[(3, b"id-3", b"q3")]).unwrap();
    assert_eq!(app_data(g.process(&next[0]).unwrap()).1, b"q3");
    assert_eq!(restarted.outbox().unwrap()[2].ciphertext, next[0]);
}

#[test]
fn sends_are_copied_back_from_the_wal_by_the_checkpoint_thread() {
    // The group store's own connection never checkpoints (that would be two fsyncs inside
    // a send): the thread of checkpoints.rs copies the WAL back once sends wrote enough.
    let dir_b = tempfile::tempdir().unwrap();
    let (_a, _g, gb, _) = alice_and_bob(dir_b.path());
    let db = dir_b.path().join("mls.sqlite3");
    let before = std::fs::metadata(&db).unwrap().len();
    let payload = vec![b'm'; 16 * 1024];
    for batch in 0..100u64 {
        let ids: Vec<Vec<u8>> = (0..10).map(|i| format!("id-{batch}-{i}").into_bytes()).collect();
        let queued: Vec<(u64, &[u8], &[u8])> = (0..10)
            .map(|i| (batch * 10 + i as u64 + 1, ids[i].as_slice(), payload.as_slice()))
            .collect();
        gb.encrypt_queued(&queued).unwrap();
    }
    // 1,000 rows of plaintext and ciphertext, 32 MiB: the store counts 100 writes of
    // 84 pages (`pages_for`), past the checkpoint's 8,000.
    let copied = before + 1000 * 2 * 16 * 1024;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::metadata(&db).unwrap().len() < copied && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        std::fs::metadata(&db).unwrap().len() >= copied,
        "the outbox rows reached mls.sqlite3"
    );
    assert_eq!(gb.outbox().unwrap().len(), 1000);
}

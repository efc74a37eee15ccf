//! Encryption at rest of a `data_dir`'s databases (SQLCipher), opt-in.
//!
//! The key is a raw 256-bit SQLCipher key (`PRAGMA key = "x'…'"`), not a passphrase:
//! a passphrase would cost SQLCipher's PBKDF2 (256,000 rounds of HMAC-SHA512) at every
//! connection the engine opens, and is the weaker secret. Both files of a data_dir
//! (`mls.sqlite3`, the engine's; `client.sqlite3`, the client's) use the same key.
//!
//! Fail closed: before anything is created or written, every database file of the
//! data_dir is classified by its first 16 bytes (plain SQLite files start with
//! `SQLite format 3\0`; an encrypted one starts with its random salt). An encrypted file
//! without a key, a plaintext one with a key, and a key that does not decrypt are each
//! refused with a message that says which; nothing is written in those cases.
//!
//! Conversion (encrypt, rekey, decrypt) is [`convert`]: every file is exported under the
//! new key into `<file>.convert`, all are fsynced, then a journal (`state-convert`) is
//! written and fsynced, and only then are the new files renamed over the old ones. Before
//! the journal exists the old files are untouched (an interrupted run leaves them as they
//! were; the leftovers are removed); once it exists the renames are completed by the next
//! [`recover`] — which `Engine::open` and every conversion run first. So a kill at any
//! point leaves a data_dir that opens under the old key or, after recovery, the new one.

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use zeroize::Zeroizing;

use crate::data_dir;
use crate::error::{EngineError, Result};

/// The engine's database and the client's (svc_sdk.local_state), the files a key covers.
pub const STATE_FILES: [&str; 2] = [crate::storage::DB_FILE, CLIENT_FILE];
pub const CLIENT_FILE: &str = "client.sqlite3";
/// The conversion journal: present only between "all new files are durable" and "all are
/// renamed into place".
pub const JOURNAL_FILE: &str = "state-convert";
const NEW_SUFFIX: &str = ".convert";
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// A 256-bit SQLCipher key. Zeroed when dropped; never printed.
#[derive(Clone)]
pub struct StateKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(…)")
    }
}

impl StateKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let raw: [u8; 32] = bytes.try_into().map_err(|_| {
            EngineError::StateKey(format!(
                "a state key is 32 bytes (64 hex characters), got {} bytes",
                bytes.len()
            ))
        })?;
        Ok(Self(Zeroizing::new(raw)))
    }

    /// The SQL that keys a connection, or an ATTACHed database (`KEY <literal>`).
    fn literal(&self) -> Zeroizing<String> {
        Zeroizing::new(format!("\"x'{}'\"", hex::encode(self.0.as_ref())))
    }
}

/// Applies `key` to a freshly opened connection: it must be the first statement, before
/// SQLCipher reads a page.
///
/// Keying starts SQLCipher's own log, which writes a timestamped line to the process's
/// stderr for every page that fails to decrypt (a wrong key): the level goes back to NONE
/// at once, for the process (the setting is the bundled library's, so this extension's
/// alone). The caller's error says what happened.
pub fn apply(conn: &Connection, key: Option<&StateKey>) -> rusqlite::Result<()> {
    if let Some(key) = key {
        let sql = Zeroizing::new(format!(
            "PRAGMA key = {}; PRAGMA cipher_log_level = NONE;",
            key.literal().as_str()
        ));
        conn.execute_batch(&sql)?;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Missing or empty: created under whatever key is given.
    New,
    Plain,
    /// Not a plain SQLite header: encrypted, or damaged.
    Encrypted,
}

pub fn kind(path: &Path) -> Result<FileKind> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(FileKind::New),
        Err(e) => return Err(refuse(path, format!("cannot read it: {e}"))),
    };
    let mut head = Vec::with_capacity(16);
    (&mut file)
        .take(16)
        .read_to_end(&mut head)
        .map_err(|e| refuse(path, format!("cannot read it: {e}")))?;
    Ok(if head.is_empty() {
        FileKind::New
    } else if head.as_slice() == SQLITE_HEADER {
        FileKind::Plain
    } else {
        FileKind::Encrypted
    })
}

fn refuse(path: &Path, detail: impl Into<String>) -> EngineError {
    let dir = path.parent().unwrap_or(Path::new(""));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    EngineError::DataDir {
        path: dir.display().to_string(),
        detail: format!("{name} is not a usable database {}", detail.into()),
    }
}

/// Refuses `path` unless it can be opened under `key`, without writing anything.
pub fn check(path: &Path, key: Option<&StateKey>) -> Result<FileKind> {
    let kind = kind(path)?;
    let dir = path.parent().unwrap_or(Path::new("")).display().to_string();
    match (kind, key) {
        (FileKind::New, _) => {}
        (FileKind::Plain, None) => {}
        (FileKind::Plain, Some(_)) => {
            return Err(refuse(
                path,
                format!(
                    "with a state key: it is not encrypted. Encrypt the data_dir first with \
                     `svc state encrypt {dir}` (the key from SVC_STATE_KEY or \
                     SVC_STATE_KEY_FILE), or open it without a key"
                ),
            ))
        }
        (FileKind::Encrypted, None) => {
            return Err(refuse(
                path,
                "without a state key: it is encrypted (or damaged) and no key was given; set \
                 SVC_STATE_KEY or SVC_STATE_KEY_FILE, or pass state_key=",
            ))
        }
        (FileKind::Encrypted, Some(key)) => {
            // Even a read-only connection creates the WAL files of a WAL database.
            let sidecars = NewSidecars::watch_files(std::iter::once(path.to_owned()));
            let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let verdict = Connection::open_with_flags(path, flags).and_then(|conn| {
                apply(&conn, Some(key))?;
                conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get::<_, i64>(0))
            });
            if let Err(e) = verdict {
                drop(sidecars);
                return Err(refuse(
                    path,
                    format!("with this state key: the key is wrong, or the file is damaged ({e})"),
                ));
            }
            sidecars.keep();
        }
    }
    Ok(kind)
}

/// Checks every state file of `data_dir` against `key` before any is created or written.
pub fn check_data_dir(data_dir: &Path, key: Option<&StateKey>) -> Result<()> {
    for name in STATE_FILES {
        check(&data_dir.join(name), key)?;
    }
    Ok(())
}

/// Removes, when dropped before [`keep`](Self::keep), the `-wal` and `-shm` files of the
/// state files that did not exist when it was made. A file whose first page decrypts but
/// is damaged further on (truncated) passes [`check`] and fails only once SQLite reads
/// on; SQLite has created its WAL files by then, and a refused open must leave nothing.
pub struct NewSidecars {
    created: Vec<PathBuf>,
    keep: bool,
}

impl NewSidecars {
    pub fn watch(data_dir: &Path) -> Self {
        Self::watch_files(STATE_FILES.iter().map(|name| data_dir.join(name)))
    }

    fn watch_files(files: impl Iterator<Item = PathBuf>) -> Self {
        let created = files
            .flat_map(|file| ["-wal", "-shm"].map(|s| sidecar(&file, s)))
            .filter(|p| !p.exists())
            .collect();
        Self { created, keep: false }
    }

    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for NewSidecars {
    fn drop(&mut self) {
        if !self.keep {
            for path in &self.created {
                let _ = fs::remove_file(path);
            }
        }
    }
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| EngineError::Storage(format!("fsync {}: {e}", dir.display())))
}

fn io(path: &Path, what: &str, e: std::io::Error) -> EngineError {
    EngineError::Storage(format!("{what} {}: {e}", path.display()))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io(path, "remove", e)),
        _ => Ok(()),
    }
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// For tests of crash safety: `SVC_STATE_CONVERT_CRASH_AT=N` kills the process (SIGKILL,
/// as `kill -9`) at the N-th step of a conversion.
struct Steps {
    crash_at: Option<u32>,
    n: u32,
}

impl Steps {
    fn new() -> Self {
        let crash_at = std::env::var("SVC_STATE_CONVERT_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok());
        Self { crash_at, n: 0 }
    }

    fn step(&mut self) {
        self.n += 1;
        if self.crash_at == Some(self.n) {
            // SAFETY: kill and getpid have no preconditions; SIGKILL does not return.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// Completes or discards an interrupted conversion of `data_dir`. The caller holds the
/// data_dir's lock.
pub fn recover(data_dir: &Path) -> Result<()> {
    recover_with(data_dir, &mut Steps { crash_at: None, n: 0 })
}

fn recover_with(data_dir: &Path, steps: &mut Steps) -> Result<()> {
    let journal = data_dir.join(JOURNAL_FILE);
    let committed = journal.exists();
    for name in STATE_FILES {
        let target = data_dir.join(name);
        let new = sidecar(&target, NEW_SUFFIX);
        remove_if_present(&sidecar(&new, "-journal"))?;
        if !new.exists() {
            continue;
        }
        if committed {
            // The new file holds every committed row (it was exported through a
            // connection that read the WAL too): the old WAL is redundant, and must not
            // be applied to a file under another key.
            remove_if_present(&sidecar(&target, "-wal"))?;
            remove_if_present(&sidecar(&target, "-shm"))?;
            steps.step();
            fs::rename(&new, &target).map_err(|e| io(&new, "rename", e))?;
            fsync_dir(data_dir)?;
            steps.step();
        } else {
            remove_if_present(&new)?;
        }
    }
    if committed {
        remove_if_present(&journal)?;
        fsync_dir(data_dir)?;
    }
    Ok(())
}

/// Re-encrypts every state file of `data_dir` from `from` to `to` (`None`: plaintext),
/// crash-safely (see the module documentation). Takes the data_dir's lock: no engine may
/// have it open.
pub fn convert(data_dir: &Path, from: Option<&StateKey>, to: Option<&StateKey>) -> Result<()> {
    if !data_dir.is_dir() {
        return Err(EngineError::DataDir {
            path: data_dir.display().to_string(),
            detail: "it does not exist or is not a directory".into(),
        });
    }
    let _lock = data_dir::take(data_dir)?;
    let mut steps = Steps::new();
    recover_with(data_dir, &mut steps)?;
    let mut present = Vec::new();
    for name in STATE_FILES {
        let path = data_dir.join(name);
        if from.is_none() && to.is_some() && kind(&path)? == FileKind::Encrypted {
            return Err(EngineError::DataDir {
                path: data_dir.display().to_string(),
                detail: format!("{name} is encrypted already; change its key with `svc state rekey`"),
            });
        }
        if check(&path, from)? != FileKind::New {
            present.push(path);
        }
    }
    if present.is_empty() {
        return Err(EngineError::DataDir {
            path: data_dir.display().to_string(),
            detail: "it holds no state to convert (no mls.sqlite3 or client.sqlite3)".into(),
        });
    }
    let to_literal = match to {
        Some(k) => k.literal(),
        None => Zeroizing::new("''".to_string()),
    };
    for path in &present {
        let new = sidecar(path, NEW_SUFFIX);
        remove_if_present(&new)?;
        drop(data_dir::create_private(&new).map_err(|e| io(&new, "create", e))?);
        let conn = Connection::open(path)?;
        apply(&conn, from)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // The ATTACH may key the process's first SQLCipher codec (a plaintext data dir
        // being encrypted), which turns SQLCipher's log on: off again, as in `apply`.
        let attach = Zeroizing::new(format!(
            "ATTACH DATABASE '{}' AS convert_to KEY {}; PRAGMA cipher_log_level = NONE;",
            new.display().to_string().replace('\'', "''"),
            to_literal.as_str()
        ));
        conn.execute_batch(&attach)?;
        conn.query_row("SELECT sqlcipher_export('convert_to')", [], |_| Ok(()))?;
        // sqlcipher_export copies schema and rows, not the header's user_version, which
        // mls-rs-provider-sqlite's migration reads to know its tables exist.
        let version: i64 = conn.query_row("PRAGMA main.user_version", [], |r| r.get(0))?;
        conn.execute_batch(&format!("PRAGMA convert_to.user_version = {version};"))?;
        conn.execute_batch("DETACH DATABASE convert_to;")?;
        drop(conn);
        steps.step();
        File::open(&new)
            .and_then(|f| f.sync_all())
            .map_err(|e| io(&new, "fsync", e))?;
    }
    fsync_dir(data_dir)?;
    steps.step();
    // The commit point: from here on the next run completes the renames.
    let journal = data_dir.join(JOURNAL_FILE);
    remove_if_present(&journal)?;
    let mut file = data_dir::create_private(&journal).map_err(|e| io(&journal, "create", e))?;
    file.write_all(b"rename every <file>.convert over <file>, then remove this journal\n")
        .and_then(|()| file.sync_all())
        .map_err(|e| io(&journal, "write", e))?;
    drop(file);
    fsync_dir(data_dir)?;
    steps.step();
    recover_with(data_dir, &mut steps)?;
    steps.step();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_length_is_checked_and_debug_hides_it() {
        assert!(StateKey::from_bytes(&[1; 31]).is_err());
        let key = StateKey::from_bytes(&[0xab; 32]).unwrap();
        assert_eq!(format!("{key:?}"), "StateKey(…)");
    }

    #[test]
    fn encrypt_rekey_decrypt_round_trip() {
        use std::os::unix::fs::PermissionsExt;
        // A data_dir as the engine makes it: 0700, files 0600 (convert takes it like one).
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.path().join(crate::storage::DB_FILE);
        drop(data_dir::create_private(&path).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA user_version=7; CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('secret-row');",
            )
            .unwrap();
        }
        let (a, b) = (
            StateKey::from_bytes(&[1; 32]).unwrap(),
            StateKey::from_bytes(&[2; 32]).unwrap(),
        );
        convert(dir.path(), None, Some(&a)).unwrap();
        assert_eq!(kind(&path).unwrap(), FileKind::Encrypted);
        assert!(check(&path, None).is_err());
        assert!(check(&path, Some(&b)).is_err());
        convert(dir.path(), Some(&a), Some(&b)).unwrap();
        assert!(check(&path, Some(&a)).is_err());
        convert(dir.path(), Some(&b), None).unwrap();
        let conn = Connection::open(&path).unwrap();
        let v: String = conn.query_row("SELECT v FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(v, "secret-row");
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 7);
    }
}

//! Taking an agent's `data_dir` for this process: it must be private to the current user
//! (owned by them, nothing in it readable by anyone else), and only one process may use
//! it at a time.
//!
//! A `data_dir` holds the signing key, group secrets and decrypted messages. A directory
//! another user created in advance (a predictable `/tmp` name is enough) would let them
//! read all of it, so such a directory is refused rather than repaired. Two processes on
//! one directory would each advance their own copy of a group's ratchets and reuse keys,
//! so the second is refused too: an exclusive lock on `data_dir/lock`, held for the
//! engine's lifetime and released by the OS if the process dies.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

pub const LOCK_FILE: &str = "lock";

/// An exclusive hold on a `data_dir`; dropping it releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

fn refuse(path: &Path, detail: impl Into<String>) -> EngineError {
    EngineError::DataDir {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `data_dir` (0700) if missing, checks that it and everything in it belong to
/// the current user and are private, and locks it. Returns the lock.
pub fn take(data_dir: &Path) -> Result<DataDirLock> {
    if data_dir.as_os_str().is_empty() {
        return Err(refuse(data_dir, "the path is empty"));
    }
    let meta = match fs::metadata(data_dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(data_dir)
                .map_err(|e| refuse(data_dir, e.to_string()))?;
            fs::metadata(data_dir)
        }
        other => other,
    }
    .map_err(|e| refuse(data_dir, e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse(data_dir, "it exists and is not a directory"));
    }
    let me = current_uid();
    if meta.uid() != me {
        return Err(refuse(
            data_dir,
            format!(
                "it is owned by uid {}, not by you (uid {me}); whoever owns it could read your \
                 keys and messages. Use a data_dir of your own (SVC_DATA_DIR, or data_dir=)",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        if !is_empty(data_dir)? {
            return Err(refuse(
                data_dir,
                format!(
                    "other users can access it (mode {:o}) and it is not empty. If nobody else \
                     could have read it, run `chmod 700 {}`; otherwise use a new data_dir",
                    meta.mode() & 0o777,
                    data_dir.display()
                ),
            ));
        }
        // An empty directory (made by mkdir under a loose umask) has nothing to leak yet.
        fs::set_permissions(data_dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(data_dir, e.to_string()))?;
    }
    let lock = lock(data_dir)?;
    check_entries(data_dir, me)?;
    Ok(lock)
}

fn is_empty(dir: &Path) -> Result<bool> {
    let mut entries = fs::read_dir(dir).map_err(|e| refuse(dir, e.to_string()))?;
    Ok(entries.next().is_none())
}

fn lock(data_dir: &Path) -> Result<DataDirLock> {
    let path = data_dir.join(LOCK_FILE);
    let mut file = create_private(&path)
        .or_else(|e| match e.kind() {
            ErrorKind::AlreadyExists => OpenOptions::new().read(true).write(true).open(&path),
            _ => Err(e),
        })
        .map_err(|e| refuse(data_dir, format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(EngineError::DataDirInUse {
                path: data_dir.display().to_string(),
                holder: holder.trim().to_string(),
            });
        }
        Err(fs::TryLockError::Error(e)) => {
            return Err(refuse(data_dir, format!("cannot lock {}: {e}", path.display())))
        }
    }
    // Who holds it, for the message the next process gets; advisory only.
    let _ = file.set_len(0).and_then(|()| {
        file.rewind()?;
        write!(file, "{}", std::process::id())
    });
    Ok(DataDirLock { _file: file })
}

/// Every entry must be ours, and every file private: a file another user owns or can read
/// would leak (or let someone plant) state.
fn check_entries(data_dir: &Path, me: u32) -> Result<()> {
    for entry in fs::read_dir(data_dir).map_err(|e| refuse(data_dir, e.to_string()))? {
        let entry = entry.map_err(|e| refuse(data_dir, e.to_string()))?;
        let meta = entry
            .path()
            .symlink_metadata()
            .map_err(|e| refuse(data_dir, e.to_string()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if meta.uid() != me {
            return Err(refuse(
                data_dir,
                format!(
                    "{name} in it is owned by uid {}, not by you (uid {me}); use a new data_dir",
                    meta.uid()
                ),
            ));
        }
        if meta.is_file() && meta.mode() & 0o077 != 0 {
            return Err(refuse(
                data_dir,
                format!(
                    "{name} in it is readable by other users (mode {:o}). If nobody else could \
                     have read it, run `chmod 600 {}`; otherwise use a new data_dir",
                    meta.mode() & 0o777,
                    entry.path().display()
                ),
            ));
        }
    }
    Ok(())
}

/// Creates `path` with mode 0600 atomically (O_EXCL): never a file someone else made.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// `data_dir/name`, created 0600 if it does not exist yet. An existing file was checked
/// by [`take`].
pub fn private_file(data_dir: &Path, name: &str) -> Result<PathBuf> {
    let path = data_dir.join(name);
    match create_private(&path) {
        Ok(_) => Ok(path),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(path),
        Err(e) => Err(refuse(data_dir, format!("cannot create {}: {e}", path.display()))),
    }
}

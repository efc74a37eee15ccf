//! Key package secrets, in the table mls-rs-provider-sqlite made, on the group store's
//! connection; each used key package is deleted once.
//!
//! mls-rs asks its key package storage to delete the key package a group was joined
//! with at every later write of that group's state (its state repository never clears
//! the request while the process holds the group). mls-rs-provider-sqlite's storage ran
//! each of those deletes as a statement of its own, with its own commit, on a
//! connection of its own: one more SQLite write per message an agent that joined from
//! a Welcome received or sent. Here the first delete erases the row; later ones for the
//! same key package do nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use mls_rs_codec::{MlsDecode, MlsEncode};
use mls_rs_core::key_package::{KeyPackageData, KeyPackageStorage};
use rusqlite::{params, OptionalExtension};
use zeroize::Zeroizing;

use crate::checkpoints::{pages_for, Checkpointer};
use crate::error::{EngineError, Result};
use crate::storage::{self, Locked, SharedConnection};

/// Key packages remembered as deleted: one per group joined in this process. Past it the
/// memory starts over, and each group joined before deletes (nothing) once more.
const DELETED_KEPT: usize = 4096;

#[derive(Clone)]
pub struct KeyPackages {
    conn: SharedConnection,
    checkpoints: Arc<Checkpointer>,
    deleted: Arc<Mutex<HashSet<Vec<u8>>>>,
}

impl KeyPackages {
    pub(crate) fn new(conn: SharedConnection, checkpoints: Arc<Checkpointer>) -> Self {
        Self {
            conn,
            checkpoints,
            deleted: Arc::default(),
        }
    }

    fn conn(&self) -> Result<Locked<'_>> {
        storage::lock(&self.conn)
    }

    fn deleted(&self) -> MutexGuard<'_, HashSet<Vec<u8>>> {
        self.deleted.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn codec(e: mls_rs_codec::Error) -> EngineError {
    EngineError::Storage(format!("key package encoding: {e}"))
}

impl KeyPackageStorage for KeyPackages {
    type Error = EngineError;

    fn delete(&mut self, id: &[u8]) -> Result<()> {
        if self.deleted().contains(id) {
            return Ok(());
        }
        self.conn()?
            .prepare_cached("DELETE FROM key_package WHERE id = ?1")?
            .execute([id])?;
        self.checkpoints.wrote(pages_for(0));
        let mut deleted = self.deleted();
        if deleted.len() >= DELETED_KEPT {
            deleted.clear();
        }
        deleted.insert(id.to_vec());
        Ok(())
    }

    fn insert(&mut self, id: Vec<u8>, pkg: KeyPackageData) -> Result<()> {
        let expiration = i64::try_from(pkg.expiration)
            .map_err(|_| EngineError::Storage(format!("key package expiration {} out of range", pkg.expiration)))?;
        let data = Zeroizing::new(pkg.mls_encode_to_vec().map_err(codec)?);
        self.conn()?
            .prepare_cached("INSERT INTO key_package (id, expiration, data) VALUES (?1, ?2, ?3)")?
            .execute(params![id, expiration, &*data])?;
        self.checkpoints.wrote(pages_for(data.len()));
        self.deleted().remove(&id);
        Ok(())
    }

    fn get(&self, id: &[u8]) -> Result<Option<KeyPackageData>> {
        let data: Option<Zeroizing<Vec<u8>>> = self
            .conn()?
            .prepare_cached("SELECT data FROM key_package WHERE id = ?1")?
            .query_row([id], |row| row.get(0).map(Zeroizing::new))
            .optional()?;
        data.map(|d| KeyPackageData::mls_decode(&mut d.as_slice()).map_err(codec))
            .transpose()
    }
}

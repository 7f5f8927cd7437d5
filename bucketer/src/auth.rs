//! API tokens: who may read or write which table. Owns the persisted token record and
//! permission values of the `auth` column family; the key layout is in [`crate::keys`]
//! ([`keys::token_key`], [`keys::grant_key`]).
//!
//! Tokens are stored by their SHA-256 hash only: the store never sees a token, and the caller
//! (the query service) hashes what a client presents. The table is denormalized — one entry
//! per (token, table) beside the token's own record — so a check is one multi-get of two keys
//! ([`Store::token_access`]) and needs no scan. Grants name tables by name, so a token can be
//! issued for a table that does not exist yet (it is created by its first write).
//!
//! Values, version 1:
//!
//! | entry | bytes |
//! |---|---|
//! | token record | `u8 1` · `u8 flags` (bit 0: admin) · `i64 BE` issued at, epoch ms · label (UTF-8, the rest) |
//! | grant | `u8 1` · `u8 bits` ([`Permissions`]: bit 0 read, bit 1 write) |
//!
//! This module does not decide what a request needs; that is the query service's contract.

use rocksdb::WriteBatch;

use crate::keys::{self, TOKEN_HASH_LEN};
use crate::store::{cf, CF_AUTH};
use crate::{db_err, Error, Result, Store};

/// Version byte of the values this code writes.
const VERSION: u8 = 1;

/// A SHA-256 hash of a token.
pub type TokenHash = [u8; TOKEN_HASH_LEN];

/// A token's grants: table → permissions, in table-name order.
pub type Grants = Vec<(String, Permissions)>;

/// What a token may do on one table: a set of read and write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Permissions(u8);

impl Permissions {
    /// No permission.
    pub const NONE: Permissions = Permissions(0);
    /// Read the table's data (readings, latest values, roll-ups, devices, counters).
    pub const READ: Permissions = Permissions(1);
    /// Write readings and device records to the table.
    pub const WRITE: Permissions = Permissions(2);
    /// Both.
    pub const READ_WRITE: Permissions = Permissions(3);

    /// Whether every permission of `other` is in `self`.
    pub fn contains(self, other: Permissions) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both.
    pub fn union(self, other: Permissions) -> Permissions {
        Permissions(self.0 | other.0)
    }

    /// Whether no permission is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `"read"`, `"write"`, `"read,write"` or `""`.
    pub fn as_str(self) -> &'static str {
        match self.0 {
            1 => "read",
            2 => "write",
            3 => "read,write",
            _ => "",
        }
    }
}

/// A token's own record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// May do anything, on every table, and issue tokens.
    pub admin: bool,
    /// When it was issued, epoch ms.
    pub issued_ms: i64,
    /// A name for people (who or what holds it); may be empty.
    pub label: String,
}

/// What a token may do on one table, as found by [`Store::token_access`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The token is an admin token.
    pub admin: bool,
    /// Its grant on the table asked about (none for an admin token without one).
    pub table: Permissions,
}

impl Access {
    /// Whether the token may do `needed` on the table asked about.
    pub fn allows(&self, needed: Permissions) -> bool {
        self.admin || self.table.contains(needed)
    }
}

fn encode_record(r: &TokenRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(10 + r.label.len());
    v.push(VERSION);
    v.push(u8::from(r.admin));
    v.extend_from_slice(&r.issued_ms.to_be_bytes());
    v.extend_from_slice(r.label.as_bytes());
    v
}

fn decode_record(v: &[u8]) -> Result<TokenRecord> {
    let corrupt = |detail: &str| Error::Corrupt { what: "token record", detail: detail.to_string() };
    match v {
        [VERSION, flags, rest @ ..] if rest.len() >= 8 => {
            let (ts, label) = rest.split_at(8);
            let mut b = [0u8; 8];
            b.copy_from_slice(ts);
            let label = std::str::from_utf8(label).map_err(|_| corrupt("label is not UTF-8"))?;
            Ok(TokenRecord { admin: flags & 1 == 1, issued_ms: i64::from_be_bytes(b), label: label.to_string() })
        }
        [version, ..] if *version != VERSION => Err(corrupt(&format!("unknown version {version}"))),
        _ => Err(corrupt(&format!("{} bytes", v.len()))),
    }
}

fn decode_grant(v: &[u8]) -> Result<Permissions> {
    match v {
        [VERSION, bits] if *bits <= 3 => Ok(Permissions(*bits)),
        _ => Err(Error::Corrupt { what: "token grant", detail: format!("value {v:?}") }),
    }
}

impl Store {
    /// Stores a token (by `hash`) with its record and its grants, in one WriteBatch. Grants
    /// with no permission are skipped. Table names are not checked here.
    pub fn put_token(&self, hash: &TokenHash, record: &TokenRecord, grants: &[(String, Permissions)]) -> Result<()> {
        let h = cf(&self.db, CF_AUTH);
        let mut wb = WriteBatch::default();
        wb.put_cf(h, keys::token_key(hash), encode_record(record));
        for (table, perms) in grants.iter().filter(|(_, p)| !p.is_empty()) {
            wb.put_cf(h, keys::grant_key(hash, table), [VERSION, perms.0]);
        }
        self.db.write(wb).map_err(db_err("write token"))
    }

    /// What the token with `hash` may do on `table`: one multi-get of its record and its grant
    /// on the table. `None` when no such token is stored.
    pub fn token_access(&self, hash: &TokenHash, table: Option<&str>) -> Result<Option<Access>> {
        let h = cf(&self.db, CF_AUTH);
        let record_key = keys::token_key(hash).to_vec();
        let mut wanted = vec![record_key];
        if let Some(t) = table {
            wanted.push(keys::grant_key(hash, t));
        }
        let mut found = self.db.batched_multi_get_cf(h, wanted.iter(), true).into_iter();
        let record = match found.next() {
            Some(r) => r.map_err(db_err("multi-get token"))?,
            None => None,
        };
        let Some(record) = record else {
            return Ok(None);
        };
        let record = decode_record(&record)?;
        let table = match found.next() {
            Some(r) => r.map_err(db_err("multi-get token"))?.map(|v| decode_grant(&v)).transpose()?,
            None => None,
        };
        Ok(Some(Access { admin: record.admin, table: table.unwrap_or_default() }))
    }

    /// The token with `hash` (its record) and its grants in table-name order; `None` when no
    /// such token is stored.
    pub fn token(&self, hash: &TokenHash) -> Result<Option<(TokenRecord, Grants)>> {
        let h = cf(&self.db, CF_AUTH);
        let mut record = None;
        let mut grants = Vec::new();
        for item in self.db.prefix_iterator_cf(h, hash) {
            let (k, v) = item.map_err(db_err("scan token"))?;
            if !k.starts_with(hash) {
                break;
            }
            if k.len() == TOKEN_HASH_LEN {
                record = Some(decode_record(&v)?);
            } else if let Some(table) = keys::decode_grant_key(&k) {
                grants.push((table.to_string(), decode_grant(&v)?));
            }
        }
        Ok(record.map(|r| (r, grants)))
    }

    /// Every stored token: its hash, record and grants, in hash order.
    pub fn tokens(&self) -> Result<Vec<(TokenHash, TokenRecord, Grants)>> {
        let h = cf(&self.db, CF_AUTH);
        let mut out: Vec<(TokenHash, TokenRecord, Grants)> = Vec::new();
        for item in self.db.iterator_cf(h, rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan tokens"))?;
            // A record (the hash alone) comes before its grants (the hash and a table name).
            if let Ok(hash) = TokenHash::try_from(&*k) {
                out.push((hash, decode_record(&v)?, Vec::new()));
            } else if let (Some(table), Some((hash, _, grants))) = (keys::decode_grant_key(&k), out.last_mut()) {
                if k.starts_with(hash) {
                    grants.push((table.to_string(), decode_grant(&v)?));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the token with `hash`, its record and grants in one WriteBatch: requests that
    /// present it are refused from then on. Returns what it was; `None` when no such token is
    /// stored.
    pub fn delete_token(&self, hash: &TokenHash) -> Result<Option<(TokenRecord, Grants)>> {
        let Some((record, grants)) = self.token(hash)? else { return Ok(None) };
        let h = cf(&self.db, CF_AUTH);
        let mut wb = WriteBatch::default();
        wb.delete_cf(h, keys::token_key(hash));
        for (table, _) in &grants {
            wb.delete_cf(h, keys::grant_key(hash, table));
        }
        self.db.write(wb).map_err(db_err("delete token"))?;
        Ok(Some((record, grants)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn records_round_trip_and_bad_values_are_corrupt() {
        let r = TokenRecord { admin: true, issued_ms: -5, label: "ops ä".into() };
        assert_eq!(decode_record(&encode_record(&r)).unwrap(), r);
        let plain = TokenRecord { admin: false, issued_ms: 1_700_000_000_000, label: String::new() };
        assert_eq!(decode_record(&encode_record(&plain)).unwrap(), plain);
        assert!(decode_record(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode_record(&[1, 0, 0]).is_err());
        assert_eq!(decode_grant(&[1, 3]).unwrap(), Permissions::READ_WRITE);
        assert!(decode_grant(&[1, 4]).is_err());
        assert!(decode_grant(&[2, 1]).is_err());
    }

    #[test]
    fn a_check_finds_the_grant_of_the_table_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let (a, b) = ([7u8; 32], [8u8; 32]);
        let rec = TokenRecord { admin: false, issued_ms: 1, label: "a".into() };
        store
            .put_token(&a, &rec, &[("t.one".into(), Permissions::READ), ("t.two".into(), Permissions::READ_WRITE)])
            .unwrap();
        let access = |h: &TokenHash, t: &str| store.token_access(h, Some(t)).unwrap();
        assert_eq!(access(&a, "t.one"), Some(Access { admin: false, table: Permissions::READ }));
        assert!(!access(&a, "t.one").unwrap().allows(Permissions::WRITE));
        assert!(access(&a, "t.two").unwrap().allows(Permissions::WRITE));
        // `t.on` is a prefix of `t.one`: no grant.
        assert_eq!(access(&a, "t.on"), Some(Access { admin: false, table: Permissions::NONE }));
        assert_eq!(access(&b, "t.one"), None);
        let admin = TokenRecord { admin: true, issued_ms: 2, label: "root".into() };
        store.put_token(&b, &admin, &[]).unwrap();
        assert!(access(&b, "anything").unwrap().allows(Permissions::READ_WRITE));
        let (record, grants) = store.token(&a).unwrap().unwrap();
        assert_eq!(record, rec);
        assert_eq!(grants, vec![("t.one".into(), Permissions::READ), ("t.two".into(), Permissions::READ_WRITE)]);
    }

    #[test]
    fn tokens_are_listed_and_a_deleted_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let (a, b, c) = ([7u8; 32], [8u8; 32], [9u8; 32]);
        let rec = |admin, label: &str| TokenRecord { admin, issued_ms: 1, label: label.into() };
        let grants_a: Grants = vec![("t.one".into(), Permissions::READ), ("t.two".into(), Permissions::READ_WRITE)];
        let grants_c: Grants = vec![("t.one".into(), Permissions::WRITE)];
        store.put_token(&c, &rec(false, "c"), &grants_c).unwrap();
        store.put_token(&a, &rec(false, "a"), &grants_a).unwrap();
        store.put_token(&b, &rec(true, "b"), &[]).unwrap();
        let all = vec![
            (a, rec(false, "a"), grants_a.clone()),
            (b, rec(true, "b"), Vec::new()),
            (c, rec(false, "c"), grants_c.clone()),
        ];
        assert_eq!(store.tokens().unwrap(), all);

        assert_eq!(store.delete_token(&a).unwrap(), Some((rec(false, "a"), grants_a)));
        assert_eq!(store.delete_token(&a).unwrap(), None);
        assert_eq!(store.token_access(&a, Some("t.two")).unwrap(), None);
        assert_eq!(store.tokens().unwrap(), all[1..]);
        // No grant of it is left behind.
        let h = cf(&store.db, CF_AUTH);
        let keys: Vec<Box<[u8]>> =
            store.db.iterator_cf(h, rocksdb::IteratorMode::Start).map(|kv| kv.unwrap().0).collect();
        assert_eq!(keys, [b.to_vec(), c.to_vec(), keys::grant_key(&c, "t.one")].map(Vec::into_boxed_slice));
    }
}

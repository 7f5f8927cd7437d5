//! Who may call what: bearer tokens checked against the store's `auth` table.
//!
//! A client sends `Authorization: Bearer <token>` (or `Token <token>`, the scheme of InfluxDB's
//! clients, or `Basic` with the token as the password, as InfluxDB 1's clients send a user and
//! password; for the write API and the rest alike). The token is hashed (SHA-256) and looked up
//! with its permission on the table of the request in one multi-get
//! (`bucketer::Store::token_access`); the token itself is never stored. The admin token of the
//! configuration is held only as its hash, in memory. What each route needs is the contract of
//! [`crate::api`]; this module answers whether a caller has it:
//! missing, malformed or unknown token → 401, known token without the permission → 403.
//!
//! With auth off (the local demo only; the binary refuses it on a non-loopback address and logs
//! a warning) every request is let through.
//!
//! ```
//! let token = query::auth::new_token();
//! assert!(token.starts_with("hg_") && token.len() == 67);
//! assert_eq!(query::auth::hash_token(&token), query::auth::hash_token(&token.clone()));
//! ```

use axum::http::{header, HeaderMap};
use bucketer::auth::{Permissions, TokenHash};
use bucketer::Store;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Prefix of issued tokens, so a leaked one is recognisable in logs and scanners.
pub const TOKEN_PREFIX: &str = "hg_";

/// Why a request without an `Authorization` header is refused, with every way to send a token.
const MISSING_TOKEN: &str = "missing `Authorization: Bearer <token>` header (or `Token <token>`, or `Basic` with the \
                             token as the password; `/write` also takes it as `p=`)";

/// The SHA-256 hash of a token.
pub fn hash_token(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

/// A new random token: [`TOKEN_PREFIX`] and 32 bytes from the OS's generator in hex.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let mut s = String::with_capacity(TOKEN_PREFIX.len() + 64);
    s.push_str(TOKEN_PREFIX);
    for b in bytes {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

/// Equality of two hashes in time independent of where they differ.
fn same_hash(a: &TokenHash, b: &TokenHash) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether two secrets are equal, compared by hash in time independent of their content.
pub fn same_secret(a: &str, b: &str) -> bool {
    same_hash(&hash_token(a), &hash_token(b))
}

/// The auth settings of the query service.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Check tokens. Off: every request passes (local demo only).
    pub enabled: bool,
    /// The admin token (from the configuration or its environment variable), if any.
    pub admin_token: Option<String>,
}

/// What a request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Any valid token.
    Token,
    /// Read permission on the table.
    Read(String),
    /// Write permission on the table.
    Write(String),
    /// Write permission on some table (a write turned away before its body is read).
    AnyWrite,
    /// An admin token.
    Admin,
}

/// Who is calling, once let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Auth is off.
    Anyone,
    /// An admin token.
    Admin,
    /// A stored non-admin token, by hash.
    Token(TokenHash),
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable token: 401.
    Unauthenticated(String),
    /// A valid token without the permission: 403.
    Forbidden(String),
    /// The store failed.
    Storage(String),
}

/// The checker held by the handlers.
#[derive(Debug, Clone)]
pub struct Auth {
    enabled: bool,
    admin_hash: Option<TokenHash>,
}

impl Auth {
    /// A checker for `cfg`.
    pub fn new(cfg: &AuthConfig) -> Auth {
        Auth { enabled: cfg.enabled, admin_hash: cfg.admin_token.as_deref().map(hash_token) }
    }

    /// Auth off: every request passes.
    pub fn off() -> Auth {
        Auth { enabled: false, admin_hash: None }
    }

    /// Whether tokens are checked.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `text` may be a token: one made here ([`TOKEN_PREFIX`]…), or the admin token.
    /// Such a text given where a name is expected is not to be shown in logs or answers.
    pub fn may_be_token(&self, text: &str) -> bool {
        text.starts_with(TOKEN_PREFIX) || self.admin_hash.is_some_and(|admin| hash_token(text) == admin)
    }

    /// The token of a request, or why there is none usable: `Authorization: Bearer <token>` or
    /// `Token <token>`, or `Basic` with the token as the password (InfluxDB 1's user and
    /// password, as Telegraf's `influxdb` output sends them; the user name is not read).
    fn bearer(headers: &HeaderMap) -> Result<std::borrow::Cow<'_, str>, Refusal> {
        let value = headers.get(header::AUTHORIZATION).ok_or_else(|| Refusal::Unauthenticated(MISSING_TOKEN.into()))?;
        let text = value.to_str().unwrap_or_default();
        let not_bearer = || {
            Refusal::Unauthenticated(
                "the `Authorization` header is not `Bearer <token>` (nor `Basic` with the token as the password)"
                    .into(),
            )
        };
        match text.split_once(' ') {
            Some((scheme, token))
                if (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
                    && !token.trim().is_empty() =>
            {
                Ok(token.trim().into())
            }
            Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => {
                use base64::Engine;
                let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok();
                let pair = decoded.and_then(|d| String::from_utf8(d).ok()).ok_or_else(not_bearer)?;
                match pair.split_once(':') {
                    Some((_, password)) if !password.is_empty() => Ok(password.to_string().into()),
                    _ => Err(not_bearer()),
                }
            }
            _ => Err(not_bearer()),
        }
    }

    /// Whether the caller of a request with `headers` has `need`. Reads the store (a multi-get
    /// of two keys): call it from a blocking thread.
    pub fn check(&self, store: &Store, headers: &HeaderMap, need: Need) -> Result<Caller, Refusal> {
        if !self.enabled {
            return Ok(Caller::Anyone);
        }
        let hash = hash_token(&Self::bearer(headers)?);
        if self.admin_hash.as_ref().is_some_and(|a| same_hash(a, &hash)) {
            return Ok(Caller::Admin);
        }
        if need == Need::AnyWrite {
            let (record, grants) = store
                .token(&hash)
                .map_err(|e| Refusal::Storage(e.to_string()))?
                .ok_or_else(|| Refusal::Unauthenticated("unknown token".into()))?;
            return if record.admin {
                Ok(Caller::Admin)
            } else if grants.iter().any(|(_, p)| p.contains(Permissions::WRITE)) {
                Ok(Caller::Token(hash))
            } else {
                Err(Refusal::Forbidden("this token lacks write permission on any table".into()))
            };
        }
        let table = match &need {
            Need::Read(t) | Need::Write(t) => Some(t.as_str()),
            Need::Token | Need::AnyWrite | Need::Admin => None,
        };
        let access = store
            .token_access(&hash, table)
            .map_err(|e| Refusal::Storage(e.to_string()))?
            .ok_or_else(|| Refusal::Unauthenticated("unknown token".into()))?;
        let caller = if access.admin { Caller::Admin } else { Caller::Token(hash) };
        let (allowed, what) = match &need {
            Need::Token | Need::AnyWrite => (true, String::new()),
            Need::Admin => (access.admin, "admin rights (this request needs an admin token)".to_string()),
            Need::Read(t) => (access.allows(Permissions::READ), format!("read permission on table `{t}`")),
            Need::Write(t) => (access.allows(Permissions::WRITE), format!("write permission on table `{t}`")),
        };
        if allowed {
            Ok(caller)
        } else {
            Err(Refusal::Forbidden(format!("this token lacks {what}")))
        }
    }

    /// Whether an MQTT client of the embedded broker may connect and publish to `table`: its
    /// password is a token with write permission on the table named by its username (or an
    /// admin token). Reads the store.
    pub fn mqtt_may_publish(&self, store: &Store, table: &str, password: &str) -> bool {
        if !self.enabled {
            return true;
        }
        let hash = hash_token(password);
        if self.admin_hash.as_ref().is_some_and(|a| same_hash(a, &hash)) {
            return true;
        }
        match store.token_access(&hash, Some(table)) {
            Ok(Some(access)) => access.allows(Permissions::WRITE),
            Ok(None) => false,
            Err(e) => {
                tracing::error!(error = %e, "checking an MQTT client's token failed; refusing it");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_hashes_compare() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a[3..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(same_hash(&hash_token(&a), &hash_token(&a)));
        assert!(!same_hash(&hash_token(&a), &hash_token(&b)));
        // SHA-256 of "abc" (FIPS 180-2 example).
        let abc: String = hash_token("abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(abc, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn bearer_headers_are_parsed_strictly() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().expect("header value"));
            h
        };
        assert_eq!(Auth::bearer(&with("Bearer abc")).as_deref(), Ok("abc"));
        assert_eq!(Auth::bearer(&with("bearer  abc ")).as_deref(), Ok("abc"));
        assert_eq!(Auth::bearer(&with("Token abc")).as_deref(), Ok("abc"));
        // Basic: the password ("telegraf:hg_abc", "x:a:b", ":abc").
        assert_eq!(Auth::bearer(&with("Basic dGVsZWdyYWY6aGdfYWJj")).as_deref(), Ok("hg_abc"));
        assert_eq!(Auth::bearer(&with("basic eDphOmI=")).as_deref(), Ok("a:b"));
        assert_eq!(Auth::bearer(&with("Basic OmFiYw==")).as_deref(), Ok("abc"));
        // Refused: no token, no password ("abc", "abc:"), not base64, not UTF-8, another scheme.
        for bad in
            ["Token ", "Bearer ", "Basic ", "Basic YWJj", "Basic YWJjOg==", "Basic abc", "Basic /w==", "Digest abc"]
        {
            assert_eq!(
                Auth::bearer(&with(bad)),
                Err(Refusal::Unauthenticated(
                    "the `Authorization` header is not `Bearer <token>` (nor `Basic` with the token as the password)"
                        .into()
                )),
                "{bad}"
            );
        }
        assert!(matches!(Auth::bearer(&HeaderMap::new()), Err(Refusal::Unauthenticated(_))));
    }
}

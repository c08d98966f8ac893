//! Scoped admin tokens: who may do what on the admin API, beside the bootstrap token from the
//! environment (`AI_ROUTER_ADMIN_TOKEN` or `gateway.adminToken`, always [`Scope::Admin`]).
//!
//! A token is `ara-` and 48 hex digits, handed out once by `create`; the key store keeps its
//! SHA-256 (lowercase hex), its label, scope, creation, expiry (`None`: no end), last use and
//! whether it is revoked (SQLite and Postgres: table `admin_tokens`). A presented token is
//! hashed and compared with every stored hash in constant time; a revoked token, or one whose
//! expiry has passed, is refused like an unknown one.
//!
//! Scopes are ordered: `read` (health, stats, catalog, ledger, usage, events, the console's
//! figures) < `operate` (plus reset) < `keys` (plus virtual-key administration) < `admin` (plus
//! admin tokens). Which route needs which scope is the table in [`crate::api::admin::routes`](mod@crate::api::admin::routes).

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::config::secrets::{constant_time_eq, sha256_hex, Secret};
use crate::keys::store::{utc_timestamp, KeyStore, KeyStoreError};

/// How every admin token starts.
pub const PREFIX: &str = "ara-";

pub use crate::keys::token_record::{Refusal, Scope, StoredToken, LAST_USED_GRAIN_MS};

/// The stored token `presented` is, compared by hash in constant time against every stored
/// one, and whether it may be used at `now_ms`.
pub fn find(tokens: &[StoredToken], presented: &str, now_ms: i64) -> Result<StoredToken, Refusal> {
    let hash = sha256_hex(presented);
    let mut found = None;
    // Every hash is compared (no early exit): the time does not tell which one matched.
    for token in tokens {
        if constant_time_eq(token.sha256.as_bytes(), hash.as_bytes()) {
            found = Some(token);
        }
    }
    let token = found.ok_or(Refusal::Unknown)?;
    token.usable(now_ms)?;
    Ok(token.clone())
}

/// A token as the API and the CLI show it: never the token nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub id: String,
    pub label: String,
    pub scope: Scope,
    pub created_at_ms: i64,
    pub created: String,
    pub expires_at_ms: Option<i64>,
    pub expires: Option<String>,
    pub last_used_at_ms: Option<i64>,
    pub last_used: Option<String>,
    pub revoked: bool,
    /// Past its expiry.
    pub expired: bool,
}

impl TokenInfo {
    pub fn of(token: &StoredToken, now_ms: i64) -> Self {
        Self {
            id: token.id.clone(),
            label: token.label.clone(),
            scope: token.scope,
            created_at_ms: token.created_at_ms,
            created: utc_timestamp(token.created_at_ms),
            expires_at_ms: token.expires_at_ms,
            expires: token.expires_at_ms.map(utc_timestamp),
            last_used_at_ms: token.last_used_ms,
            last_used: token.last_used_ms.map(utc_timestamp),
            revoked: token.revoked,
            expired: token.usable(now_ms) == Err(Refusal::Expired),
        }
    }
}

/// `create`'s answer: the token, shown this once.
#[derive(Debug, Clone, Serialize)]
pub struct TokenWithSecret {
    pub token: TokenInfo,
    pub secret: String,
}

/// What `POST /admin/tokens` takes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    pub label: String,
    pub scope: Scope,
    /// A duration (`90m`, `12h`, `30d`, `2w`) or an RFC 3339 time; absent: no end.
    #[serde(default)]
    pub expires: Option<String>,
}

fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 64
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// When a token given `expires` at `now_ms` stops working: `now_ms` plus a duration (`45s`,
/// `90m`, `12h`, `30d`, `2w`), or an RFC 3339 time (`2026-12-31T00:00:00Z`, with an offset or
/// fractions of a second). It must be in the future.
pub fn parse_expires(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    let at = match parse_duration_ms(text) {
        Some(ms) => now_ms.saturating_add(ms),
        None => parse_rfc3339_ms(text).ok_or_else(|| {
            format!(
                "expires: {text:?} is neither a duration (90m, 12h, 30d, 2w) nor an RFC 3339 time"
            )
        })?,
    };
    if at <= now_ms {
        return Err(format!("expires: {text:?} is not in the future"));
    }
    Ok(at)
}

fn parse_duration_ms(text: &str) -> Option<i64> {
    let unit = text.chars().last()?;
    let count: i64 = text[..text.len() - unit.len_utf8()].parse().ok()?;
    let ms = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        'w' => 7 * 86_400_000,
        _ => return None,
    };
    (count > 0).then(|| count.saturating_mul(ms))
}

/// `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)` as ms since the epoch.
fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    use ai_router_contract::calendar::days_from_civil;
    let (date, rest) = text.split_once(['T', 't'])?;
    let day = crate::keys::store::parse_day(date)?;
    let (y, m, d) = (
        day[0..4].parse::<i64>().ok()?,
        day[5..7].parse::<u32>().ok()?,
        day[8..10].parse::<u32>().ok()?,
    );
    let (clock, offset_ms) = if let Some(clock) = rest.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (clock, offset) = rest.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (oh, om) = offset[1..].split_once(':')?;
        let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
        if oh > 23 || om > 59 {
            return None;
        }
        (clock, sign * (oh * 3_600_000 + om * 60_000))
    };
    let clock = clock.split_once('.').map_or(clock, |(whole, _)| whole);
    let mut parts = clock.split(':');
    let (h, mi, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || h.len() != 2 || mi.len() != 2 || s.len() != 2 {
        return None;
    }
    let (h, mi, s): (i64, i64, i64) = (h.parse().ok()?, mi.parse().ok()?, s.parse().ok()?);
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let ms = days_from_civil(y, m, d) * 86_400_000 + (h * 3600 + mi * 60 + s) * 1000;
    Some(ms - offset_ms)
}

fn new_secret() -> Secret {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    Secret::new(format!("{PREFIX}{}", hex::encode(bytes)))
}

fn new_id() -> String {
    let mut bytes = [0u8; 8];
    rand::rng().fill_bytes(&mut bytes);
    format!("tok_{}", hex::encode(bytes))
}

/// Issues a token: stores its hash, answers the token once. Labels are unique among the tokens
/// not revoked (`revoke` takes a label).
pub fn create(
    store: &dyn KeyStore,
    spec: TokenSpec,
    now_ms: i64,
) -> Result<TokenWithSecret, KeyStoreError> {
    if !valid_label(&spec.label) {
        return Err(KeyStoreError::Invalid(
            "label: 1 to 64 lowercase letters, digits, _ or -".into(),
        ));
    }
    let expires_at_ms = spec
        .expires
        .as_deref()
        .map(|e| parse_expires(e, now_ms))
        .transpose()
        .map_err(KeyStoreError::Invalid)?;
    if store
        .admin_tokens()?
        .iter()
        .any(|t| t.label == spec.label && !t.revoked)
    {
        return Err(KeyStoreError::Invalid(format!(
            "label: an admin token labelled {} exists; revoke it first",
            spec.label
        )));
    }
    let secret = new_secret();
    let token = StoredToken {
        id: new_id(),
        label: spec.label,
        scope: spec.scope,
        sha256: sha256_hex(secret.expose()),
        created_at_ms: now_ms,
        expires_at_ms,
        last_used_ms: None,
        revoked: false,
    };
    store.insert_admin_token(&token)?;
    Ok(TokenWithSecret {
        token: TokenInfo::of(&token, now_ms),
        secret: secret.expose().to_owned(),
    })
}

/// Every token, revoked and expired ones included, oldest first.
pub fn list(store: &dyn KeyStore, now_ms: i64) -> Result<Vec<TokenInfo>, KeyStoreError> {
    let mut tokens = store.admin_tokens()?;
    tokens.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    Ok(tokens.iter().map(|t| TokenInfo::of(t, now_ms)).collect())
}

/// Revokes the token with that id, or the one not revoked with that label.
pub fn revoke(
    store: &dyn KeyStore,
    label_or_id: &str,
    now_ms: i64,
) -> Result<TokenInfo, KeyStoreError> {
    let tokens = store.admin_tokens()?;
    let mut token = tokens
        .iter()
        .find(|t| t.id == label_or_id)
        .or_else(|| tokens.iter().find(|t| t.label == label_or_id && !t.revoked))
        .cloned()
        .ok_or_else(|| KeyStoreError::NotFound(format!("admin token {label_or_id}")))?;
    if !token.revoked {
        token.revoked = true;
        store.update_admin_token(&token)?;
    }
    Ok(TokenInfo::of(&token, now_ms))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys::memory::MemoryKeyStore;
    use crate::keys::sqlite::SqliteKeyStore;

    // 2026-03-15T12:00:00Z
    const NOW: i64 = 1_773_576_000_000;

    #[test]
    fn scopes_include_the_ones_before() {
        assert!(Scope::Admin.covers(Scope::Keys));
        assert!(Scope::Keys.covers(Scope::Operate));
        assert!(Scope::Operate.covers(Scope::Read));
        assert!(!Scope::Read.covers(Scope::Operate));
        assert!(!Scope::Operate.covers(Scope::Keys));
        assert!(!Scope::Keys.covers(Scope::Admin));
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.text()), Some(s));
        }
        assert_eq!(Scope::parse("root"), None);
    }

    #[test]
    fn expiry_takes_durations_and_rfc3339() {
        assert_eq!(parse_expires("90m", NOW), Ok(NOW + 90 * 60_000));
        assert_eq!(parse_expires("30d", NOW), Ok(NOW + 30 * 86_400_000));
        assert_eq!(parse_expires("2w", NOW), Ok(NOW + 14 * 86_400_000));
        assert_eq!(
            parse_expires("2026-03-16T12:00:00Z", NOW),
            Ok(NOW + 86_400_000)
        );
        assert_eq!(
            parse_expires("2026-03-16T14:00:00.250+02:00", NOW),
            Ok(NOW + 86_400_000)
        );
        for refused in [
            "2026-03-15T11:59:59Z",
            "0s",
            "-5m",
            "soon",
            "2026-02-30T00:00:00Z",
            "",
        ] {
            assert!(parse_expires(refused, NOW).is_err(), "{refused}");
        }
    }

    fn stored(scope: Scope, expires_at_ms: Option<i64>) -> (StoredToken, Secret) {
        let secret = new_secret();
        let token = StoredToken {
            id: new_id(),
            label: "ops".into(),
            scope,
            sha256: sha256_hex(secret.expose()),
            created_at_ms: NOW,
            expires_at_ms,
            last_used_ms: None,
            revoked: false,
        };
        (token, secret)
    }

    #[test]
    fn a_token_is_found_by_hash_until_it_expires_or_is_revoked() {
        let (live, live_secret) = stored(Scope::Read, None);
        let (ending, ending_secret) = stored(Scope::Operate, Some(NOW + 1_000));
        let tokens = vec![live.clone(), ending.clone()];
        assert_eq!(find(&tokens, live_secret.expose(), NOW), Ok(live.clone()));
        assert_eq!(
            find(&tokens, ending_secret.expose(), NOW + 999).map(|t| t.scope),
            Ok(Scope::Operate)
        );
        assert_eq!(
            find(&tokens, ending_secret.expose(), NOW + 1_000),
            Err(Refusal::Expired)
        );
        assert_eq!(find(&tokens, "ara-nope", NOW), Err(Refusal::Unknown));
        // The hash itself is no token.
        assert_eq!(find(&tokens, &live.sha256, NOW), Err(Refusal::Unknown));
        let revoked = StoredToken {
            revoked: true,
            ..live
        };
        assert_eq!(
            find(&[revoked], live_secret.expose(), NOW),
            Err(Refusal::Revoked)
        );
    }

    #[test]
    fn last_use_is_written_once_a_minute() {
        let (mut token, _) = stored(Scope::Read, None);
        assert!(token.use_is_news(NOW));
        token.last_used_ms = Some(NOW);
        assert!(!token.use_is_news(NOW + LAST_USED_GRAIN_MS - 1));
        assert!(token.use_is_news(NOW + LAST_USED_GRAIN_MS));
    }

    /// Create, list, revoke by label and by id, on a store; the token never in a listing.
    pub(crate) fn exercise(store: &dyn KeyStore) -> Result<(), KeyStoreError> {
        let spec = |label: &str, scope, expires: Option<&str>| TokenSpec {
            label: label.into(),
            scope,
            expires: expires.map(str::to_owned),
        };
        let ops = create(store, spec("ops", Scope::Operate, Some("1h")), NOW)?;
        assert!(ops.secret.starts_with(PREFIX) && ops.secret.len() == PREFIX.len() + 48);
        assert_eq!(ops.token.expires_at_ms, Some(NOW + 3_600_000));
        assert_eq!(ops.token.expires.as_deref(), Some("2026-03-15T13:00:00Z"));
        let viewer = create(store, spec("viewer", Scope::Read, None), NOW + 1)?;
        assert!(matches!(
            create(store, spec("ops", Scope::Read, None), NOW),
            Err(KeyStoreError::Invalid(_))
        ));
        assert!(matches!(
            create(store, spec("Bad Label", Scope::Read, None), NOW),
            Err(KeyStoreError::Invalid(_))
        ));
        let listed = list(store, NOW)?;
        assert_eq!(listed, vec![ops.token.clone(), viewer.token.clone()]);
        let text = serde_json::to_string(&listed).unwrap_or_default();
        assert!(!text.contains(&ops.secret) && !text.contains(&sha256_hex(&ops.secret)));
        let found = find(&store.admin_tokens()?, &ops.secret, NOW);
        assert_eq!(found.map(|t| t.label), Ok("ops".to_owned()));

        let mut used = store
            .admin_tokens()?
            .into_iter()
            .find(|t| t.label == "viewer")
            .ok_or_else(|| KeyStoreError::NotFound("viewer".into()))?;
        used.last_used_ms = Some(NOW + 5);
        store.update_admin_token(&used)?;
        assert_eq!(list(store, NOW)?[1].last_used_at_ms, Some(NOW + 5));

        assert!(revoke(store, "ops", NOW)?.revoked);
        assert!(revoke(store, &viewer.token.id, NOW)?.revoked);
        assert!(matches!(
            revoke(store, "nobody", NOW),
            Err(KeyStoreError::NotFound(_))
        ));
        assert_eq!(
            find(&store.admin_tokens()?, &ops.secret, NOW),
            Err(Refusal::Revoked)
        );
        // A revoked label may be issued again.
        create(store, spec("ops", Scope::Admin, None), NOW + 2)?;
        assert_eq!(list(store, NOW)?.len(), 3);
        Ok(())
    }

    #[test]
    fn memory_store() -> Result<(), KeyStoreError> {
        exercise(&MemoryKeyStore::default())
    }

    #[test]
    fn sqlite_store() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("ai-router-tokens-{}", new_id()));
        let path = dir.join("keys.db");
        exercise(&SqliteKeyStore::open(&path)?)?;
        // Another process opening the file sees them.
        assert_eq!(SqliteKeyStore::open(&path)?.admin_tokens()?.len(), 3);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}

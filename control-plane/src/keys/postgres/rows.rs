//! Rows and errors: a key row decoded, a database error as the admin API may show it, the
//! usage batch written once.

use serde_json::Value;

use crate::config::QuotaConfig;
use crate::keys::store::{BudgetUse, StoredKey, UsageDay};

pub(super) const KEY_COLUMNS: &str =
    "id, label, sha256, hint, owner, profiles, models, allow_fallback, \
     requests_per_minute, tokens_per_day, cost_per_day, cost_per_month, enabled, revoked, \
     created_at_ms, cache";

/// Usage rows and their budgets' use, written in one transaction, once.
#[derive(Clone, Debug)]
pub(super) struct UsageBatch {
    /// This store's own id for the write (a lost commit retried is recognised by it).
    pub(super) id: String,
    pub(super) rows: Vec<(String, UsageDay)>,
    /// The budgets' use of the same charges.
    pub(super) budgets: Vec<BudgetUse>,
    /// The filter's report batches these rows came from, marked counted with them.
    pub(super) reports: Vec<String>,
}

/// How an outage's messages start (a refused statement's do not).
pub(super) const UNREACHABLE: &str = "postgres does not answer";

/// How a refused TLS handshake's message goes on after [`UNREACHABLE`].
const TLS_FAILED: &str = "the TLS handshake failed";

/// Whether an outage's message (`KeyStoreError::Unavailable`) is one that waiting may end: not
/// a TLS handshake refused (a certificate that does not verify, a server without TLS).
pub fn waiting_helps(message: &str) -> bool {
    message.starts_with(UNREACHABLE) && !message.contains(TLS_FAILED)
}

/// A database error as the admin API may show it: no URL, no password.
pub(super) fn pg_error(err: &tokio_postgres::Error) -> String {
    if let Some(why) = crate::tls::client::handshake_failure(err) {
        return format!("{UNREACHABLE}: {TLS_FAILED}: {why}");
    }
    match err.as_db_error() {
        // A server starting up or shutting down (the Postgres image's init-time server stops
        // before the real one starts) answers, but serves nothing: an outage, not a refusal.
        Some(db) if not_serving(db.code()) => format!("{UNREACHABLE}: {}", db.message()),
        Some(db) => format!("postgres: {}", db.message()),
        None if err
            .to_string()
            .starts_with("error performing TLS handshake") =>
        {
            match std::error::Error::source(err) {
                // The server closing the connection in the middle of the handshake (a server
                // starting or going away does) is an outage like any closed connection.
                Some(cause) if cut_short(cause) => {
                    format!("{UNREACHABLE}: the connection closed during the TLS handshake")
                }
                // "server does not support TLS": tokio-postgres' own words.
                cause => format!(
                    "{UNREACHABLE}: {TLS_FAILED}: {}",
                    cause.map_or_else(String::new, ToString::to_string)
                ),
            }
        }
        None if err.is_closed() => format!("{UNREACHABLE}: the connection closed"),
        None => format!("{UNREACHABLE}: no connection"),
    }
}

/// Whether a handshake's error is the connection cut short (closed, reset, aborted, timed out)
/// rather than an answer the handshake refused.
pub(super) fn cut_short(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    err.downcast_ref::<std::io::Error>().is_some_and(|io| {
        io.get_ref()
            .is_none_or(|inner| !inner.is::<rustls::Error>())
            && matches!(
                io.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::TimedOut
            )
    })
}

/// The codes of a server that does not serve now: starting up, shutting down, or restarting
/// after a crash (class 57P).
pub(super) fn not_serving(code: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    [
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
    ]
    .contains(code)
}

pub(super) fn pool_error(err: &deadpool_postgres::PoolError) -> String {
    match err {
        deadpool_postgres::PoolError::Backend(e) => pg_error(e),
        deadpool_postgres::PoolError::Timeout(_) => {
            format!("{UNREACHABLE}: no connection within the deadline")
        }
        _ => format!("{UNREACHABLE}: no connection"),
    }
}

pub(super) fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn key_from_row(row: &tokio_postgres::Row) -> Result<StoredKey, String> {
    let list = |i: usize| -> Result<Vec<String>, String> {
        let v: Value = row.try_get(i).map_err(|e| e.to_string())?;
        serde_json::from_value(v).map_err(|e| e.to_string())
    };
    let get_err = |e: tokio_postgres::Error| e.to_string();
    Ok(StoredKey {
        id: row.try_get(0).map_err(get_err)?,
        label: row.try_get(1).map_err(get_err)?,
        sha256: row.try_get(2).map_err(get_err)?,
        hint: row.try_get(3).map_err(get_err)?,
        owner: row.try_get(4).map_err(get_err)?,
        profiles: list(5)?,
        models: list(6)?,
        allow_fallback: row.try_get(7).map_err(get_err)?,
        quota: QuotaConfig {
            requests_per_minute: row
                .try_get::<_, Option<i64>>(8)
                .map_err(get_err)?
                .map(u64_of),
            tokens_per_day: row
                .try_get::<_, Option<i64>>(9)
                .map_err(get_err)?
                .map(u64_of),
            cost_per_day: row.try_get(10).map_err(get_err)?,
            cost_per_month: row.try_get(11).map_err(get_err)?,
        },
        enabled: row.try_get(12).map_err(get_err)?,
        revoked: row.try_get(13).map_err(get_err)?,
        created_at_ms: row.try_get(14).map_err(get_err)?,
        cache: row.try_get(15).map_err(get_err)?,
    })
}

pub(super) enum Write {
    Inserted,
    Replaced,
    Missing,
    Duplicate,
}

pub(super) fn new_batch_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

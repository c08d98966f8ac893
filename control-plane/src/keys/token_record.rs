//! An admin token as the key store holds it (its hash, its scope, its life), without the rules
//! of issuing and presenting one (`admin_tokens`): the store and those rules both use it.

use serde::{Deserialize, Serialize};

/// A token's last use is written at most this often (a busy console polls every second).
pub const LAST_USED_GRAIN_MS: i64 = 60_000;

/// What a token may do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Operate,
    Keys,
    Admin,
}

impl Scope {
    pub const ALL: [Self; 4] = [Self::Read, Self::Operate, Self::Keys, Self::Admin];

    pub fn text(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Operate => "operate",
            Self::Keys => "keys",
            Self::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.text() == text)
    }

    /// Whether a token of this scope may call a route that needs `need`.
    pub fn covers(self, need: Scope) -> bool {
        self >= need
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

/// A token as the store holds it: its hash, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredToken {
    pub id: String,
    pub label: String,
    pub scope: Scope,
    pub sha256: String,
    pub created_at_ms: i64,
    /// `None`: no end.
    pub expires_at_ms: Option<i64>,
    pub last_used_ms: Option<i64>,
    pub revoked: bool,
}

/// Why a presented token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Unknown,
    Revoked,
    Expired,
}

impl StoredToken {
    /// Whether this token may be used at `now_ms`.
    pub fn usable(&self, now_ms: i64) -> Result<(), Refusal> {
        if self.revoked {
            Err(Refusal::Revoked)
        } else if self.expires_at_ms.is_some_and(|end| now_ms >= end) {
            Err(Refusal::Expired)
        } else {
            Ok(())
        }
    }

    /// Whether its last use should be written again at `now_ms`.
    pub fn use_is_news(&self, now_ms: i64) -> bool {
        self.last_used_ms
            .is_none_or(|at| now_ms - at >= LAST_USED_GRAIN_MS)
    }
}

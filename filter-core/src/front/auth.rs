//! Who calls: the virtual key (from `Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or
//! Gemini's `?key=`), the admin token, and the key's quotas.

use ai_router_contract::sha256_hex;
use ai_router_proto::v1::VirtualKey;

use super::quota;
use super::Front;
use crate::answer::errors::GatewayError;
use crate::host::{Host, Side};
use crate::state::State;
use ai_router_contract::error_code::ErrorCode;

impl Front {
    /// Whether the request carries the admin token (its SHA-256 is pushed with the state).
    pub(super) fn is_admin(&self, host: &impl Host, state: &State) -> bool {
        let Some(expected) = state
            .snapshot
            .limits
            .as_ref()
            .map(|l| l.admin_token_sha256.as_str())
            .filter(|h| !h.is_empty())
        else {
            return false;
        };
        host.header_text(Side::Request, "authorization")
            .and_then(|h| bearer_token(&h).map(|t| sha256_hex(t.as_bytes())))
            .is_some_and(|given| given == expected)
    }

    /// The virtual key of the bearer token, or an answer already sent.
    pub(super) fn authenticate(&mut self, host: &mut impl Host) -> Option<VirtualKey> {
        let header = match host.header(Side::Request, "authorization") {
            None => String::new(),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    self.reply(
                        host,
                        GatewayError::new(ErrorCode::InvalidRequest, "The Authorization header is not valid text; send `Bearer <virtual key>`.",
                        )
                        .with_param("authorization"),
                    );
                    return None;
                }
            },
        };
        // Anthropic clients, and some OpenAI-compatible ones, send the key as `x-api-key`:
        // taken on every route when there is no `Authorization`.
        // Gemini clients send it as `x-goog-api-key` or `?key=`.
        let api_key = match header.is_empty() {
            true => host
                .header_text(Side::Request, "x-api-key")
                .or_else(|| host.header_text(Side::Request, "x-goog-api-key"))
                .or_else(|| self.query_key.clone())
                .unwrap_or_default(),
            false => String::new(),
        };
        let token = bearer_token(&header).unwrap_or(api_key.trim());
        if token.is_empty() {
            self.reply(host, GatewayError::missing_api_key());
            return None;
        }
        match host.virtual_key(&sha256_hex(token.as_bytes())) {
            Some(k) if k.enabled => {
                self.vk_id = k.id.clone();
                Some(k)
            }
            _ => {
                self.reply(host, GatewayError::invalid_api_key());
                None
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value.
pub(super) fn bearer_token(header: &str) -> Option<&str> {
    header
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
}

/// The key's quota answer, if any: a block the control plane pushed, else the request past
/// `requests_per_minute` in this UTC minute (admitted from the blocks of the minute's budget
/// this Envoy took, `minute_lease`). A call that could not be counted goes through.
pub(super) fn quota_refusal(
    host: &mut impl Host,
    key: &VirtualKey,
    now: i64,
) -> Option<GatewayError> {
    if let Some(err) = quota::blocked(key, now) {
        return Some(err);
    }
    if key.requests_per_minute == 0 {
        return None;
    }
    match host.admit_minute_request(&key.id, key.requests_per_minute, now) {
        Some(false) => Some(quota::minute_refusal(key.requests_per_minute, now)),
        _ => None,
    }
}

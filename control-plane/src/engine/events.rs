//! The operator's events: what each attempt and each call did, breakers changing phase, keys
//! taken out and brought back, budgets past their warnAt or their limit. Each one is one JSON line on the log (target
//! `ai_router::events`) and goes to every live subscriber (`GET /admin/events`, the gRPC
//! `Events` stream, `ai-router events`). Keys are named by provider and alias, never by secret;
//! no prompt or answer is in them, unless `telemetry.includeContent` adds an attempt's
//! `content` (the request body and the provider's answer, each cut to
//! `contract::defaults::CONTENT_MAX_BYTES` by the filter, the key's secret redacted).
//!
//! Subscribers read from a bounded broadcast channel: one that falls behind loses the oldest
//! events and is told how many, and never slows the report path.

use serde::Serialize;
use tokio::sync::broadcast;

/// Events kept for a slow subscriber before it starts losing them.
pub const BUFFER: usize = 4_096;

/// The event types, as `type` names them and `?types=` filters them.
pub const TYPES: [&str; 7] = [
    "attempt",
    "request",
    "breaker",
    "key-disabled",
    "key-restored",
    "budget",
    "admin",
];

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Event {
    #[serde(rename_all = "camelCase")]
    Attempt {
        at_ms: i64,
        request_id: String,
        operation: String,
        attempt: u32,
        provider: String,
        key: String,
        model: String,
        latency_ms: u64,
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error_class: Option<String>,
        status: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        /// Where `usage` comes from: `reported` by the provider, or `estimated` by the gateway
        /// when the provider reported none (what budgets and quotas then count).
        #[serde(skip_serializing_if = "Option::is_none")]
        usage_source: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cost: Option<f64>,
        /// With `telemetry.includeContent` only.
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<Content>,
    },
    #[serde(rename_all = "camelCase")]
    Request {
        at_ms: i64,
        request_id: String,
        operation: String,
        /// success, error or rejected
        outcome: String,
        attempts: u32,
        latency_ms: u64,
        status: u32,
        /// The answering lane on success, else the last attempt's; absent when no attempt was
        /// sent (refused, answered from the cache with no provider named).
        #[serde(skip_serializing_if = "Option::is_none")]
        provider: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// The failure class (error) or the refusal code (rejected).
        #[serde(skip_serializing_if = "Option::is_none")]
        error_class: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    Breaker {
        at_ms: i64,
        scope: &'static str,
        provider: String,
        /// Empty for the provider scope.
        key: String,
        from: &'static str,
        to: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    KeyDisabled {
        at_ms: i64,
        provider: String,
        key: String,
        reason: &'static str,
        /// 0: until its secret changes.
        until_ms: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    KeyRestored {
        at_ms: i64,
        provider: String,
        key: String,
        was: &'static str,
        reason: &'static str,
    },
    /// A budget policy went past its `warnAt` (`level: warn`) or its limit (`level: over`) in
    /// its window: once per level and window.
    #[serde(rename_all = "camelCase")]
    Budget {
        at_ms: i64,
        budget: String,
        scope: &'static str,
        window: &'static str,
        /// The key id, profile name or provider id; empty for the pool.
        subject: String,
        level: &'static str,
        enforcement: &'static str,
        tokens: u64,
        cost: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_tokens: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_cost: Option<f64>,
        /// When the window ends.
        until_ms: i64,
    },
    /// An operator's action through the admin API: `reset`, `key-created`, `key-updated`,
    /// `key-revoked`, `key-rotated`, `token-created`, `token-revoked`. `by` is the calling
    /// token's label (`bootstrap` for the token from the environment), never the token.
    #[serde(rename_all = "camelCase")]
    Admin {
        at_ms: i64,
        action: &'static str,
        by: String,
        scope: &'static str,
        /// What it acted on: a key or token id, a provider (reset); absent for the pool.
        #[serde(skip_serializing_if = "Option::is_none")]
        target: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What an attempt carried (`telemetry.includeContent`), as the filter bounded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    /// The request body as the caller sent it.
    pub request: String,
    pub request_truncated: bool,
    /// The provider's answer as it came (a stream: its events); empty when none came.
    pub response: String,
    pub response_truncated: bool,
}

impl Content {
    /// The report's content, bounded again here: a report is trusted for its numbers, and
    /// an event stays small whatever a filter sent.
    pub fn from_report(c: &ai_router_proto::v1::AttemptContent) -> Self {
        let (request, request_cut) = bounded(&c.request);
        let (response, response_cut) = bounded(&c.response);
        Self {
            request,
            request_truncated: c.request_truncated || request_cut,
            response,
            response_truncated: c.response_truncated || response_cut,
        }
    }
}

/// `text` cut to `CONTENT_MAX_BYTES` on a char boundary; whether it was cut.
fn bounded(text: &str) -> (String, bool) {
    let max = ai_router_contract::defaults::CONTENT_MAX_BYTES;
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

impl Event {
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Attempt { .. } => "attempt",
            Self::Request { .. } => "request",
            Self::Breaker { .. } => "breaker",
            Self::KeyDisabled { .. } => "key-disabled",
            Self::KeyRestored { .. } => "key-restored",
            Self::Budget { .. } => "budget",
            Self::Admin { .. } => "admin",
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Where events go: the log and the live subscribers.
#[derive(Debug)]
pub struct EventBus {
    sender: broadcast::Sender<Event>,
    /// Flips at shutdown: live streams end so the servers can drain.
    closed: tokio::sync::watch::Sender<bool>,
}

impl Default for EventBus {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(BUFFER);
        let (closed, _) = tokio::sync::watch::channel(false);
        Self { sender, closed }
    }
}

/// What a live subscriber gets next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Event(Box<Event>),
    /// It fell behind: this many events were lost.
    Lagged(u64),
}

/// One live subscription, filtered by type.
#[derive(Debug)]
pub struct Subscription {
    events: broadcast::Receiver<Event>,
    closed: tokio::sync::watch::Receiver<bool>,
    types: Vec<&'static str>,
}

impl Subscription {
    /// The next event of the asked types; `None` once the bus is closed.
    pub async fn next(&mut self) -> Option<Next> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            let got = tokio::select! {
                got = self.events.recv() => got,
                _ = self.closed.changed() => return None,
            };
            match got {
                Ok(e) if self.types.contains(&e.type_name()) => {
                    return Some(Next::Event(Box::new(e)))
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Next::Lagged(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl EventBus {
    pub fn emit(&self, event: Event) {
        match &event {
            // One per call and attempt: on the log at debug (RUST_LOG=ai_router::events=debug).
            Event::Attempt { .. } | Event::Request { .. } => {
                if tracing::enabled!(target: "ai_router::events", tracing::Level::DEBUG) {
                    tracing::debug!(target: "ai_router::events", "{}", event.to_json());
                }
            }
            Event::KeyRestored { .. } | Event::Admin { .. } => {
                tracing::info!(target: "ai_router::events", "{}", event.to_json());
            }
            Event::Breaker { .. } | Event::KeyDisabled { .. } | Event::Budget { .. } => {
                tracing::warn!(target: "ai_router::events", "{}", event.to_json());
            }
        }
        // No subscriber is fine.
        let _ = self.sender.send(event);
    }

    /// Whether per-call events have anyone to go to (a subscriber, or the log at debug): the
    /// report path builds them only then.
    pub fn wants_calls(&self) -> bool {
        self.sender.receiver_count() > 0
            || tracing::enabled!(target: "ai_router::events", tracing::Level::DEBUG)
    }

    /// A live subscription to `types`.
    pub fn watch(&self, types: Vec<&'static str>) -> Subscription {
        Subscription {
            events: self.sender.subscribe(),
            closed: self.closed.subscribe(),
            types,
        }
    }

    /// Ends every live subscription (shutdown).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }
}

/// Which types a subscriber asked for (`?types=a,b`); `None` or empty: all. Unknown names are
/// refused with the list of known ones.
pub fn parse_types(list: Option<&str>) -> Result<Vec<&'static str>, String> {
    let Some(list) = list.filter(|l| !l.trim().is_empty()) else {
        return Ok(TYPES.to_vec());
    };
    list.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            TYPES
                .iter()
                .find(|k| **k == t)
                .copied()
                .ok_or_else(|| format!("unknown event type {t:?}: one of {}", TYPES.join(", ")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gRPC enum names the same types as the text (one vocabulary).
    #[test]
    fn the_grpc_event_types_are_the_text_ones() {
        let texts: Vec<&str> = ai_router_proto::v1::AdminEventType::ASKABLE
            .iter()
            .map(|t| t.text())
            .collect();
        assert_eq!(texts, TYPES);
    }

    #[test]
    fn events_are_json_lines_named_by_type() {
        let e = Event::KeyDisabled {
            at_ms: 5,
            provider: "p".into(),
            key: "a".into(),
            reason: "quota",
            until_ms: 9,
            code: None,
        };
        assert_eq!(
            e.to_json(),
            r#"{"type":"key-disabled","atMs":5,"provider":"p","key":"a","reason":"quota","untilMs":9}"#
        );
        assert_eq!(e.type_name(), "key-disabled");
    }

    #[test]
    fn content_is_in_an_attempt_event_only_when_given_and_stays_bounded() {
        let attempt = |content| Event::Attempt {
            at_ms: 1,
            request_id: "r".into(),
            operation: "chat".into(),
            attempt: 1,
            provider: "p".into(),
            key: "a".into(),
            model: "m".into(),
            latency_ms: 2,
            outcome: "success".into(),
            error_class: None,
            status: 200,
            usage: None,
            usage_source: None,
            cost: None,
            content,
        };
        assert!(!attempt(None).to_json().contains("content"));
        let max = ai_router_contract::defaults::CONTENT_MAX_BYTES;
        let report = ai_router_proto::v1::AttemptContent {
            request: "{\"messages\":[]}".into(),
            request_truncated: false,
            response: "é".repeat(max),
            response_truncated: false,
        };
        let content = Content::from_report(&report);
        assert_eq!(content.request, "{\"messages\":[]}");
        assert!(content.response.len() <= max && content.response_truncated);
        let json: serde_json::Value =
            serde_json::from_str(&attempt(Some(content)).to_json()).unwrap_or_default();
        assert_eq!(json["content"]["request"], "{\"messages\":[]}");
        assert_eq!(json["content"]["requestTruncated"], false);
        assert_eq!(json["content"]["responseTruncated"], true);
    }

    #[tokio::test]
    async fn a_slow_subscriber_loses_the_oldest_and_is_told() {
        let bus = EventBus::default();
        let mut sub = bus.watch(TYPES.to_vec());
        for i in 0..(BUFFER + 10) {
            bus.emit(Event::KeyRestored {
                at_ms: i as i64,
                provider: "p".into(),
                key: "a".into(),
                was: "auth",
                reason: "reset",
            });
        }
        assert_eq!(sub.next().await, Some(Next::Lagged(10)));
        assert!(matches!(
            sub.next().await,
            Some(Next::Event(e)) if matches!(*e, Event::KeyRestored { at_ms: 10, .. })
        ));
        bus.close();
        assert_eq!(sub.next().await, None, "closed at shutdown");
    }

    #[test]
    fn types_filter() {
        assert_eq!(parse_types(None).map(|t| t.len()), Ok(7));
        assert_eq!(
            parse_types(Some("breaker, key-disabled")),
            Ok(vec!["breaker", "key-disabled"])
        );
        assert!(parse_types(Some("breaker,nope")).is_err());
    }
}

//! Session affinity: follow-ups of one conversation go to the lane (provider, key, model) that
//! served it last, so the provider's prompt cache keeps hitting.
//!
//! - The session is the `x-ai-router-session` header, else the body's `prompt_cache_key`, else
//!   its `user`; it is scoped to the virtual key (two keys' sessions of one name never meet)
//!   and kept only as a 64-bit digest of both.
//! - A successful attempt pins the session to its lane; the next call of the session takes
//!   that lane first while it is usable. When its key or provider is out, the call fails over
//!   as usual (the plan's tiers already put the same family before another) and the lane that
//!   answers re-pins the session.
//! - Pins live in a fixed table of [`SLOTS`] slots per Envoy process (shared data, seen by
//!   every worker): the memory is bounded whatever the number of sessions (at most
//!   `SLOTS` records, each the digest, the lane's provider, key and model names and a time:
//!   under 200 bytes for usual ids, under 1 MB in all). A session maps to one slot by its digest; a newer
//!   session on the same slot replaces the older one (its next call picks as if unpinned).
//!   A pin unused for `selection.affinity.idleMs` lapses. Two Envoy processes keep their own
//!   tables: a session whose calls alternate between them may be pinned differently on each.
//! - The same slot scheme keeps a second table, [`RESPONSES`]: which key stored a Responses
//!   call's answer (`crate::lanes::response_pins`). Each table has its own slots (the shared-data
//!   names `ai-router/affinity/{slot}`, sessions first, then stored responses), so neither
//!   evicts the other's records.

use serde_json::Value;

use crate::host::Host;
use crate::vocab::LaneId;

/// Pins per Envoy process.
pub const SLOTS: u64 = 4096;

/// A table of pins: a digest (16 hex digits) to the lane it is pinned to, in a fixed range of
/// shared-data slots. A digest maps to one slot; a newer digest on the slot replaces the older.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    first: u64,
    slots: u64,
}

/// Session pins.
pub const SESSIONS: Table = Table {
    first: 0,
    slots: SLOTS,
};

/// Stored responses: the lane whose key stored a response (`crate::lanes::response_pins`).
pub const RESPONSES: Table = Table {
    first: SLOTS,
    slots: 8192,
};

/// `what`, scoped to the virtual key: a digest of both, which alone is kept (16 hex digits).
pub fn digest(vk_id: &str, what: &str) -> String {
    let digest = ai_router_contract::fingerprint(&format!("{vk_id}\u{0}{what}"));
    format!("{digest:016x}")
}

/// The session of a call, digested with its virtual key; `None`: no session.
pub fn session_of(vk_id: &str, header: Option<&str>, body: &Value) -> Option<String> {
    let from_body = |field: &str| body.get(field).and_then(Value::as_str).map(str::to_owned);
    let session = header
        .map(str::to_owned)
        .or_else(|| from_body("prompt_cache_key"))
        .or_else(|| from_body("user"))
        .filter(|s| !s.trim().is_empty())?;
    Some(digest(vk_id, &session))
}

/// One slot's record: `digest \t provider \t key \t model \t used_ms`.
fn encode(digest: &str, lane: &LaneId, used_ms: i64) -> Vec<u8> {
    format!(
        "{digest}\t{}\t{}\t{}\t{used_ms}",
        lane.provider, lane.key, lane.model
    )
    .into_bytes()
}

fn decode(bytes: &[u8]) -> Option<(String, LaneId, i64)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.split('\t');
    let digest = parts.next()?.to_owned();
    let lane = LaneId::new(parts.next()?, parts.next()?, parts.next()?);
    let used_ms = parts.next()?.parse().ok()?;
    Some((digest, lane, used_ms))
}

impl Table {
    /// How many records the table holds at most.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    fn slot_of(&self, digest: &str) -> u64 {
        self.first + u64::from_str_radix(digest, 16).unwrap_or(0) % self.slots
    }

    /// The lane `digest` is pinned to, when its pin has not lapsed (`idle_ms` 0: the table is
    /// off).
    pub fn pinned(
        &self,
        host: &impl Host,
        digest: &str,
        idle_ms: u64,
        now_ms: i64,
    ) -> Option<LaneId> {
        if idle_ms == 0 {
            return None;
        }
        let (owner, lane, used_ms) = decode(&host.affinity_slot(self.slot_of(digest))?)?;
        (owner == digest && now_ms.saturating_sub(used_ms) <= idle_ms as i64).then_some(lane)
    }

    /// Pins `digest` to `lane` as of `now_ms`.
    pub fn remember(
        &self,
        host: &mut impl Host,
        digest: &str,
        idle_ms: u64,
        lane: &LaneId,
        now_ms: i64,
    ) {
        if idle_ms == 0 {
            return;
        }
        host.set_affinity_slot(self.slot_of(digest), &encode(digest, lane, now_ms));
    }
}

/// The lane the session is pinned to, when its pin has not lapsed.
pub fn pinned(host: &impl Host, session: &str, idle_ms: u64, now_ms: i64) -> Option<LaneId> {
    SESSIONS.pinned(host, session, idle_ms, now_ms)
}

/// Pins the session to the lane that just answered it.
pub fn remember(host: &mut impl Host, session: &str, idle_ms: u64, lane: &LaneId, now_ms: i64) {
    SESSIONS.remember(host, session, idle_ms, lane, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;
    use serde_json::json;

    #[test]
    fn the_session_comes_from_the_header_then_the_body_and_is_scoped_to_the_key() {
        let body = json!({"user": "u1", "prompt_cache_key": "c1"});
        let by_header = session_of("vk1", Some("s1"), &body);
        assert_eq!(by_header, session_of("vk1", Some("s1"), &json!({})));
        assert_eq!(
            session_of("vk1", None, &body),
            session_of("vk1", None, &json!({"prompt_cache_key": "c1"}))
        );
        assert_eq!(
            session_of("vk1", None, &json!({"user": "u1"})),
            session_of("vk1", Some("u1"), &json!({}))
        );
        assert_ne!(
            session_of("vk1", Some("s1"), &body),
            session_of("vk2", Some("s1"), &body)
        );
        assert_eq!(session_of("vk1", None, &json!({"user": "  "})), None);
        // Only a digest: the session's own text is not kept.
        let s = session_of("vk1", Some("conversation-123"), &body).unwrap_or_default();
        assert_eq!(s.len(), 16);
        assert!(!s.contains("conversation"));
    }

    #[test]
    fn a_pin_holds_until_it_idles_out_and_a_newer_session_on_its_slot_replaces_it() {
        let mut host = FakeHost::default();
        let lane = LaneId::new("p1", "a", "m1");
        let s = "00000000000000aa";
        assert_eq!(pinned(&host, s, 1000, 0), None);
        remember(&mut host, s, 1000, &lane, 10_000);
        assert_eq!(pinned(&host, s, 1000, 10_500), Some(lane.clone()));
        assert_eq!(pinned(&host, s, 1000, 11_000), Some(lane.clone()));
        assert_eq!(pinned(&host, s, 1000, 11_001), None);
        // Use refreshes it.
        remember(&mut host, s, 1000, &lane, 11_000);
        assert_eq!(pinned(&host, s, 1000, 11_900), Some(lane.clone()));
        // Another session on the same slot (its digest equal modulo SLOTS) evicts it.
        let other = format!("{:016x}", 0xaa + SLOTS);
        remember(
            &mut host,
            &other,
            1000,
            &LaneId::new("p2", "c", "m1"),
            11_900,
        );
        assert_eq!(pinned(&host, s, 1000, 11_950), None);
        assert_eq!(host.affinity.len(), 1);
        // Affinity off: nothing pinned, nothing read.
        remember(&mut host, s, 0, &lane, 12_000);
        assert_eq!(pinned(&host, s, 0, 12_000), None);
    }

    #[test]
    fn memory_is_bounded_by_the_slot_count() {
        let mut host = FakeHost::default();
        let lane = LaneId::new("p1", "a", "m1");
        for i in 0..20_000 {
            let s = session_of("vk", Some(&format!("s{i}")), &json!({})).unwrap_or_default();
            remember(&mut host, &s, 1000, &lane, 0);
        }
        assert!(host.affinity.len() as u64 <= SLOTS);
    }

    fn pool(selection: ai_router_proto::v1::Selection) -> crate::state::State {
        use ai_router_proto::v1::{Headroom, Model, Provider, ProviderKey, Snapshot};
        let key = |alias: &str| ProviderKey {
            alias: alias.into(),
            secret: format!("sk-{alias}"),
            fingerprint: ai_router_contract::fingerprint(&format!("sk-{alias}")),
            ..ProviderKey::default()
        };
        let mut snap = Snapshot::default();
        for (id, keys) in [("p1", vec![key("a"), key("b")]), ("p2", vec![key("c")])] {
            snap.providers.push(Provider {
                id: id.into(),
                keys,
                models: vec![Model {
                    id: "m1".into(),
                    ..Model::default()
                }],
                ..Provider::default()
            });
        }
        // a has 80 requests left, b 20, c reports nothing (the default weight, 10).
        for (p, k, left) in [("p1", "a", 80), ("p1", "b", 20)] {
            snap.headroom.push(Headroom {
                provider: p.into(),
                key: k.into(),
                model: "m1".into(),
                remaining_requests: left,
                remaining_tokens: -1,
                reset_at_ms: i64::MAX,
                ..Headroom::default()
            });
        }
        snap.selection = Some(selection);
        crate::state::State::new(1, snap)
    }

    fn one_tier() -> Vec<Vec<crate::plan::Candidate>> {
        vec![["p1", "p2"]
            .iter()
            .map(|p| crate::plan::Candidate {
                when: Vec::new(),
                provider: p.to_string(),
                model: "m1".into(),
                weight: 1.0,
            })
            .collect()]
    }

    #[test]
    fn a_pinned_lane_wins_while_usable_and_untried_then_the_strategy_decides() {
        use crate::lanes::pick::{pick, Pick, Request};
        use crate::vm::round_robin::RoundRobin;
        use crate::vm::view::NoView;
        let s = pool(ai_router_proto::v1::Selection {
            strategy: ai_router_proto::v1::SelectionStrategy::Headroom.into(),
            unreported_weight: 10.0,
            ..ai_router_proto::v1::Selection::default()
        });
        let tiers = one_tier();
        let mut rr = RoundRobin::default();
        let chosen = |req: Request<'_>, rr: &mut RoundRobin| match pick(
            &s,
            &tiers,
            req,
            &NoView,
            rr,
            0,
            &mut Vec::new(),
        ) {
            Pick::Lane(c) => c.lane,
            other => panic!("{other:?}"),
        };
        // Unpinned, draws across [0, 1) split 80 : 20 : 10 over a, b, c.
        let lane_at = |r: f64, rr: &mut RoundRobin| {
            chosen(
                Request {
                    random: r,
                    ..Request::default()
                },
                rr,
            )
            .key
        };
        assert_eq!(lane_at(0.5, &mut rr), "a");
        assert_eq!(lane_at(0.8, &mut rr), "b");
        assert_eq!(lane_at(0.95, &mut rr), "c");
        // Pinned to c: every draw goes to c.
        let c = LaneId::new("p2", "c", "m1");
        for r in [0.0, 0.5, 0.99] {
            let req = Request {
                random: r,
                pinned: Some(&c),
                ..Request::default()
            };
            assert_eq!(chosen(req, &mut rr), c);
        }
        // Once c failed this call, the call fails over by headroom (a or b, never c).
        let tried = [c.clone()];
        let req = Request {
            random: 0.99,
            pinned: Some(&c),
            tried: &tried,
            ..Request::default()
        };
        assert_eq!(chosen(req, &mut rr).provider, "p1");
    }
}

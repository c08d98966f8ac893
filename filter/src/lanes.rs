//! Lane selection: which (provider, key, model) an attempt uses, by the spec's tiers, from the
//! pushed state plus this VM's own view (what the call tried, in-flight counts, local holds).

use std::collections::HashMap;

use crate::classify::Class;
use crate::plan::Candidate;
use crate::state::State;

/// A lane this call has used.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneId {
    pub provider: String,
    pub key: String,
    pub model: String,
}

impl LaneId {
    pub fn new(provider: &str, key: &str, model: &str) -> Self {
        Self {
            provider: provider.into(),
            key: key.into(),
            model: model.into(),
        }
    }

    /// A stable text form for shared-data keys and round-robin state.
    pub fn token(&self) -> String {
        format!("{}\u{1f}{}\u{1f}{}", self.provider, self.key, self.model)
    }
}

/// A hold this VM (or another worker of this Envoy) put on a key or lane before the control
/// plane's push arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalHold {
    /// A 429 cooldown on the lane until this time.
    Cooldown { until_ms: i64 },
    /// The key is out (auth, quota, missing) until this time (0: until its secret changes),
    /// as long as its secret still has this fingerprint.
    Blacklist {
        class: Class,
        until_ms: i64,
        fingerprint: u64,
    },
}

/// The world the picker reads.
pub trait View {
    fn holds(&self, lane: &LaneId) -> Vec<LocalHold>;
    fn in_flight(&self, provider: &str, key: &str) -> u32;
    fn provider_in_flight(&self, provider: &str) -> u32;
}

#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub lane: LaneId,
    pub provider_index: usize,
    pub key_index: usize,
    pub tier: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    Lane(Chosen),
    /// No lane is usable now: the reason of the soonest-returning one and when it returns.
    Unavailable {
        class: Option<Class>,
        retry_at_ms: Option<i64>,
    },
}

/// Smooth weighted round-robin positions, per VM.
#[derive(Debug, Default)]
pub struct RoundRobin {
    current: HashMap<String, f64>,
}

impl RoundRobin {
    /// Picks among `options` (token, weight) and advances the positions.
    pub fn choose(&mut self, options: &[(String, f64)]) -> Option<usize> {
        let total: f64 = options.iter().map(|(_, w)| *w).sum();
        let mut best: Option<(usize, f64)> = None;
        for (i, (token, weight)) in options.iter().enumerate() {
            let cw = self.current.entry(token.clone()).or_insert(0.0);
            *cw += *weight;
            if best.is_none_or(|(_, b)| *cw > b) {
                best = Some((i, *cw));
            }
        }
        let (i, _) = best?;
        if let Some(cw) = self.current.get_mut(&options[i].0) {
            *cw -= total;
        }
        Some(i)
    }
}

struct Usable {
    chosen: Chosen,
    rank: (bool, usize, bool, bool),
    in_flight: u32,
    weight: f64,
}

/// Why a lane is out right now, and until when (None: until something changes).
fn out_reason(
    state: &State,
    view: &dyn View,
    pi: usize,
    ki: usize,
    lane: &LaneId,
    now_ms: i64,
) -> Option<(Class, Option<i64>)> {
    let provider = state.provider_at(pi)?;
    let key = provider.keys.get(ki)?;
    if key.secret.is_empty() {
        return Some((Class::Auth, None));
    }
    let mut worst: Option<(Class, Option<i64>)> = None;
    let mut consider = |class: Class, until: Option<i64>| {
        worst = Some(match worst {
            None => (class, until),
            Some((c, u)) => match (u, until) {
                (None, _) => (c, u),
                (_, None) => (class, until),
                (Some(a), Some(b)) if b > a => (class, until),
                _ => (c, u),
            },
        });
    };
    if let Some(h) = state.key_health(&provider.id, &key.alias) {
        let same_secret = h.refused_fingerprint == 0 || h.refused_fingerprint == key.fingerprint;
        let active = h.until_ms == 0 || h.until_ms > now_ms;
        if same_secret && active {
            let class = if h.reason == "quota" {
                Class::Quota
            } else {
                Class::Auth
            };
            consider(class, (h.until_ms > 0).then_some(h.until_ms));
        }
    }
    let pushed = state.cooldown_until(&lane.provider, &lane.key, &lane.model);
    if pushed > now_ms {
        consider(Class::RateLimit, Some(pushed));
    }
    for hold in view.holds(lane) {
        match hold {
            LocalHold::Cooldown { until_ms } if until_ms > now_ms => {
                consider(Class::RateLimit, Some(until_ms))
            }
            LocalHold::Blacklist {
                class,
                until_ms,
                fingerprint,
            } if (fingerprint == 0 || fingerprint == key.fingerprint)
                && (until_ms == 0 || until_ms > now_ms) =>
            {
                consider(class, (until_ms > 0).then_some(until_ms))
            }
            _ => {}
        }
    }
    if key.max_concurrency > 0 && view.in_flight(&provider.id, &key.alias) >= key.max_concurrency {
        consider(Class::RateLimit, Some(now_ms + 1));
    }
    if provider.max_concurrency > 0
        && view.provider_in_flight(&provider.id) >= provider.max_concurrency
    {
        consider(Class::RateLimit, Some(now_ms + 1));
    }
    worst
}

/// Chooses the lane for the next attempt of a call.
pub fn pick(
    state: &State,
    tiers: &[Vec<Candidate>],
    tried: &[LaneId],
    view: &dyn View,
    rr: &mut RoundRobin,
    now_ms: i64,
) -> Pick {
    let mut usable: Vec<Usable> = Vec::new();
    let mut soonest: Option<(Class, Option<i64>)> = None;
    for (tier_index, tier) in tiers.iter().enumerate() {
        for cand in tier {
            let Some((pi, provider)) = state.provider(&cand.provider) else {
                continue;
            };
            let model_weight = provider
                .models
                .iter()
                .find(|m| m.id == cand.model)
                .map(|m| if m.weight > 0.0 { m.weight } else { 1.0 })
                .unwrap_or(1.0);
            for (ki, key) in provider.keys.iter().enumerate() {
                let lane = LaneId::new(&provider.id, &key.alias, &cand.model);
                if let Some((class, until)) = out_reason(state, view, pi, ki, &lane, now_ms) {
                    soonest = Some(match soonest {
                        None => (class, until),
                        Some((c, u)) => match (u, until) {
                            (Some(a), Some(b)) if b < a => (class, until),
                            (None, Some(_)) => (class, until),
                            _ => (c, u),
                        },
                    });
                    continue;
                }
                let lane_tried = tried.contains(&lane);
                let key_tried = tried
                    .iter()
                    .any(|t| t.provider == lane.provider && t.key == lane.key);
                let provider_tried = tried.iter().any(|t| t.provider == lane.provider);
                let weight = positive(provider.weight)
                    * positive(key.weight)
                    * model_weight
                    * positive(cand.weight);
                usable.push(Usable {
                    rank: (lane_tried, tier_index, key_tried, provider_tried),
                    in_flight: view.in_flight(&provider.id, &key.alias),
                    weight,
                    chosen: Chosen {
                        lane,
                        provider_index: pi,
                        key_index: ki,
                        tier: tier_index,
                    },
                });
            }
        }
    }
    let Some(best_rank) = usable.iter().map(|u| u.rank).min() else {
        return match soonest {
            Some((class, retry_at_ms)) => Pick::Unavailable {
                class: Some(class),
                retry_at_ms,
            },
            None => Pick::Unavailable {
                class: None,
                retry_at_ms: None,
            },
        };
    };
    usable.retain(|u| u.rank == best_rank);
    let fewest = usable.iter().map(|u| u.in_flight).min().unwrap_or(0);
    usable.retain(|u| u.in_flight == fewest);
    let options: Vec<(String, f64)> = usable
        .iter()
        .map(|u| (u.chosen.lane.token(), u.weight))
        .collect();
    match rr.choose(&options).and_then(|i| usable.into_iter().nth(i)) {
        Some(u) => Pick::Lane(u.chosen),
        None => Pick::Unavailable {
            class: None,
            retry_at_ms: None,
        },
    }
}

fn positive(w: f64) -> f64 {
    if w > 0.0 {
        w
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::{KeyHealth, Model, Provider, ProviderKey, Snapshot};
    use std::cell::RefCell;

    #[derive(Default)]
    struct FakeView {
        holds: RefCell<HashMap<LaneId, Vec<LocalHold>>>,
        in_flight: HashMap<(String, String), u32>,
    }

    impl View for FakeView {
        fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
            self.holds.borrow().get(lane).cloned().unwrap_or_default()
        }
        fn in_flight(&self, p: &str, k: &str) -> u32 {
            self.in_flight
                .get(&(p.to_string(), k.to_string()))
                .copied()
                .unwrap_or(0)
        }
        fn provider_in_flight(&self, p: &str) -> u32 {
            self.in_flight
                .iter()
                .filter(|((pp, _), _)| pp == p)
                .map(|(_, n)| *n)
                .sum()
        }
    }

    fn key(alias: &str) -> ProviderKey {
        ProviderKey {
            alias: alias.into(),
            secret: format!("sk-{alias}"),
            fingerprint: crate::util::fingerprint(&format!("sk-{alias}")),
            ..Default::default()
        }
    }

    fn state_with(health: Vec<KeyHealth>) -> State {
        let mut s = Snapshot::default();
        let m = Model {
            id: "m1".into(),
            ..Default::default()
        };
        s.providers.push(Provider {
            id: "p1".into(),
            keys: vec![key("a"), key("b")],
            models: vec![m.clone()],
            ..Default::default()
        });
        s.providers.push(Provider {
            id: "p2".into(),
            keys: vec![key("c")],
            models: vec![m],
            ..Default::default()
        });
        s.key_health = health;
        State::new(1, s)
    }

    fn tiers() -> Vec<Vec<Candidate>> {
        vec![
            vec![Candidate {
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
            }],
            vec![Candidate {
                provider: "p2".into(),
                model: "m1".into(),
                weight: 1.0,
            }],
        ]
    }

    fn chosen(p: Pick) -> LaneId {
        match p {
            Pick::Lane(c) => c.lane,
            other => panic!("no lane: {other:?}"),
        }
    }

    #[test]
    fn equal_keys_alternate_and_untried_key_first() {
        let s = state_with(vec![]);
        let v = FakeView::default();
        let mut rr = RoundRobin::default();
        let first = chosen(pick(&s, &tiers(), &[], &v, &mut rr, 0));
        let second = chosen(pick(&s, &tiers(), &[], &v, &mut rr, 0));
        assert_ne!(first.key, second.key);
        assert_eq!(first.provider, "p1");
        // After trying a, the call goes to b, then to provider 2, then back to a tried lane.
        let tried = vec![LaneId::new("p1", "a", "m1")];
        assert_eq!(chosen(pick(&s, &tiers(), &tried, &v, &mut rr, 0)).key, "b");
        let tried = vec![LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
        assert_eq!(
            chosen(pick(&s, &tiers(), &tried, &v, &mut rr, 0)).provider,
            "p2"
        );
    }

    #[test]
    fn cooldowns_and_blacklists() {
        let s = state_with(vec![KeyHealth {
            provider: "p1".into(),
            key: "a".into(),
            reason: "auth".into(),
            until_ms: 0,
            refused_fingerprint: crate::util::fingerprint("sk-a"),
        }]);
        let v = FakeView::default();
        v.holds.borrow_mut().insert(
            LaneId::new("p1", "b", "m1"),
            vec![LocalHold::Cooldown { until_ms: 5000 }],
        );
        let mut rr = RoundRobin::default();
        assert_eq!(
            chosen(pick(&s, &tiers(), &[], &v, &mut rr, 1000)).provider,
            "p2"
        );
        // The cooldown passes.
        assert_eq!(chosen(pick(&s, &tiers(), &[], &v, &mut rr, 6000)).key, "b");
        // A new secret lifts the blacklist: the refused fingerprint no longer matches.
        let s2 = state_with(vec![KeyHealth {
            provider: "p1".into(),
            key: "a".into(),
            reason: "auth".into(),
            until_ms: 0,
            refused_fingerprint: 42,
        }]);
        let picks: Vec<String> = (0..4)
            .map(|_| chosen(pick(&s2, &tiers(), &[], &FakeView::default(), &mut rr, 0)).key)
            .collect();
        assert!(picks.contains(&"a".to_string()));
    }

    #[test]
    fn nothing_usable_reports_soonest_return() {
        let s = state_with(vec![]);
        let v = FakeView::default();
        for (p, k, until) in [("p1", "a", 3000), ("p1", "b", 2000), ("p2", "c", 4000)] {
            v.holds.borrow_mut().insert(
                LaneId::new(p, k, "m1"),
                vec![LocalHold::Cooldown { until_ms: until }],
            );
        }
        let mut rr = RoundRobin::default();
        assert_eq!(
            pick(&s, &tiers(), &[], &v, &mut rr, 1000),
            Pick::Unavailable {
                class: Some(Class::RateLimit),
                retry_at_ms: Some(2000)
            }
        );
    }

    #[test]
    fn weighted_round_robin_shares_by_weight() {
        let mut rr = RoundRobin::default();
        let opts = vec![("x".to_string(), 3.0), ("y".to_string(), 1.0)];
        let picks: Vec<usize> = (0..8).map(|_| rr.choose(&opts).unwrap()).collect();
        assert_eq!(picks.iter().filter(|i| **i == 0).count(), 6);
    }

    #[test]
    fn fewest_in_flight_wins() {
        let s = state_with(vec![]);
        let mut v = FakeView::default();
        v.in_flight.insert(("p1".into(), "a".into()), 2);
        let mut rr = RoundRobin::default();
        for _ in 0..3 {
            assert_eq!(chosen(pick(&s, &tiers(), &[], &v, &mut rr, 0)).key, "b");
        }
    }
}

use super::pick::{pick, Pick, Probe, Request};
use super::*;
use ai_router_proto::v1::{KeyHealth, Model, Provider, ProviderKey, Snapshot};
use std::cell::RefCell;
use std::collections::HashMap;

#[derive(Default)]
struct FakeView {
    holds: RefCell<HashMap<LaneId, Vec<LocalHold>>>,
    in_flight: HashMap<(String, String), u32>,
    parked: HashMap<LaneId, i64>,
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
    fn parked(&self, lane: &LaneId) -> Option<i64> {
        self.parked.get(lane).copied()
    }
}

fn key(alias: &str) -> ProviderKey {
    ProviderKey {
        alias: alias.into(),
        secret: format!("sk-{alias}"),
        fingerprint: ai_router_contract::fingerprint(&format!("sk-{alias}")),
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

#[test]
fn a_lane_is_found_by_identity_in_a_newer_snapshot() {
    let old = state_with(vec![]);
    let lane = LaneId::new("p2", "c", "m1");
    assert_eq!(
        lane_in(&old, &lane).map(|(p, k)| (p.id.as_str(), k.alias.as_str())),
        Some(("p2", "c"))
    );
    // The next snapshot lists p2 first and gives p1 a new first key: positions chosen on
    // the old one would name another lane.
    let mut snap = old.snapshot.clone();
    snap.providers.reverse();
    snap.providers[1].keys.insert(0, key("z"));
    let newer = State::new(2, snap);
    assert_eq!(
        lane_in(&newer, &lane).map(|(p, k)| (p.id.as_str(), k.secret.as_str())),
        Some(("p2", "sk-c"))
    );
    let a = LaneId::new("p1", "a", "m1");
    assert_eq!(
        lane_in(&newer, &a).map(|(_, k)| k.secret.as_str()),
        Some("sk-a")
    );
    // A key or model that is gone is no lane.
    assert!(lane_in(&newer, &LaneId::new("p1", "gone", "m1")).is_none());
    assert!(lane_in(&newer, &LaneId::new("p1", "a", "m9")).is_none());
    assert!(lane_in(&newer, &LaneId::new("p9", "a", "m1")).is_none());
}

fn tiers() -> Vec<Vec<Candidate>> {
    vec![
        vec![Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }],
        vec![Candidate {
            provider: "p2".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        }],
    ]
}

fn chosen(p: Pick) -> LaneId {
    match p {
        Pick::Lane(c) => c.lane,
        other => panic!("no lane: {other:?}"),
    }
}

/// The lane a first attempt with nothing tried gets at time 0.
fn pick_plain(s: &State, tiers: &[Vec<Candidate>], v: &FakeView, rr: &mut RoundRobin) -> LaneId {
    chosen(pick(
        s,
        tiers,
        Request::default(),
        v,
        rr,
        0,
        &mut Vec::new(),
    ))
}

#[test]
fn equal_keys_alternate_and_untried_key_first() {
    let s = state_with(vec![]);
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    let first = chosen(pick(
        &s,
        &tiers(),
        Request {
            tried: &[],
            ..Request::default()
        },
        &v,
        &mut rr,
        0,
        &mut Vec::new(),
    ));
    let second = chosen(pick(
        &s,
        &tiers(),
        Request {
            tried: &[],
            ..Request::default()
        },
        &v,
        &mut rr,
        0,
        &mut Vec::new(),
    ));
    assert_ne!(first.key, second.key);
    assert_eq!(first.provider, "p1");
    // After trying a, the call goes to b, then to provider 2, then back to a tried lane.
    let tried = vec![LaneId::new("p1", "a", "m1")];
    assert_eq!(
        chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &tried,
                ..Request::default()
            },
            &v,
            &mut rr,
            0,
            &mut Vec::new(),
        ))
        .key,
        "b"
    );
    let tried = vec![LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
    assert_eq!(
        chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &tried,
                ..Request::default()
            },
            &v,
            &mut rr,
            0,
            &mut Vec::new(),
        ))
        .provider,
        "p2"
    );
}

#[test]
fn cooldowns_and_blacklists() {
    let s = state_with(vec![KeyHealth {
        provider: "p1".into(),
        key: "a".into(),
        reason: KeyOutReason::Auth.into(),
        until_ms: 0,
        refused_fingerprint: ai_router_contract::fingerprint("sk-a"),
    }]);
    let v = FakeView::default();
    v.holds.borrow_mut().insert(
        LaneId::new("p1", "b", "m1"),
        vec![LocalHold::Cooldown {
            until_ms: 5000,
            set_at_ms: 0,
        }],
    );
    let mut rr = RoundRobin::default();
    assert_eq!(
        chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &[],
                ..Request::default()
            },
            &v,
            &mut rr,
            1000,
            &mut Vec::new(),
        ))
        .provider,
        "p2"
    );
    // The cooldown passes.
    assert_eq!(
        chosen(pick(
            &s,
            &tiers(),
            Request {
                tried: &[],
                ..Request::default()
            },
            &v,
            &mut rr,
            6000,
            &mut Vec::new(),
        ))
        .key,
        "b"
    );
    // A new secret lifts the blacklist: the refused fingerprint no longer matches.
    let s2 = state_with(vec![KeyHealth {
        provider: "p1".into(),
        key: "a".into(),
        reason: KeyOutReason::Auth.into(),
        until_ms: 0,
        refused_fingerprint: 42,
    }]);
    let picks: Vec<String> = (0..4)
        .map(|_| {
            chosen(pick(
                &s2,
                &tiers(),
                Request {
                    tried: &[],
                    ..Request::default()
                },
                &FakeView::default(),
                &mut rr,
                0,
                &mut Vec::new(),
            ))
            .key
        })
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
            vec![LocalHold::Cooldown {
                until_ms: until,
                set_at_ms: 0,
            }],
        );
    }
    let mut rr = RoundRobin::default();
    assert_eq!(
        pick(
            &s,
            &tiers(),
            Request {
                tried: &[],
                ..Request::default()
            },
            &v,
            &mut rr,
            1000,
            &mut Vec::new(),
        ),
        Pick::Unavailable {
            class: Some(ErrorClass::RateLimit),
            retry_at_ms: Some(2000)
        }
    );
}

#[test]
fn weighted_round_robin_shares_by_weight() {
    let mut rr = RoundRobin::default();
    let (x, y) = (LaneId::new("p", "x", "m"), LaneId::new("p", "y", "m"));
    let opts = [(&x, 3.0), (&y, 1.0)];
    let picks: Vec<usize> = (0..8).map(|_| rr.choose(&opts).unwrap()).collect();
    assert_eq!(picks.iter().filter(|i| **i == 0).count(), 6);
}

#[test]
fn candidates_share_a_tier_by_their_weight_whatever_their_key_count() {
    // p1 has keys a and b, p2 has key c; both candidates weigh 1: p1 and p2 half each.
    let s = state_with(vec![]);
    let tier = vec![vec![
        Candidate {
            provider: "p1".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        },
        Candidate {
            provider: "p2".into(),
            model: "m1".into(),
            weight: 1.0,
            when: Vec::new(),
        },
    ]];
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..400 {
        let key = pick_plain(&s, &tier, &v, &mut rr).key;
        *counts.entry(key).or_default() += 1;
    }
    let n = |k: &str| counts.get(k).copied().unwrap_or(0);
    assert_eq!(n("c"), 200, "{counts:?}");
    assert_eq!(n("a") + n("b"), 200, "{counts:?}");
    assert_eq!(n("a"), 100, "{counts:?}");
}

#[test]
fn candidate_shares_follow_the_weights_at_any_concurrency() {
    // The tier: w1 (one key) weighs 3, w2 (two keys) weighs 1. Clients keep
    // `concurrency` calls in flight (counted per key, as the VM does), a random one of them
    // ending before each new pick; 4,000 picks at each concurrency.
    let mut snap = Snapshot::default();
    let model = Model {
        id: "m".into(),
        ..Default::default()
    };
    for (id, keys) in [("w1", vec![key("a")]), ("w2", vec![key("b"), key("c")])] {
        snap.providers.push(Provider {
            id: id.into(),
            keys,
            models: vec![model.clone()],
            ..Default::default()
        });
    }
    let s = State::new(1, snap);
    let candidate = |provider: &str, weight: f64| Candidate {
        provider: provider.into(),
        model: "m".into(),
        weight,
        when: Vec::new(),
    };
    let tier = vec![vec![candidate("w1", 3.0), candidate("w2", 1.0)]];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for concurrency in [1, 2, 3, 8, 32] {
        let mut v = FakeView::default();
        let mut rr = RoundRobin::default();
        let mut running: Vec<LaneId> = Vec::new();
        let mut counts: HashMap<String, usize> = HashMap::new();
        let picks = 4_000;
        for _ in 0..picks {
            if running.len() == concurrency {
                let done = running.swap_remove(random(concurrency));
                if let Some(n) = v.in_flight.get_mut(&(done.provider, done.key)) {
                    *n -= 1;
                }
            }
            let lane = pick_plain(&s, &tier, &v, &mut rr);
            *v.in_flight
                .entry((lane.provider.clone(), lane.key.clone()))
                .or_default() += 1;
            *counts.entry(lane.key.clone()).or_default() += 1;
            running.push(lane);
        }
        let share = |k: &str| counts.get(k).copied().unwrap_or(0) as f64 / picks as f64;
        for (k, want) in [("a", 0.75), ("b", 0.125), ("c", 0.125)] {
            assert!(
                (share(k) - want).abs() <= 0.05,
                "concurrency {concurrency}: key {k} {:.3}, expected {want}: {counts:?}",
                share(k)
            );
        }
    }
}

#[test]
fn a_candidate_with_many_keys_is_looked_at_through_a_moving_window() {
    let mut snap = state_with(vec![]).snapshot.clone();
    snap.providers[0].keys = (0..1_000).map(|i| key(&format!("k{i}"))).collect();
    // Half the keys are blacklisted: the window counts only usable ones.
    snap.key_health = (0..1_000)
        .filter(|i| i % 2 == 1)
        .map(|i| KeyHealth {
            provider: "p1".into(),
            key: format!("k{i}"),
            reason: KeyOutReason::Quota.into(),
            until_ms: 10_000,
            refused_fingerprint: ai_router_contract::fingerprint(&format!("sk-k{i}")),
        })
        .collect();
    let s = State::new(1, snap);
    let tier = vec![vec![Candidate {
        provider: "p1".into(),
        model: "m1".into(),
        weight: 1.0,
        when: Vec::new(),
    }]];
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    let mut chosen_keys = std::collections::BTreeSet::new();
    let mut most_skipped = 0;
    for _ in 0..1_000 / KEY_WINDOW * 2 + 2 {
        let mut skipped = Vec::new();
        let lane = chosen(pick(
            &s,
            &tier,
            Request::default(),
            &v,
            &mut rr,
            0,
            &mut skipped,
        ));
        assert!(!skipped.iter().any(|k| k.lane == lane));
        most_skipped = most_skipped.max(skipped.len());
        chosen_keys.insert(lane.key);
    }
    // Each pick looked at about 2 x KEY_WINDOW keys (half usable, half out), not 1,000...
    assert!(most_skipped <= KEY_WINDOW + 1, "{most_skipped}");
    // ...and over the picks the window went round every usable key.
    assert!(
        chosen_keys.len() >= 500 / KEY_WINDOW,
        "{}",
        chosen_keys.len()
    );
    let usable_seen = chosen_keys
        .iter()
        .all(|k| k[1..].parse::<usize>().is_ok_and(|i| i % 2 == 0));
    assert!(usable_seen, "{chosen_keys:?}");

    // With every key usable, the windows of successive picks do not overlap and the load
    // spreads evenly: 1,000 picks take each of the 1,000 keys once.
    let mut all = state_with(vec![]).snapshot.clone();
    all.providers[0].keys = (0..1_000).map(|i| key(&format!("k{i}"))).collect();
    let all = State::new(1, all);
    let mut rr = RoundRobin::default();
    let mut taken = std::collections::HashMap::<String, u32>::new();
    for _ in 0..1_000 {
        let lane = chosen(pick(
            &all,
            &tier,
            Request::default(),
            &v,
            &mut rr,
            0,
            &mut Vec::new(),
        ));
        *taken.entry(lane.key).or_default() += 1;
    }
    assert_eq!(taken.len(), 1_000);
    assert!(taken.values().all(|n| *n == 1), "{taken:?}");

    // A pinned key is looked at first, wherever the window is.
    let pin = LaneId::new("p1", "k998", "m1");
    for _ in 0..5 {
        let req = Request {
            pinned: Some(&pin),
            ..Request::default()
        };
        assert_eq!(
            chosen(pick(&s, &tier, req, &v, &mut rr, 0, &mut Vec::new())),
            pin
        );
    }
}

#[test]
fn a_local_hold_gives_way_to_the_control_plane_once_it_has_spoken() {
    let v = FakeView::default();
    let lane = LaneId::new("p1", "a", "m1");
    v.holds.borrow_mut().insert(
        lane.clone(),
        vec![LocalHold::Blacklist {
            class: ErrorClass::Auth,
            until_ms: 0,
            fingerprint: 0,
            set_at_ms: 10_000,
        }],
    );
    let only_a = vec![vec![Candidate {
        provider: "p1".into(),
        model: "m1".into(),
        weight: 1.0,
        when: Vec::new(),
    }]];
    let keys = |generated_at_ms: i64| {
        let s = state_with_snapshot(|s| {
            s.generated_at_ms = generated_at_ms;
            s.providers[0].keys.truncate(1);
        });
        picks_a_lane(&s, &only_a, &v, 12_000)
    };
    // A snapshot from before the hold (or within the grace) cannot know of it: the key is out.
    assert!(!keys(9_000));
    assert!(!keys(10_000 + LOCAL_HOLD_GRACE_MS - 1));
    // One generated after the grace without the blacklist: the control plane's view wins.
    assert!(keys(10_000 + LOCAL_HOLD_GRACE_MS));
}

#[test]
fn an_operator_reset_voids_the_holds_set_before_it_at_once() {
    let v = FakeView::default();
    let lane = LaneId::new("p1", "a", "m1");
    v.holds.borrow_mut().insert(
        lane.clone(),
        vec![
            LocalHold::Blacklist {
                class: ErrorClass::Quota,
                until_ms: 0,
                fingerprint: 0,
                set_at_ms: 10_000,
            },
            LocalHold::Cooldown {
                until_ms: 60_000,
                set_at_ms: 10_500,
            },
        ],
    );
    let only_a = vec![vec![Candidate {
        provider: "p1".into(),
        model: "m1".into(),
        weight: 1.0,
        when: Vec::new(),
    }]];
    let usable = |reset: Option<(&str, i64)>| {
        let s = state_with_snapshot(|s| {
            // Within the grace: without a reset the holds stand.
            s.generated_at_ms = 11_000;
            s.providers[0].keys.truncate(1);
            s.resets = reset
                .map(|(key, at_ms)| ai_router_proto::v1::HoldReset {
                    provider: "p1".into(),
                    key: key.into(),
                    at_ms,
                })
                .into_iter()
                .collect();
        });
        picks_a_lane(&s, &only_a, &v, 12_000)
    };
    assert!(!usable(None));
    // A reset of the key, or of its provider, after both holds: usable at once.
    assert!(usable(Some(("a", 11_000))));
    assert!(usable(Some(("", 11_000))));
    // A reset between them voids the blacklist only; the later cooldown stands.
    assert!(!usable(Some(("a", 10_200))));
    // A reset of another key changes nothing.
    assert!(!usable(Some(("b", 11_000))));
}

#[test]
fn fewest_in_flight_wins() {
    let s = state_with(vec![]);
    let mut v = FakeView::default();
    v.in_flight.insert(("p1".into(), "a".into()), 2);
    let mut rr = RoundRobin::default();
    for _ in 0..3 {
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tried: &[],
                    ..Request::default()
                },
                &v,
                &mut rr,
                0,
                &mut Vec::new(),
            ))
            .key,
            "b"
        );
    }
}

fn state_with_snapshot(f: impl FnOnce(&mut Snapshot)) -> State {
    let mut s = state_with(vec![]).snapshot;
    f(&mut s);
    State::new(2, s)
}

fn picks_a_lane(s: &State, tiers: &[Vec<Candidate>], v: &FakeView, now: i64) -> bool {
    let mut rr = RoundRobin::default();
    let pick = pick(
        s,
        tiers,
        Request::default(),
        v,
        &mut rr,
        now,
        &mut Vec::new(),
    );
    matches!(pick, Pick::Lane(_))
}

fn pick_now(s: &State, v: &FakeView, rr: &mut RoundRobin, now: i64) -> Pick {
    pick(s, &tiers(), Request::default(), v, rr, now, &mut Vec::new())
}

#[test]
fn open_breakers_exclude_and_half_open_asks_for_a_probe() {
    use ai_router_proto::v1::BreakerState;
    let s = state_with_snapshot(|snap| {
        snap.breakers.push(BreakerState {
            scope: BreakerScope::Provider.into(),
            provider: "p1".into(),
            key: String::new(),
            state: BreakerPhase::Open.into(),
            open_until_ms: 5000,
        });
    });
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    // Provider 1 is open: every call goes to p2 (a later tier) until the cooldown passes.
    assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).provider, "p2");
    match pick_now(&s, &v, &mut rr, 6000) {
        Pick::Lane(c) => {
            assert_eq!(c.lane.provider, "p1");
            assert_eq!(
                c.probe,
                Some(Probe {
                    scope: BreakerScope::Provider,
                    provider: "p1".into(),
                    key: String::new()
                })
            );
        }
        other => panic!("{other:?}"),
    }
    // A lane whose probe another call holds is skipped.
    let excluded = vec![LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
    let req = Request {
        excluded: &excluded,
        ..Request::default()
    };
    assert_eq!(
        chosen(pick(&s, &tiers(), req, &v, &mut rr, 6000, &mut Vec::new())).provider,
        "p2"
    );
}

#[test]
fn a_figure_marked_spent_is_a_quota_and_a_plain_zero_a_rate_limit() {
    use ai_router_proto::v1::Headroom;
    let only_p1 = vec![vec![Candidate {
        provider: "p1".into(),
        model: "m1".into(),
        weight: 1.0,
        when: Vec::new(),
    }]];
    let at = |spent: bool| {
        state_with_snapshot(|snap| {
            for key in ["a", "b"] {
                snap.headroom.push(Headroom {
                    provider: "p1".into(),
                    key: key.into(),
                    remaining_requests: 0,
                    remaining_tokens: -1,
                    reset_at_ms: 9_000,
                    spent,
                    ..Default::default()
                });
            }
        })
    };
    let v = FakeView::default();
    // A rate window returns at its reset (a call may wait for it); a spent credit has no
    // known return.
    for (spent, class, retry_at_ms) in [
        (true, ErrorClass::Quota, None),
        (false, ErrorClass::RateLimit, Some(9_000)),
    ] {
        let mut rr = RoundRobin::default();
        assert_eq!(
            pick(
                &at(spent),
                &only_p1,
                Request::default(),
                &v,
                &mut rr,
                1_000,
                &mut Vec::new()
            ),
            Pick::Unavailable {
                class: Some(class),
                retry_at_ms
            },
            "spent: {spent}"
        );
    }
    // Past its window the mark is gone with the figure.
    let mut rr = RoundRobin::default();
    assert!(matches!(
        pick(
            &at(true),
            &only_p1,
            Request::default(),
            &v,
            &mut rr,
            9_500,
            &mut Vec::new()
        ),
        Pick::Lane(_)
    ));
}

#[test]
fn headroom_and_budgets() {
    use ai_router_proto::v1::{Headroom, ProviderHealth};
    let s = state_with_snapshot(|snap| {
        snap.headroom.push(Headroom {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            remaining_requests: 0,
            remaining_tokens: -1,
            reset_at_ms: 3000,
            ..Default::default()
        });
        snap.headroom.push(Headroom {
            provider: "p1".into(),
            key: "b".into(),
            model: "m1".into(),
            remaining_requests: 1,
            remaining_tokens: -1,
            reset_at_ms: 3000,
            ..Default::default()
        });
    });
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    // a is out (no requests left); b is at low headroom: used only because p2 is a later tier.
    for _ in 0..3 {
        assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).key, "b");
    }
    // After the reset both are back.
    let keys: Vec<String> = (0..4)
        .map(|_| chosen(pick_now(&s, &v, &mut rr, 4000)).key)
        .collect();
    assert!(keys.contains(&"a".to_string()));
    // Token headroom below the estimate keeps the lane out.
    let s = state_with_snapshot(|snap| {
        snap.headroom.push(Headroom {
            provider: "p1".into(),
            key: "a".into(),
            model: "m1".into(),
            remaining_requests: 50,
            remaining_tokens: 10,
            reset_at_ms: 3000,
            ..Default::default()
        });
    });
    for _ in 0..3 {
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request {
                    tokens: 100,
                    ..Request::default()
                },
                &v,
                &mut rr,
                1000,
                &mut Vec::new(),
            ))
            .key,
            "b"
        );
    }
    // A provider past its budget is out until the reported time.
    let s = state_with_snapshot(|snap| {
        snap.provider_health.push(ProviderHealth {
            provider: "p1".into(),
            reason: ai_router_proto::v1::ProviderOutReason::Budget.into(),
            until_ms: 9000,
        });
    });
    assert_eq!(chosen(pick_now(&s, &v, &mut rr, 1000)).provider, "p2");
}

#[test]
fn latency_outside_tolerance_loses() {
    struct Slow;
    impl View for Slow {
        fn holds(&self, _: &LaneId) -> Vec<LocalHold> {
            Vec::new()
        }
        fn in_flight(&self, _: &str, _: &str) -> u32 {
            0
        }
        fn provider_in_flight(&self, _: &str) -> u32 {
            0
        }
        fn latency(&self, lane: &LaneId) -> Option<f64> {
            Some(if lane.key == "a" { 1000.0 } else { 100.0 })
        }
    }
    let s = state_with(vec![]);
    let mut rr = RoundRobin::default();
    for _ in 0..4 {
        assert_eq!(
            chosen(pick(
                &s,
                &tiers(),
                Request::default(),
                &Slow,
                &mut rr,
                0,
                &mut Vec::new()
            ))
            .key,
            "b"
        );
    }
}

#[test]
fn a_conditional_tier_is_taken_only_after_its_trigger() {
    let s = state_with(vec![]);
    let v = FakeView::default();
    let mut rr = RoundRobin::default();
    let mut t = tiers();
    t[1][0].when = vec!["rate_limit".into()];
    let p1 = [LaneId::new("p1", "a", "m1"), LaneId::new("p1", "b", "m1")];
    let next = |rr: &mut RoundRobin, last: Option<ErrorClass>| {
        pick(
            &s,
            &t,
            Request {
                tried: &p1,
                last_failure: last,
                ..Request::default()
            },
            &v,
            rr,
            0,
            &mut Vec::new(),
        )
    };
    // After a rate limit the conditional tier (p2) comes before trying p1 again.
    assert_eq!(
        chosen(next(&mut rr, Some(ErrorClass::RateLimit))).provider,
        "p2"
    );
    // After a 5xx it is skipped: only p1's lanes (tried already) are left.
    assert_eq!(
        chosen(next(&mut rr, Some(ErrorClass::Transient))).provider,
        "p1"
    );
    // Never the first attempt.
    let first = pick(&s, &t, Request::default(), &v, &mut rr, 0, &mut Vec::new());
    assert_eq!(chosen(first).provider, "p1");
}

#[test]
fn a_parked_lane_comes_after_the_others_until_its_probe_is_due() {
    let s = state_with(vec![]);
    let mut v = FakeView::default();
    let mut rr = RoundRobin::default();
    let interval = 1_000;
    for k in ["a", "b"] {
        v.parked.insert(LaneId::new("p1", k, "m1"), interval as i64);
    }
    let with_interval = Request {
        reset_interval_ms: interval,
        ..Request::default()
    };
    let at = |rr: &mut RoundRobin, req: Request<'_>, now: i64| match pick(
        &s,
        &tiers(),
        req,
        &v,
        rr,
        now,
        &mut Vec::new(),
    ) {
        Pick::Lane(c) => c,
        other => panic!("no lane: {other:?}"),
    };
    // Parked: the next tier carries the calls, and no probe is to claim.
    let parked = at(&mut rr, with_interval, 10);
    assert_eq!(parked.lane.provider, "p2");
    assert!(!parked.snap_probe);
    // A call without an interval ignores parking.
    let plain = at(&mut rr, Request::default(), 10);
    assert_eq!(plain.lane.provider, "p1");
    assert!(!plain.snap_probe);
    // Due: the parked lane is chosen again, as a probe the call must claim.
    let due = at(&mut rr, with_interval, 1_000);
    assert_eq!(due.lane.provider, "p1");
    assert!(due.snap_probe);
}

#[test]
fn a_parked_lane_is_still_tried_when_nothing_else_is_left() {
    let s = state_with(vec![]);
    let mut v = FakeView::default();
    for k in ["a", "b"] {
        v.parked.insert(LaneId::new("p1", k, "m1"), 1_000);
    }
    let only_p1 = vec![tiers().remove(0)];
    let got = pick(
        &s,
        &only_p1,
        Request {
            reset_interval_ms: 1_000,
            ..Request::default()
        },
        &v,
        &mut RoundRobin::default(),
        10,
        &mut Vec::new(),
    );
    match got {
        Pick::Lane(c) => {
            assert_eq!(c.lane.provider, "p1");
            assert!(!c.snap_probe, "a last resort is no probe to claim");
        }
        other => panic!("no lane: {other:?}"),
    }
}

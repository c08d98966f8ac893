//! Headroom shared out between every Envoy of the cluster.
//!
//! Each Envoy reserves its sends against the headroom it was pushed (`filter-core`
//! `local::Sends`: compare-and-swap across the workers of one process), but it cannot see the
//! other Envoys' sends until the provider's next figure comes back. So each open `Watch`
//! stream is pushed its **share** of every figure instead of the whole: a scope with `R`
//! requests (or tokens) left as of the instant `T` is split into `E` parts summing to `R`
//! (`R / E`, the first `R mod E` Envoys one more), `E` being the streams open now at every
//! control plane, each Envoy its own part by its place in the membership.
//!
//! The membership: each control plane registers its open streams in the state store when it
//! is shared (Redis: the sorted set `<ns>:watchers`, one member `<plane>/<stream>` per stream,
//! `plane` random per process), again every [`HEARTBEAT`] and at once when a stream opens or
//! closes; a registration stands [`MEMBERSHIP_TTL`], so the Envoys of a control plane that
//! died drop out of the split within that time. Every control plane orders the members the
//! same way (by name), so the parts of one figure sum to `R` whichever control plane computed
//! them. A change of membership (seen at the next heartbeat) re-splits: every stream is sent
//! its new part at once (the same version, a headroom-only delta). With a store that shares no
//! membership (memory, SQLite), or while Redis does not answer for longer than the TTL, a
//! control plane splits among its own streams only.
//!
//! The bound on overshoot. Every Envoy keeps its sends since `T` within its part, so while the
//! membership and the figure stand, the sends after `T` of the whole cluster stay within `R`:
//! no overshoot. Beyond that:
//! - a newer figure `R'` (as of `T'`) reaches the Envoys a push apart (tens of ms); meanwhile
//!   an Envoy on the older part may still spend what it had left of it, at most its older part,
//!   `ceil(R / E)`: at most `R + (E - 1) * ceil(R / E)` sends after `T` in the worst case;
//! - a stream that opens or closes is seen by the other control planes up to a heartbeat (1 s)
//!   plus a push later; meanwhile parts computed over `E` and over `E + 1` members coexist,
//!   each Envoy spending at most the larger of its two parts: at most `(E + 1) * ceil(R / E)`,
//!   one part more than `R` (about `R / E`);
//! - Redis away past the TTL: each of `C` control planes splits among its own, so the figure
//!   can be spent up to `C` times until it answers again.
//!
//! The price: an Envoy that is not called leaves its part unused until the next figure (each
//! report re-splits what is left), so a scope used through one Envoy only empties in a few
//! rounds rather than one.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ai_router_proto::tables::Tables;
use tokio::sync::{watch, Notify};

use crate::engine::Engine;

/// How often a control plane registers its streams again.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a registration stands without being renewed.
pub const MEMBERSHIP_TTL: Duration = Duration::from_secs(5);

/// How many Envoys this control plane splits the headroom among, for `/metrics`.
static SHARERS: AtomicU64 = AtomicU64::new(0);

/// The open `Watch` streams: this control plane's, and every other's as the state store last
/// told.
#[derive(Debug)]
pub struct Members {
    /// This control plane's name in the shared membership.
    plane: String,
    open: Mutex<BTreeSet<u64>>,
    /// Every control plane's streams as the store last answered, and when.
    cluster: Mutex<Option<(Vec<String>, Instant)>>,
    /// Bumped whenever the membership changes: every stream recomputes its part.
    changed: watch::Sender<u64>,
    /// Woken by a local open or close: the heartbeat registers at once.
    local: Notify,
}

impl Default for Members {
    fn default() -> Self {
        Self {
            plane: format!("{:016x}", rand::random::<u64>()),
            open: Mutex::new(BTreeSet::new()),
            cluster: Mutex::new(None),
            changed: watch::Sender::new(0),
            local: Notify::new(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stream's name in the shared membership (fixed width: names sort as their ids do).
fn member(plane: &str, id: u64) -> String {
    format!("{plane}/{id:020}")
}

impl Members {
    pub fn join(&self, id: u64) {
        lock(&self.open).insert(id);
        self.moved();
        self.local.notify_one();
    }

    pub fn leave(&self, id: u64) {
        if lock(&self.open).remove(&id) {
            self.moved();
            self.local.notify_one();
        }
    }

    fn moved(&self) {
        SHARERS.store(self.everyone().len() as u64, Ordering::Relaxed);
        self.changed.send_modify(|epoch| *epoch += 1);
    }

    /// Wakes on every change of membership.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// This control plane's streams, by their shared names.
    fn mine(&self) -> Vec<String> {
        lock(&self.open)
            .iter()
            .map(|id| member(&self.plane, *id))
            .collect()
    }

    /// Every member, in the order all control planes agree on: this one's open streams now,
    /// the others' as last heard while that is fresh.
    fn everyone(&self) -> Vec<String> {
        let mut all = self.mine();
        let prefix = format!("{}/", self.plane);
        if let Some((heard, at)) = &*lock(&self.cluster) {
            if at.elapsed() < MEMBERSHIP_TTL {
                all.extend(heard.iter().filter(|m| !m.starts_with(&prefix)).cloned());
            }
        }
        all.sort();
        all.dedup();
        all
    }

    /// Takes what the store answered (`None`: nothing new) and re-splits when the membership
    /// moved (a heard change, or the last answer aged out); whether it did.
    fn heard(&self, answer: Option<Vec<String>>, before: &[String]) -> bool {
        if let Some(all) = answer {
            *lock(&self.cluster) = Some((all, Instant::now()));
        }
        let now = self.everyone();
        if now == before {
            return false;
        }
        self.moved();
        true
    }

    /// Stream `id`'s place among every open one and how many are open.
    pub fn place(&self, id: u64) -> (usize, usize) {
        let all = self.everyone();
        let me = member(&self.plane, id);
        let index = all.iter().position(|m| *m == me).unwrap_or(0);
        (index, all.len().max(1))
    }
}

/// Registers this control plane's streams every [`HEARTBEAT`] and on every local change, and
/// re-splits when the membership moves, until `stop` flips.
pub async fn heartbeat(
    members: Arc<Members>,
    engine: Arc<Engine>,
    mut stop: watch::Receiver<bool>,
) {
    let ttl_ms = i64::try_from(MEMBERSHIP_TTL.as_millis()).unwrap_or(i64::MAX);
    loop {
        if *stop.borrow() {
            return;
        }
        let before = members.everyone();
        let (mine, plane, engine2) = (members.mine(), members.plane.clone(), engine.clone());
        // Redis: off the executor.
        let answer =
            tokio::task::spawn_blocking(move || engine2.register_watchers(&plane, &mine, ttl_ms))
                .await
                .ok()
                .flatten();
        if members.heard(answer, &before) {
            tracing::debug!(envoys = members.everyone().len(), "headroom re-split");
        }
        tokio::select! {
            () = tokio::time::sleep(HEARTBEAT) => {}
            () = members.local.notified() => {}
            _ = stop.changed() => {}
        }
    }
}

/// The `/metrics` family of the split.
pub fn render(out: &mut String, family: fn(&mut String, &str, &str, &str)) {
    use std::fmt::Write as _;
    let name = "ai_router_headroom_sharers";
    family(
        out,
        name,
        "gauge",
        "Envoys every headroom figure is split among: the open sync streams of every control plane on the shared state store (of this one alone without one).",
    );
    let _ = writeln!(out, "{name} {}", SHARERS.load(Ordering::Relaxed));
}

/// Part `index` of `figure` split `count` ways (-1, unknown, stays so).
pub fn part(figure: i64, index: usize, count: usize) -> i64 {
    if figure < 0 || count <= 1 {
        return figure;
    }
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let index = i64::try_from(index).unwrap_or(i64::MAX);
    figure / count + i64::from(index < figure % count)
}

/// `tables` with every headroom figure cut to part `index` of `count`; the same tables when
/// there is nothing to split.
pub fn share_of(tables: &Arc<Tables>, index: usize, count: usize) -> Arc<Tables> {
    if count <= 1 || tables.headroom.is_empty() {
        return tables.clone();
    }
    let mut mine = (**tables).clone();
    for h in mine.headroom.values_mut() {
        h.remaining_requests = part(h.remaining_requests, index, count);
        h.remaining_tokens = part(h.remaining_tokens, index, count);
    }
    Arc::new(mine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1 as pb;

    #[test]
    fn the_parts_sum_to_the_figure_and_differ_by_one_at_most() {
        for figure in [0i64, 1, 2, 9, 10, 11, 1_000_003] {
            for count in 1..=5usize {
                let parts: Vec<i64> = (0..count).map(|i| part(figure, i, count)).collect();
                assert_eq!(parts.iter().sum::<i64>(), figure, "{figure}/{count}");
                let (min, max) = (parts.iter().min(), parts.iter().max());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{parts:?}");
            }
        }
        assert_eq!(part(-1, 1, 3), -1, "unknown stays unknown");
        assert_eq!((part(10, 0, 2), part(10, 1, 2)), (5, 5));
        assert_eq!((part(1, 0, 2), part(1, 1, 2)), (1, 0));
    }

    #[test]
    fn each_stream_gets_its_own_part_and_a_leave_gives_it_back() {
        let members = Members::default();
        let mut woken = members.subscribe();
        members.join(7);
        members.join(3);
        assert!(woken.has_changed().unwrap_or(false));
        woken.mark_unchanged();
        assert_eq!((members.place(3), members.place(7)), ((0, 2), (1, 2)));
        let mut tables = Tables::default();
        let lane = ("p".to_owned(), "a".to_owned(), String::new());
        tables.headroom.insert(
            lane.clone(),
            pb::Headroom {
                remaining_requests: 11,
                remaining_tokens: -1,
                ..pb::Headroom::default()
            },
        );
        let tables = Arc::new(tables);
        let first = share_of(&tables, 0, 2);
        let second = share_of(&tables, 1, 2);
        let figure = |t: &Tables| {
            t.headroom
                .get(&lane)
                .map(|h| (h.remaining_requests, h.remaining_tokens))
        };
        assert_eq!(
            (figure(&first), figure(&second)),
            (Some((6, -1)), Some((5, -1)))
        );
        members.leave(3);
        assert!(woken.has_changed().unwrap_or(false));
        assert_eq!(members.place(7), (0, 1));
        assert!(Arc::ptr_eq(&share_of(&tables, 0, 1), &tables));
    }

    #[test]
    fn the_parts_are_taken_over_every_control_plane_s_streams_until_one_falls_silent() {
        let (a, b) = (Members::default(), Members::default());
        a.join(1);
        b.join(1);
        b.join(2);
        // What the store answers both once each has registered.
        let all: Vec<String> = a.mine().into_iter().chain(b.mine()).collect();
        let before = a.everyone();
        assert!(a.heard(Some(all.clone()), &before), "a sees b's Envoys");
        let before = b.everyone();
        assert!(b.heard(Some(all.clone()), &before));
        let places = [a.place(1), b.place(1), b.place(2)];
        assert!(places.iter().all(|(_, count)| *count == 3), "{places:?}");
        let mut indexes: Vec<usize> = places.iter().map(|(i, _)| *i).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, [0, 1, 2], "one part each, whoever computed it");
        let sent: i64 = places.iter().map(|(i, n)| part(10, *i, *n)).sum();
        assert_eq!(sent, 10, "the cluster's parts sum to the figure");
        // Nothing heard again: the same membership, no re-split.
        let before = a.everyone();
        assert!(!a.heard(None, &before));
        // b fell silent (its registrations aged out): a splits among its own again.
        let old = Instant::now().checked_sub(MEMBERSHIP_TTL);
        *lock(&a.cluster) = old.map(|at| (all, at));
        assert!(a.heard(None, &before));
        assert_eq!(a.place(1), (0, 1));
    }
}

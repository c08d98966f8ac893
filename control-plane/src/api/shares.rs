//! Headroom shared out between the Envoys that watch one control plane.
//!
//! Each Envoy reserves its sends against the headroom it was pushed (`filter-core`
//! `local::Sends`: compare-and-swap across the workers of one process), but it cannot see the
//! other Envoys' sends until the provider's next figure comes back. So each open `Watch`
//! stream is pushed its **share** of every figure instead of the whole: a scope with `R`
//! requests (or tokens) left as of the instant `T` is split into `E` parts summing to `R`
//! (`R / E`, the first `R mod E` Envoys one more), `E` being the streams open now, each Envoy
//! its own part by the order the streams were opened. Every Envoy keeps its sends since `T`
//! within its part, so whatever the race, the sends after `T` of all the Envoys of one control
//! plane stay within `R`: no overshoot as long as they hold the same figure.
//!
//! The bound beyond that: a newer figure `R'` (as of `T'`) reaches the Envoys a push apart
//! (tens of ms); meanwhile an Envoy on the older part may still spend what it had left of it,
//! at most its older part, `ceil(R / E)`: with `E` Envoys at most `R + (E - 1) * ceil(R / E)`
//! sends after `T` in the worst case. When an Envoy connects or goes, every stream is sent
//! its new part at once (the same version, a headroom-only delta). Control planes sharing a
//! Redis state store each split among their own Envoys: across `C` of them the figure can be
//! spent up to `C` times (not bounded here).
//!
//! The price: an Envoy that is not called leaves its part unused until the next figure (each
//! report re-splits what is left), so a scope used through one Envoy only empties in a few
//! rounds rather than one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use ai_router_proto::tables::Tables;
use tokio::sync::watch;

/// The open `Watch` streams of one control plane, in the order they were opened.
#[derive(Debug)]
pub struct Members {
    open: Mutex<BTreeSet<u64>>,
    /// Bumped whenever a stream opens or closes: every stream recomputes its part.
    changed: watch::Sender<u64>,
}

impl Default for Members {
    fn default() -> Self {
        Self {
            open: Mutex::new(BTreeSet::new()),
            changed: watch::Sender::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Members {
    pub fn join(&self, id: u64) {
        lock(&self.open).insert(id);
        self.changed.send_modify(|epoch| *epoch += 1);
    }

    pub fn leave(&self, id: u64) {
        if lock(&self.open).remove(&id) {
            self.changed.send_modify(|epoch| *epoch += 1);
        }
    }

    /// Wakes on every join and leave.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Stream `id`'s place among the open ones and how many are open.
    pub fn place(&self, id: u64) -> (usize, usize) {
        let open = lock(&self.open);
        let index = open.iter().position(|o| *o == id).unwrap_or(0);
        (index, open.len().max(1))
    }
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
}

//! The records the workers of one Envoy change together, each with [`cas_update`]: a
//! provider's in-flight counts and holds, a billing scope's sends, a virtual key's minute.

use ai_router_contract::shared as names;
use ai_router_proto::v1::MinuteCallsRequest;

use super::{cas_update, Change, SharedData, SharedError};
use crate::vm::local::{Allowance, InFlight, ProviderHolds, Send, Sends};
use crate::vm::minute_lease::{Ask, MinuteLease};
use crate::vocab::{LaneId, LocalHold};
use ai_router_contract::failure::ErrorClass;

/// Changes a record that starts again from its default when absent or undecodable.
fn update<T: Default>(
    shared: &mut impl SharedData,
    name: &str,
    decode: impl Fn(&[u8]) -> Option<T>,
    encode: impl Fn(&T) -> Vec<u8>,
    change: impl Fn(&mut T),
) -> Result<(), SharedError> {
    cas_update(shared, name, |bytes| {
        let mut value = bytes.and_then(&decode).unwrap_or_default();
        change(&mut value);
        Change::Write(encode(&value), ())
    })
}

/// Adds `delta` to a key's in-flight count across the workers; how much the provider's total
/// moved, when written.
pub fn add_in_flight(
    shared: &mut impl SharedData,
    provider: &str,
    key: &str,
    delta: i32,
) -> Option<i64> {
    cas_update(shared, &names::in_flight(provider), |bytes| {
        let mut f = bytes.and_then(InFlight::decode).unwrap_or_default();
        let before = i64::from(f.total());
        f.add(key, delta);
        Change::Write(f.encode(), i64::from(f.total()) - before)
    })
    .ok()
}

/// Reserves one send on a provider's billing scope when its allowances leave room; `false`
/// when they do not. A record that cannot be written lets the send go, unreserved, rather than
/// fail the call.
pub fn reserve_send(
    shared: &mut impl SharedData,
    provider: &str,
    send: &Send,
    allowances: &[Allowance],
) -> bool {
    cas_update(shared, &names::sends(provider, &send.scope), |bytes| {
        let mut sends = bytes.and_then(Sends::decode).unwrap_or_default();
        if sends.reserve(send.clone(), allowances) {
            Change::Write(sends.encode(), true)
        } else {
            Change::Keep(false)
        }
    })
    .unwrap_or(true)
}

/// Gives a reservation back.
pub fn release_send(shared: &mut impl SharedData, provider: &str, send: &Send) {
    let _ = update(
        shared,
        &names::sends(provider, &send.scope),
        Sends::decode,
        Sends::encode,
        |s| s.release(send),
    );
}

/// Puts a hold on `key` (and `model`; `""` for every model of the key) for every worker.
pub fn hold(
    shared: &mut impl SharedData,
    provider: &str,
    key: &str,
    model: &str,
    hold: LocalHold,
    now_ms: i64,
) {
    let _ = update(
        shared,
        &names::holds(provider),
        ProviderHolds::decode,
        ProviderHolds::encode,
        |h| h.put(key, model, hold, now_ms),
    );
}

/// Cools a lane for every worker (the control plane's push follows).
pub fn hold_cooldown(shared: &mut impl SharedData, lane: &LaneId, until_ms: i64, now_ms: i64) {
    let cooldown = LocalHold::Cooldown {
        until_ms,
        set_at_ms: now_ms,
    };
    hold(
        shared,
        &lane.provider,
        &lane.key,
        &lane.model,
        cooldown,
        now_ms,
    );
}

/// Takes a key out for every worker: every model of it, one key-wide hold.
pub fn hold_blacklist(
    shared: &mut impl SharedData,
    provider: &str,
    key: &str,
    (class, until_ms, fingerprint): (ErrorClass, i64, u64),
    now_ms: i64,
) {
    let blacklist = LocalHold::Blacklist {
        class,
        until_ms,
        fingerprint,
        set_at_ms: now_ms,
    };
    hold(shared, provider, key, "", blacklist, now_ms);
}

/// Admits one request of the virtual key `key_id` (`requestsPerMinute` = `limit`) by its
/// minute record: whether it is admitted, and the ask for the next block to hand to the
/// singleton when the record took one. `None` when the record could not be updated.
pub fn admit_minute_request(
    shared: &mut impl SharedData,
    key_id: &str,
    limit: u64,
    now_ms: i64,
) -> Option<(bool, Option<MinuteCallsRequest>)> {
    let minute = crate::vm::minute_lease::minute_of(now_ms);
    let verdict = cas_update(shared, &names::minute_requests(key_id), |bytes| {
        let stored = bytes.and_then(MinuteLease::decode);
        let (lease, verdict) = MinuteLease::admit(stored, minute, limit, now_ms);
        Change::Write(lease.encode().to_vec(), verdict)
    })
    .ok()?;
    let ask = verdict.ask.map(|ask| MinuteCallsRequest {
        virtual_key_id: key_id.to_owned(),
        minute: ask.minute,
        calls: u64::from(ask.calls),
        limit,
    });
    Some((verdict.admitted, ask))
}

/// Writes the control plane's answer to an ask into the key's minute record (`granted`:
/// `None` when it did not answer).
pub fn minute_answered(shared: &mut impl SharedData, key_id: &str, ask: Ask, granted: Option<u32>) {
    let _ = cas_update(shared, &names::minute_requests(key_id), |bytes| {
        let stored = bytes.and_then(MinuteLease::decode);
        match MinuteLease::answered(stored, ask, granted) {
            Some(lease) => Change::Write(lease.encode().to_vec(), ()),
            None => Change::Keep(()),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::{read_record, MemoryShared};

    #[test]
    fn in_flight_counts_survive_a_race_and_report_the_move() {
        let mut shared = MemoryShared::default();
        assert_eq!(add_in_flight(&mut shared, "p", "a", 1), Some(1));
        shared.race(&names::in_flight("p"), 2);
        assert_eq!(add_in_flight(&mut shared, "p", "a", 1), Some(1));
        assert_eq!(add_in_flight(&mut shared, "p", "b", -1), Some(0));
        let f = read_record(&shared, &names::in_flight("p"), InFlight::decode);
        assert_eq!(f.of("a"), 2);
    }

    #[test]
    fn an_unwritable_in_flight_record_moves_nothing() {
        let mut shared = MemoryShared::default();
        shared.fail(&names::in_flight("p"), 1);
        assert_eq!(add_in_flight(&mut shared, "p", "a", 1), None);
    }
}

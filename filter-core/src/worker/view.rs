//! The picker's view backed by shared data and the worker: each provider's records are read
//! once per lane choice, whatever its number of keys.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ai_router_contract::shared as names;

use super::Worker;
use crate::lanes::park::ParkedLanes;
use crate::state::LaneHealth;
use crate::vm::local::{InFlight, ProviderHolds, Sends};
use crate::vm::view::View;
use crate::vm::{read_record, read_versioned, SharedData};
use crate::vocab::{LaneId, LocalHold};

/// What this VM's workers wrote about one provider, read once per lane choice.
struct ProviderLocal {
    holds: ProviderHolds,
    in_flight: InFlight,
}

/// One lane choice's view: what it read, kept for the rest of the choice.
pub struct WorkerView<'a, S, T> {
    shared: S,
    worker: &'a Worker<T>,
    providers: RefCell<HashMap<String, Rc<ProviderLocal>>>,
    /// Per provider, then per billing scope (looked up without allocating).
    sends: RefCell<HashMap<String, HashMap<String, Sends>>>,
    health: RefCell<HashMap<String, Option<Rc<LaneHealth>>>>,
    parked: RefCell<HashMap<String, ParkedLanes>>,
}

impl<'a, S: SharedData + Clone + 'static, T> WorkerView<'a, S, T> {
    pub fn new(shared: S, worker: &'a Worker<T>) -> Self {
        Self {
            shared,
            worker,
            providers: RefCell::default(),
            sends: RefCell::default(),
            health: RefCell::default(),
            parked: RefCell::default(),
        }
    }

    fn local(&self, provider: &str) -> Rc<ProviderLocal> {
        if let Some(hit) = self.providers.borrow().get(provider) {
            return hit.clone();
        }
        let local = Rc::new(ProviderLocal {
            holds: read_record(&self.shared, &names::holds(provider), ProviderHolds::decode),
            in_flight: read_record(&self.shared, &names::in_flight(provider), InFlight::decode),
        });
        self.providers
            .borrow_mut()
            .insert(provider.to_string(), local.clone());
        local
    }
}

impl<S: SharedData + Clone + 'static, T> View for WorkerView<'_, S, T> {
    fn holds(&self, lane: &LaneId) -> Vec<LocalHold> {
        self.local(&lane.provider)
            .holds
            .of_lane(&lane.key, &lane.model)
    }

    fn in_flight(&self, provider: &str, key: &str) -> u32 {
        self.local(provider).in_flight.of(key)
    }

    fn provider_in_flight(&self, provider: &str) -> u32 {
        self.local(provider).in_flight.total()
    }

    fn sent_since(&self, provider: &str, scope: &str, model: &str, since_ms: i64) -> (u64, u64) {
        // Read only when a lane has headroom to check, once per scope and pick.
        if let Some(hit) = self.sends.borrow().get(provider).and_then(|p| p.get(scope)) {
            return hit.since(scope, model, since_ms);
        }
        let sends = read_record(&self.shared, &names::sends(provider, scope), Sends::decode);
        let out = sends.since(scope, model, since_ms);
        self.sends
            .borrow_mut()
            .entry(provider.to_string())
            .or_default()
            .insert(scope.to_string(), sends);
        out
    }

    fn latency(&self, lane: &LaneId) -> Option<f64> {
        self.worker.latency(lane)
    }

    fn health(&self, provider: &str) -> Option<Rc<LaneHealth>> {
        if let Some(hit) = self.health.borrow().get(provider) {
            return hit.clone();
        }
        let health = self.worker.lane_health(&self.shared, provider);
        self.health
            .borrow_mut()
            .insert(provider.to_string(), health.clone());
        health
    }

    fn synced_at_ms(&self) -> Option<i64> {
        Some(self.worker.synced_at_ms())
    }

    fn parked(&self, lane: &LaneId) -> Option<i64> {
        // Read only for calls with an interval, once per provider and pick.
        if let Some(hit) = self.parked.borrow().get(&lane.provider) {
            return hit.probe_at(&lane.key, &lane.model);
        }
        let parked = read_versioned(&self.shared, &names::parked(&lane.provider))
            .0
            .and_then(|b| ParkedLanes::decode(&b))
            .unwrap_or_default();
        let out = parked.probe_at(&lane.key, &lane.model);
        self.parked
            .borrow_mut()
            .insert(lane.provider.clone(), parked);
        out
    }
}

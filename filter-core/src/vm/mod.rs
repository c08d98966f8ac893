//! What the workers of one Envoy share: calls, holds and sends, minute leases, outcome
//! reports, lane records, the plugin configuration.

pub mod calls;
pub mod lane_records;
pub mod local;
pub mod minute_lease;
pub mod plugin;
pub mod reports;
pub mod round_robin;
pub mod view;

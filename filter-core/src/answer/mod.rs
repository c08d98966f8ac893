//! What a caller is answered and what a report carries: the gateway's errors, the routing
//! trail, redaction of keys, recorded content.

pub mod content;
pub mod errors;
pub mod overhead;
pub mod redact;
pub mod trail;

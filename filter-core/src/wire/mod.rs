//! Byte and text formats the stages read and write: server-sent events, headers, the
//! W3C trace state, percent-escapes.

pub mod headers;
pub mod percent;
pub mod sse;
pub mod trace_state;

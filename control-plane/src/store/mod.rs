//! Where the engine's durable state lives (memory or SQLite), and the SQLite schema the state
//! store and the key store share.

pub mod sqlite;
pub mod state;

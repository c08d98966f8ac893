//! Generated types for `airouter.v1`: the control plane <-> filter sync protocol and the admin
//! protocol.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/airouter.v1.rs"));
}

pub mod listing;
pub mod tables;
pub mod text;

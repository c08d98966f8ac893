//! The state the control plane pushes, as this VM holds it.

pub mod state;

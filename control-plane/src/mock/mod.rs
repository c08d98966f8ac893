//! The scriptable fake provider.

//! Renders the Envoy bootstrap.

//! The ai-router proxy-wasm filter. One module, four roles chosen by the plugin configuration:
//!
//! - `front` (public listener): routes, authenticates the virtual key, parses the body,
//!   resolves the profile or model and writes the call plan; on the way back it turns a final
//!   failure into the gateway's error answer and adds the routing headers.
//! - `attempt` (internal listener, once per attempt): picks a lane, injects the key, rewrites
//!   the request for the provider, and classifies the answer; a retryable failure is turned
//!   into a signal the outer router retries on.
//! - `first` (with `gateway.onePass`, the upstream filter of the public route's one-pass
//!   cluster): the attempt stage on a call's first attempt, the lane the front reserved; on a
//!   retry it puts back the client's headers that attempt rewrote.
//! - `ctrl` (a singleton per Envoy process): holds the control plane's sync stream and
//!   publishes the state to the workers through shared data, and sends their reports back.
//!
//! Everything that decides (routing, lane choice, classification, the stream gate) lives in
//! `ai-router-filter-core` and is unit-tested on the host; this crate is the proxy-wasm glue.

mod glue;

proxy_wasm::main! {{
    glue::register();
}}

//! The proxy-wasm glue: root contexts, the shared view of the state and of this VM's calls.

mod attempt;
mod ctrl;
mod front;
mod host;
mod shared;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginConfig {
    role: String,
    /// ctrl: the gRPC cluster of the control plane.
    #[serde(default)]
    grpc_cluster: Option<String>,
    /// ctrl: how this Envoy names itself to the control plane.
    #[serde(default)]
    node: Option<String>,
    /// ctrl: tick period.
    #[serde(default)]
    tick_ms: Option<u64>,
}

pub fn register() {
    proxy_wasm::set_log_level(LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        let _ = proxy_wasm::hostcalls::log(
            LogLevel::Critical,
            &format!("ai-router filter panicked: {info}"),
        );
    }));
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}

#[derive(Default)]
struct Root {
    role: Role,
}

#[derive(Default)]
enum Role {
    #[default]
    Unconfigured,
    Front,
    Attempt,
    Ctrl(Box<ctrl::Ctrl>),
}

impl Context for Root {
    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        if let Role::Ctrl(c) = &mut self.role {
            c.on_stream_message(token, size);
        }
    }

    fn on_grpc_stream_close(&mut self, token: u32, status: u32) {
        if let Role::Ctrl(c) = &mut self.role {
            c.on_stream_close(token, status);
        }
    }

    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        if let Role::Ctrl(c) = &mut self.role {
            c.on_call_response(token, status, size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let raw = if size == 0 {
            None
        } else {
            host::plugin_configuration()
        };
        let config: PluginConfig = match raw.as_deref().map(serde_json::from_slice) {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                log_error(&format!("ai-router: bad plugin configuration: {e}"));
                return false;
            }
            None => {
                log_error(
                    "ai-router: the plugin configuration is missing (expected {\"role\":...})",
                );
                return false;
            }
        };
        self.role = match config.role.as_str() {
            "front" => Role::Front,
            "attempt" => {
                // The attempts' own timeouts are checked on this root's tick.
                let tick =
                    std::time::Duration::from_millis(ai_router_filter_core::attempt::BOUND_TICK_MS);
                if let Err(status) = proxy_wasm::hostcalls::set_tick_period(tick) {
                    log_error(&format!("ai-router: set_tick_period failed: {status:?}"));
                    return false;
                }
                Role::Attempt
            }
            "ctrl" => {
                let mut c = ctrl::Ctrl::new(
                    config
                        .grpc_cluster
                        .unwrap_or_else(|| "ai_router_control_plane".into()),
                    config.node.unwrap_or_else(|| "envoy".into()),
                );
                c.start(config.tick_ms.unwrap_or(500));
                Role::Ctrl(Box::new(c))
            }
            other => {
                log_error(&format!(
                    "ai-router: unknown role '{other}' (front, attempt or ctrl)"
                ));
                return false;
            }
        };
        true
    }

    fn on_tick(&mut self) {
        match &mut self.role {
            Role::Ctrl(c) => c.on_tick(),
            Role::Attempt => attempt::on_tick(),
            _ => {}
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Role::Ctrl(c) = &mut self.role {
            c.on_queue_ready(queue_id);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        match self.role {
            Role::Front => Some(Box::new(front::Front::default())),
            Role::Attempt => Some(Box::new(attempt::Attempt::new(context_id))),
            _ => None,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        match self.role {
            Role::Front | Role::Attempt => Some(ContextType::HttpContext),
            _ => None,
        }
    }
}

pub(crate) fn log_error(msg: &str) {
    let _ = proxy_wasm::hostcalls::log(LogLevel::Error, msg);
}

pub(crate) fn log_info(msg: &str) {
    let _ = proxy_wasm::hostcalls::log(LogLevel::Info, msg);
}

//! The proxy-wasm glue: root contexts that own this VM's [`Worker`] and hand it to each
//! context, contexts that forward Envoy's callbacks to the stages, and the host calls.

mod attempt;
mod ctrl;
mod front;
mod gauges;
mod host;
mod prof;

use std::rc::Rc;

use ai_router_filter_core::vm::plugin;
use ai_router_filter_core::worker::{self, on_worker::OnWorker};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

/// The per-VM state, with the attempt stage's contexts in flight.
type Worker = worker::Worker<ai_router_filter_core::attempt::Attempt>;

/// A stage's host for one callback.
type WasmHost<'a> = OnWorker<'a, host::WasmCalls, ai_router_filter_core::attempt::Attempt>;

fn wasm_host(worker: &Worker) -> WasmHost<'_> {
    OnWorker::new(host::WasmCalls, worker)
}

thread_local! {
    /// The front and attempt roots of one worker's VM (one `vm_id`) share one worker: the
    /// front and attempt stages of a call meet in its call table.
    static WORKER: Rc<Worker> = Rc::default();
}

pub fn register() {
    proxy_wasm::set_log_level(LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        let _ = proxy_wasm::hostcalls::log(
            LogLevel::Critical,
            &format!("ai-router filter panicked: {info}"),
        );
    }));
    proxy_wasm::set_root_context(|_| {
        Box::new(Root {
            role: Role::default(),
            worker: WORKER.with(Rc::clone),
        })
    });
}

struct Root {
    role: Role,
    worker: Rc<Worker>,
}

#[derive(Default)]
enum Role {
    #[default]
    Unconfigured,
    Front(Option<Rc<ai_router_contract::plugin::OnePass>>),
    Attempt,
    /// The attempt stage as the one-pass aggregate's upstream filter.
    First,
    Ctrl(Box<ctrl::Ctrl>),
}

impl Context for Root {
    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        if let Role::Ctrl(c) = &mut self.role {
            prof::time("ctrl.stream_message", || c.on_stream_message(token, size));
        }
    }

    fn on_grpc_stream_close(&mut self, token: u32, status: u32) {
        if let Role::Ctrl(c) = &mut self.role {
            c.on_stream_close(token, status);
        }
    }

    fn on_grpc_call_response(&mut self, token: u32, status: u32, size: usize) {
        if let Role::Ctrl(c) = &mut self.role {
            prof::time("ctrl.call_response", || {
                c.on_call_response(token, status, size)
            });
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
        let role = match plugin::parse(raw.as_deref()) {
            Ok(role) => role,
            Err(message) => {
                log_error(&message);
                return false;
            }
        };
        self.role = match role {
            plugin::Role::Front { one_pass } => Role::Front(one_pass.map(Rc::new)),
            // The attempt role's tick checks every attempt of the worker, these too.
            plugin::Role::First => Role::First,
            plugin::Role::Attempt => {
                // The attempts' own timeouts are checked on this root's tick.
                let tick =
                    std::time::Duration::from_millis(ai_router_filter_core::attempt::BOUND_TICK_MS);
                if let Err(status) = proxy_wasm::hostcalls::set_tick_period(tick) {
                    log_error(&format!("ai-router: set_tick_period failed: {status:?}"));
                    return false;
                }
                Role::Attempt
            }
            plugin::Role::Ctrl {
                grpc_cluster,
                node,
                tick_ms,
            } => {
                let mut c = ctrl::Ctrl::new(grpc_cluster, node);
                c.start(tick_ms);
                Role::Ctrl(Box::new(c))
            }
        };
        true
    }

    fn on_tick(&mut self) {
        match &mut self.role {
            Role::Ctrl(c) => prof::time("ctrl.tick", || {
                gauges::track_memory();
                c.on_tick();
            }),
            Role::Attempt => prof::time("attempt.tick", || attempt::on_tick(&self.worker)),
            _ => {}
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Role::Ctrl(c) = &mut self.role {
            prof::time("ctrl.queue_ready", || c.on_queue_ready(queue_id));
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone();
        match &self.role {
            Role::Front(one_pass) => Some(Box::new(front::Front::new(worker, one_pass.clone()))),
            Role::Attempt => Some(Box::new(attempt::Attempt::new(context_id, worker, false))),
            Role::First => Some(Box::new(attempt::Attempt::new(context_id, worker, true))),
            _ => None,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        match self.role {
            Role::Front(_) | Role::Attempt | Role::First => Some(ContextType::HttpContext),
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

//! `ai-router`: the control plane, the mock provider, the Envoy renderer and the local runner.
//! The command line lives in the library (`cli/`).

fn main() -> std::process::ExitCode {
    ai_router_control_plane::cli::main()
}

//! Envoy's own error replies, as `render-envoy` writes them, speak the gateway's one closed set
//! of codes (`ai_router_contract::error_code`): every code is in it, sent with its own status
//! and the OpenAI `type` of that status; the catch-all for any other status is `gateway_error`.

use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::openai_error_type;
use ai_router_control_plane::config::ListenerLimits;
use ai_router_control_plane::render::{render_envoy, RenderOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn envoys_replies_are_gateway_codes() -> Result<()> {
    let yaml = render_envoy(&RenderOptions {
        listen_host: "127.0.0.1".into(),
        listen_port: 8080,
        admin_host: "127.0.0.1".into(),
        admin_port: 9901,
        control_plane_host: "127.0.0.1".into(),
        control_plane_port: 8082,
        more_control_planes: Vec::new(),
        wasm_path: "ai_router_filter.wasm".into(),
        sync_tls_dir: None,
        max_body_bytes: 1024,
        max_attempts: 4,
        limits: ListenerLimits::default(),
        one_pass: None,
    });
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml)?;
    let hcm =
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let mappers = hcm["local_reply_config"]["mappers"]
        .as_sequence()
        .ok_or("no local reply mappers")?;
    let (catch_all, by_status) = mappers.split_last().ok_or("no mappers")?;
    assert!(!by_status.is_empty());
    for mapper in by_status {
        // A refused WebSocket upgrade is matched by its response detail and answered 426.
        let status = if mapper["filter"]["extension_filter"].is_mapping() {
            mapper["status_code"].as_u64()
        } else {
            mapper["filter"]["and_filter"]["filters"][0]["status_code_filter"]["comparison"]
                ["value"]["default_value"]
                .as_u64()
        }
        .and_then(|s| u16::try_from(s).ok())
        .ok_or("a mapper without a status")?;
        let error = &mapper["body_format_override"]["json_format"]["error"];
        let name = error["code"].as_str().ok_or("a reply without a code")?;
        let code = ErrorCode::parse(name).ok_or(format!("{name} is not a gateway code"))?;
        assert_eq!(code.status(), status, "{name}");
        assert_eq!(
            error["type"].as_str(),
            Some(openai_error_type(status)),
            "{name}"
        );
    }
    let error = &catch_all["body_format_override"]["json_format"]["error"];
    assert_eq!(
        error["code"].as_str(),
        Some(ErrorCode::GatewayError.as_str())
    );
    Ok(())
}

//! The plugin configuration Envoy hands each root context (`{"role": ...}` in the rendered
//! bootstrap): which stage this root runs, and for the ctrl singleton how it reaches the control
//! plane. Parsed once in `on_configure`; a bad one makes the root refuse its configuration.

use ai_router_contract::plugin::{
    roles, OnePass, PluginConfig, DEFAULT_NODE, DEFAULT_TICK_MS, TICK_MS,
};

/// What a root context runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// `one_pass`: what the public route can send in one pass (`gateway.onePass`).
    Front {
        one_pass: Option<OnePass>,
    },
    Attempt,
    /// The attempt stage as the one-pass aggregate's upstream filter.
    First,
    /// The singleton that holds the control-plane stream.
    Ctrl {
        grpc_cluster: String,
        node: String,
        tick_ms: u64,
    },
}

/// The role `raw` (the plugin configuration's bytes, `None` when Envoy gave none) configures;
/// the error is the log line.
pub fn parse(raw: Option<&[u8]>) -> Result<Role, String> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Err(
            "ai-router: the plugin configuration is missing (expected {\"role\":...})".into(),
        );
    };
    let config: PluginConfig = serde_json::from_slice(raw)
        .map_err(|e| format!("ai-router: bad plugin configuration: {e}"))?;
    match config.role.as_str() {
        roles::FRONT => Ok(Role::Front {
            one_pass: config.one_pass,
        }),
        roles::ATTEMPT => Ok(Role::Attempt),
        roles::FIRST => Ok(Role::First),
        roles::CTRL => {
            let tick_ms = config.tick_ms.unwrap_or(DEFAULT_TICK_MS);
            if !TICK_MS.contains(&tick_ms) {
                return Err(format!(
                    "ai-router: bad plugin configuration: tick_ms {tick_ms} is not from {} to {}",
                    TICK_MS.start(),
                    TICK_MS.end()
                ));
            }
            Ok(Role::Ctrl {
                grpc_cluster: config
                    .grpc_cluster
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| ai_router_contract::clusters::CONTROL_PLANE.into()),
                node: config
                    .node
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| DEFAULT_NODE.into()),
                tick_ms,
            })
        }
        other => Err(format!(
            "ai-router: unknown role '{other}' (front, attempt, first or ctrl)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_and_the_ctrl_defaults() {
        assert_eq!(
            parse(Some(br#"{"role":"front"}"#)),
            Ok(Role::Front { one_pass: None })
        );
        assert_eq!(
            parse(Some(
                br#"{"role":"front","one_pass":{"hosts":["127.0.0.1:9"],"retries":2}}"#
            )),
            Ok(Role::Front {
                one_pass: Some(OnePass {
                    hosts: vec!["127.0.0.1:9".into()],
                    retries: 2
                })
            })
        );
        assert_eq!(parse(Some(br#"{"role":"first"}"#)), Ok(Role::First));
        assert_eq!(parse(Some(br#"{"role":"attempt"}"#)), Ok(Role::Attempt));
        assert_eq!(
            parse(Some(br#"{"role":"ctrl"}"#)),
            Ok(Role::Ctrl {
                grpc_cluster: ai_router_contract::clusters::CONTROL_PLANE.into(),
                node: "envoy".into(),
                tick_ms: DEFAULT_TICK_MS,
            })
        );
        assert_eq!(
            parse(Some(
                br#"{"role":"ctrl","grpc_cluster":"cp","node":"edge-1","tick_ms":250}"#
            )),
            Ok(Role::Ctrl {
                grpc_cluster: "cp".into(),
                node: "edge-1".into(),
                tick_ms: 250,
            })
        );
    }

    /// One tick range (the contract's): its bounds are taken as given, a period past them is
    /// refused, never clamped elsewhere.
    #[test]
    fn the_tick_range_is_the_contracts() {
        let ctrl = |tick_ms: u64| {
            parse(Some(
                format!(r#"{{"role":"ctrl","tick_ms":{tick_ms}}}"#).as_bytes(),
            ))
        };
        for tick_ms in [*TICK_MS.start(), DEFAULT_TICK_MS, *TICK_MS.end()] {
            assert!(
                matches!(ctrl(tick_ms), Ok(Role::Ctrl { tick_ms: t, .. }) if t == tick_ms),
                "{tick_ms}"
            );
        }
        for tick_ms in [TICK_MS.start() - 1, TICK_MS.end() + 1] {
            let err = ctrl(tick_ms).unwrap_err();
            assert!(err.contains(&format!("tick_ms {tick_ms}")), "{err}");
        }
    }

    #[test]
    fn a_bad_configuration_is_refused_with_its_reason() {
        for (raw, says) in [
            (None, "missing"),
            (Some(&b""[..]), "missing"),
            (Some(&b"{"[..]), "bad plugin configuration"),
            (Some(&br#"{"role":"front","extra":1}"#[..]), "unknown field"),
            (Some(&br#"{"role":"proxy"}"#[..]), "unknown role 'proxy'"),
            (Some(&br#"{"role":"ctrl","tick_ms":0}"#[..]), "tick_ms 0"),
            (Some(&br#"{"role":7}"#[..]), "bad plugin configuration"),
        ] {
            let err = parse(raw).unwrap_err();
            assert!(err.contains(says), "{raw:?}: {err}");
        }
    }
}

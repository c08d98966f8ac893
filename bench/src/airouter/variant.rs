//! ai-router with one feature of its rendered Envoy bootstrap removed or replaced (system
//! `ai-router@VARIANT`, variants joined with `+`): the ablation study of what ai-router's Envoy
//! configuration costs (docs/benchmarks.md, issue 32). The bootstrap `ai-router render-envoy`
//! renders is edited before Envoy reads it; every variant still answers the fake upstream's
//! completion (the bench checks each answer), but a variant may lose a promised behaviour
//! (retries, timeouts, OpenAI-shaped local replies, any provider host): it measures a cost, it
//! is not a configuration to run.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// Every variant, with what it changes.
pub const VARIANTS: [(&str, &str); 13] = [
    ("no-retry", "no retry_policy on the public route"),
    (
        "no-attempt-count",
        "no include_request_attempt_count on the public virtual host",
    ),
    (
        "no-request-id",
        "generate_request_id: false on both listeners",
    ),
    (
        "no-timeouts",
        "no request_headers_timeout, request_timeout, delayed_close_timeout on the public listener",
    ),
    ("no-local-reply", "no local_reply_config (its CEL mappers)"),
    (
        "static-upstream",
        "no dynamic forward proxy: the attempt listener's DFP filter removed, providers_plain a static cluster to the fake upstream, providers_tls removed",
    ),
    ("no-overload", "no overload_manager"),
    ("no-allocator-manager", "no memory_allocator_manager"),
    (
        "no-http2-options",
        "no http2_protocol_options on the public listener",
    ),
    (
        "no-underscore-drop",
        "no headers_with_underscores_action (common_http_protocol_options)",
    ),
    (
        "no-buffer-limits",
        "no per_connection_buffer_limit_bytes (listeners and clusters)",
    ),
    ("no-admin-route", "no /admin/ route on the public listener"),
    ("all", "every variant above at once"),
];

/// The variants of `spec` (`no-retry+no-timeouts`), checked; `all` expanded.
pub fn parse(spec: &str) -> Result<Vec<&'static str>> {
    let mut out: Vec<&'static str> = Vec::new();
    for part in spec.split('+').map(str::trim) {
        let Some((name, _)) = VARIANTS.iter().find(|(n, _)| *n == part) else {
            bail!(
                "unknown Envoy variant {part:?} (one of {})",
                VARIANTS.map(|(n, _)| n).join(", ")
            );
        };
        if *name == "all" {
            out.extend(VARIANTS.iter().map(|(n, _)| *n).filter(|n| *n != "all"));
        } else {
            out.push(name);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// What `variants` change, in words.
pub fn describe(variants: &[&str]) -> String {
    variants
        .iter()
        .filter_map(|v| VARIANTS.iter().find(|(n, _)| n == v))
        .map(|(_, what)| *what)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The rendered bootstrap (`yaml`) with `variants` applied, as JSON (which Envoy reads as YAML).
/// `upstream_port`: the fake upstream's, for `static-upstream`.
pub fn apply(yaml: &str, variants: &[&str], upstream_port: u16) -> Result<String> {
    let mut b: Value = serde_yaml_ng::from_str(yaml).context("parsing the rendered bootstrap")?;
    for v in variants {
        edit(&mut b, v, upstream_port).with_context(|| format!("Envoy variant {v}"))?;
    }
    Ok(serde_json::to_string_pretty(&b)?)
}

fn edit(b: &mut Value, variant: &str, upstream_port: u16) -> Result<()> {
    match variant {
        "no-retry" => remove(public_route(b)?, "retry_policy"),
        "no-attempt-count" => remove(
            at(hcm(b, "ai_router_public")?, "/route_config/virtual_hosts/0")?,
            "include_request_attempt_count",
        ),
        "no-request-id" => {
            for l in ["ai_router_public", "ai_router_attempt"] {
                obj(hcm(b, l)?)?.insert("generate_request_id".into(), json!(false));
            }
            Ok(())
        }
        "no-timeouts" => {
            let h = hcm(b, "ai_router_public")?;
            for k in [
                "request_headers_timeout",
                "request_timeout",
                "delayed_close_timeout",
            ] {
                remove(h, k)?;
            }
            Ok(())
        }
        "no-local-reply" => remove(hcm(b, "ai_router_public")?, "local_reply_config"),
        "static-upstream" => static_upstream(b, upstream_port),
        "no-overload" => remove(b, "overload_manager"),
        "no-allocator-manager" => remove(b, "memory_allocator_manager"),
        "no-http2-options" => remove(hcm(b, "ai_router_public")?, "http2_protocol_options"),
        "no-underscore-drop" => remove(
            at(hcm(b, "ai_router_public")?, "/common_http_protocol_options")?,
            "headers_with_underscores_action",
        ),
        "no-buffer-limits" => {
            for section in ["listeners", "clusters"] {
                for item in array(at(b, &format!("/static_resources/{section}"))?)? {
                    if let Some(m) = item.as_object_mut() {
                        m.remove("per_connection_buffer_limit_bytes");
                    }
                }
            }
            Ok(())
        }
        "no-admin-route" => {
            let routes = array(at(
                hcm(b, "ai_router_public")?,
                "/route_config/virtual_hosts/0/routes",
            )?)?;
            let before = routes.len();
            routes.retain(|r| r.pointer("/match/prefix") != Some(&json!("/admin/")));
            if routes.len() == before {
                bail!("no /admin/ route");
            }
            Ok(())
        }
        other => bail!("unknown variant {other}"),
    }
}

/// The attempt listener without its dynamic forward proxy filter; `providers_plain` a static
/// cluster to the fake upstream (HTTP/1.1, as the DFP cluster speaks to a plain host);
/// `providers_tls` gone.
fn static_upstream(b: &mut Value, upstream_port: u16) -> Result<()> {
    let filters = array(at(hcm(b, "ai_router_attempt")?, "/http_filters")?)?;
    let before = filters.len();
    filters.retain(|f| f.get("name") != Some(&json!("envoy.filters.http.dynamic_forward_proxy")));
    if filters.len() == before {
        bail!("no dynamic forward proxy filter on the attempt listener");
    }
    let clusters = array(at(b, "/static_resources/clusters")?)?;
    clusters.retain(|c| c.get("name") != Some(&json!("providers_tls")));
    let plain = clusters
        .iter_mut()
        .find(|c| c.get("name") == Some(&json!("providers_plain")))
        .ok_or_else(|| anyhow!("no cluster providers_plain"))?;
    let breakers = plain.get("circuit_breakers").cloned();
    let mut cluster = json!({
        "name": "providers_plain",
        "type": "STATIC",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http_protocol_options": {} }
            }
        },
        "load_assignment": {
            "cluster_name": "providers_plain",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                "socket_address": { "address": "127.0.0.1", "port_value": upstream_port }
            } } }] }]
        }
    });
    if let (Some(breakers), Some(m)) = (breakers, cluster.as_object_mut()) {
        m.insert("circuit_breakers".into(), breakers);
    }
    *plain = cluster;
    Ok(())
}

fn at<'a>(v: &'a mut Value, pointer: &str) -> Result<&'a mut Value> {
    v.pointer_mut(pointer)
        .ok_or_else(|| anyhow!("no {pointer} in the bootstrap"))
}

fn obj(v: &mut Value) -> Result<&mut serde_json::Map<String, Value>> {
    v.as_object_mut().ok_or_else(|| anyhow!("not a map"))
}

fn array(v: &mut Value) -> Result<&mut Vec<Value>> {
    v.as_array_mut().ok_or_else(|| anyhow!("not a list"))
}

/// Removes `key` from the map `v`; an error if it was not there (the variant changed nothing).
fn remove(v: &mut Value, key: &str) -> Result<()> {
    obj(v)?
        .remove(key)
        .map(|_| ())
        .ok_or_else(|| anyhow!("no {key} to remove"))
}

/// The HTTP connection manager of listener `name`.
fn hcm<'a>(b: &'a mut Value, name: &str) -> Result<&'a mut Value> {
    let listeners = array(at(b, "/static_resources/listeners")?)?;
    let l = listeners
        .iter_mut()
        .find(|l| l.get("name") == Some(&json!(name)))
        .ok_or_else(|| anyhow!("no listener {name}"))?;
    at(l, "/filter_chains/0/filters/0/typed_config")
}

/// The public listener's catch-all route's `route`.
fn public_route(b: &mut Value) -> Result<&mut Value> {
    let routes = array(at(
        hcm(b, "ai_router_public")?,
        "/route_config/virtual_hosts/0/routes",
    )?)?;
    let r = routes
        .iter_mut()
        .find(|r| r.pointer("/match/prefix") == Some(&json!("/")))
        .ok_or_else(|| anyhow!("no / route"))?;
    at(r, "/route")
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERED: &str = include_str!("../../../envoy/envoy.yaml");

    #[test]
    fn every_variant_changes_the_example_bootstrap() {
        for (name, _) in VARIANTS {
            let variants = parse(name).unwrap_or_default();
            let out = apply(RENDERED, &variants, 9);
            assert!(out.is_ok(), "{name}: {out:?}");
        }
    }
}

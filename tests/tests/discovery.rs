//! Discovered models (`discover: true`) through a real Envoy and control plane, against mock
//! providers that serve a model catalog per key (`GET /v1/models`):
//! - a model only one key's catalog lists is routed through that key alone, a configured one
//!   through every key that lists it;
//! - a `model_not_found` answer makes the control plane list that key again;
//! - a provider whose `/models` fails neither delays start-up nor stops calls on its
//!   configured models, and its key keeps routing them;
//! - an anthropic provider with no configured model is listed in Anthropic's shape and serves
//!   what it found;
//! - `/admin/catalog` says which models are configured and which discovered, and which key
//!   aliases reach each; `autoPrice` prices a found model from the table; no secret anywhere;
//! - a reload turns discovery on (the key is listed) and off (what it found is gone).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{poll, random_hex, scan, Admin, Pool};
use serde_json::{json, Value};

const ADMIN_TOKEN_ENV: &str = "DISCOVERY_ADMIN_TOKEN";

/// The control plane's admin API with the pool's admin token.
fn admin_api(pool: &Pool) -> Admin {
    pool.admin(ADMIN_TOKEN_ENV).unwrap()
}

/// The catalog's entry of one model on one provider.
fn served<'a>(catalog: &'a Value, model: &str, provider: &str) -> Option<&'a Value> {
    catalog["models"]
        .as_array()?
        .iter()
        .find(|m| m["id"] == model)?["servedBy"]
        .as_array()?
        .iter()
        .find(|s| s["provider"] == provider)
}

fn aliases(entry: &Value) -> Vec<String> {
    entry["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect()
}

/// How many listings mock `i` answered for the key named `key`.
async fn listings(pool: &Pool, mock: usize, key: &str) -> usize {
    pool.calls()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.mock == mock && c.key == key && c.call.path.ends_with("/models"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_routed_through_the_keys_whose_catalog_lists_them() {
    let a = scan::provider_secret("p1-a");
    let b = scan::provider_secret("p1-b");
    let c = scan::provider_secret("p2-c");
    let d = scan::provider_secret("p3-d");
    let admin = format!("adm-{}", random_hex(32));
    scan::register(ADMIN_TOKEN_ENV, &admin);
    let scripts = [
        // p1: key a lists a model of its own, both list the configured one.
        Some(json!({ "catalog": { "keys": {
            a.clone(): ["m-conf", "m-only-a"],
            b.clone(): ["m-conf"],
        } } })),
        // p2: its catalog is down.
        Some(json!({
            "catalog": { "models": ["m-never"] },
            "rules": [{ "match": { "path": "/models" }, "replies": [{ "status": 503 }] }],
        })),
        // p3 (anthropic): the Anthropic shape, asked for by anthropic-version.
        Some(json!({ "catalog": { "models": ["claude-found"] } })),
    ];
    let setup_secrets = [
        ("K_A", a.clone(), "a"),
        ("K_B", b.clone(), "b"),
        ("K_C", c.clone(), "c"),
        ("K_D", d.clone(), "d"),
    ];
    let pool = Pool::start_scripted("discovery", &scripts, |m, _| {
        let mut setup = ai_router_e2e::PoolSetup::default();
        for (var, secret, name) in &setup_secrets {
            setup.env.push(((*var).into(), secret.clone()));
            setup.name_secret(secret, name);
        }
        setup.env.push((ADMIN_TOKEN_ENV.into(), admin.clone()));
        setup.yaml = format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: {ADMIN_TOKEN_ENV} }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             providers:\n\
             \x20 - id: p1\n    kind: openai-compatible\n    baseUrl: {}/v1\n    discover: true\n    discoveryTtlMs: 3600000\n\
             \x20   keys: [{{ alias: a, env: K_A }}, {{ alias: b, env: K_B }}]\n    models: [{{ id: m-conf }}]\n\
             \x20 - id: p2\n    kind: openai-compatible\n    baseUrl: {}/v1\n    discover: true\n\
             \x20   keys: [{{ alias: c, env: K_C }}]\n    models: [{{ id: m2 }}]\n\
             \x20 - id: p3\n    kind: anthropic\n    baseUrl: {}/v1\n    discover: true\n\
             \x20   keys: [{{ alias: d, env: K_D }}]\n\
             resilience:\n  backoff: {{ baseMs: 5, factor: 1, maxMs: 5 }}\n",
            m[0], m[1], m[2]
        );
        Ok(setup)
    })
    .await
    .expect("the pool starts whatever its catalogs answer");

    // The first listings are in the catalog within a few seconds.
    let catalog = poll("the listed catalogs", Duration::from_secs(15), || async {
        let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
        let ready = served(&catalog, "m-only-a", "p1").is_some()
            && served(&catalog, "claude-found", "p3").is_some()
            && catalog["discovery"]
                .as_array()
                .is_some_and(|d| d.iter().any(|k| k["key"] == "c" && !k["error"].is_null()));
        Ok(ready.then_some(catalog))
    })
    .await
    .unwrap();
    // Each key was listed once at start.
    assert_eq!(listings(&pool, 0, "a").await, 1);
    assert_eq!(listings(&pool, 0, "b").await, 1);
    let only_a = served(&catalog, "m-only-a", "p1").unwrap();
    assert_eq!(only_a["source"], "discovered", "{catalog}");
    assert_eq!(aliases(only_a), ["a"], "{catalog}");
    let conf = served(&catalog, "m-conf", "p1").unwrap();
    assert_eq!(conf["source"], "configured", "{catalog}");
    assert_eq!(aliases(conf), ["a", "b"], "{catalog}");
    // p2's listing failed: its key routes its configured model.
    let m2 = served(&catalog, "m2", "p2").unwrap();
    assert_eq!(
        (m2["source"].as_str(), aliases(m2)),
        (Some("configured"), vec!["c".to_owned()])
    );
    assert!(served(&catalog, "m-never", "p2").is_none(), "{catalog}");
    let p2c = catalog["discovery"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["provider"] == "p2")
        .unwrap();
    assert_eq!(p2c["listed"], false, "{catalog}");
    assert!(p2c["error"].as_str().unwrap().contains("503"), "{catalog}");
    let claude = served(&catalog, "claude-found", "p3").unwrap();
    assert_eq!(
        (claude["source"].as_str(), aliases(claude)),
        (Some("discovered"), vec!["d".to_owned()])
    );
    let top = catalog["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "m-only-a")
        .unwrap();
    assert_eq!(top["source"], "discovered");

    // The ledger says per key how many models its listing named, and when; per provider the
    // distinct ones (p2's listing failed: none).
    let ledger = admin_api(&pool).get_json("/admin/ledger").await.unwrap();
    let provider = |id: &str| {
        ledger["providers"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["provider"] == id))
            .cloned()
            .unwrap_or_else(|| panic!("no {id} in {ledger}"))
    };
    let key = |p: &Value, alias: &str| {
        p["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["keys"].as_array().into_iter().flatten())
            .find(|k| k["alias"] == alias)
            .cloned()
            .unwrap_or_else(|| panic!("no key {alias} in {p}"))
    };
    let p1 = provider("p1");
    assert_eq!(p1["discoveredModels"], 2, "{p1}");
    assert_eq!(key(&p1, "a")["discoveredModels"], 2, "{p1}");
    assert_eq!(key(&p1, "b")["discoveredModels"], 1, "{p1}");
    assert!(
        key(&p1, "a")["listedAtMs"].as_i64().unwrap_or(0) > 0,
        "{p1}"
    );
    let p2 = provider("p2");
    assert_eq!(p2["discoveredModels"], Value::Null, "{p2}");
    assert_eq!(key(&p2, "c")["discoveredModels"], Value::Null, "{p2}");
    assert_eq!(provider("p3")["discoveredModels"], 1, "{ledger}");

    // The anthropic listing went out in its own shape.
    let p3_listing = pool
        .calls()
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.mock == 2 && c.call.path.ends_with("/models"))
        .unwrap();
    assert_eq!(p3_listing.key, "d");
    assert!(p3_listing.call.header("anthropic-version").is_some());
    assert!(p3_listing.call.header("authorization").is_none());

    // A model only key a lists goes through key a alone (once Envoy holds the listing).
    pool.clear_calls().await.unwrap();
    poll(
        "Envoy to route m-only-a",
        Duration::from_secs(10),
        || async {
            let r = pool.chat("m-only-a").await?;
            Ok((r.status == 200).then_some(()))
        },
    )
    .await
    .unwrap();
    for i in 0..5 {
        let r = pool.chat("m-only-a").await.unwrap();
        assert_eq!(r.status, 200, "call {i}: {r}");
    }
    let chat_keys = pool.chat_keys().await.unwrap();
    assert!(chat_keys.len() >= 6, "{chat_keys:?}");
    assert!(
        chat_keys.iter().all(|k| k == "a"),
        "only key a lists m-only-a: {chat_keys:?}"
    );

    // A configured model goes through both keys that list it.
    pool.clear_calls().await.unwrap();
    for i in 0..6 {
        let r = pool.chat("m-conf").await.unwrap();
        assert_eq!(r.status, 200, "m-conf call {i}: {r}");
    }
    let mut conf_keys: Vec<String> = pool.keys_called().await.unwrap();
    conf_keys.sort();
    conf_keys.dedup();
    assert_eq!(conf_keys, ["a", "b"]);

    // A catalog that is down stops no call on the configured model.
    let r = pool.chat("m2").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    // What only the anthropic catalog found is served (through the Messages adapter).
    let r = pool.chat("claude-found").await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    // A model_not_found answer through key b lists key b again (the calls seen so far were
    // cleared: every listing counted from here on is a new one).
    pool.clear_calls().await.unwrap();
    pool.mocks[0]
        .push_rule(json!({
            "match": { "key": b, "model": "m-conf" },
            "replies": [{ "providerError": "openai.model_not_found" }],
        }))
        .await
        .unwrap();
    let mut refused = false;
    for _ in 0..6 {
        let r = pool.chat("m-conf").await.unwrap();
        if r.status == 404 {
            refused = true;
            break;
        }
    }
    assert!(refused, "key b answered model_not_found to a call");
    poll("key b listed again", Duration::from_secs(15), || async {
        let n = listings(&pool, 0, "b").await;
        Ok((n > 0).then_some(()))
    })
    .await
    .unwrap();
    // Key a was not listed again for it.
    assert_eq!(listings(&pool, 0, "a").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_a_reload_on_and_off() {
    let a = scan::provider_secret("reload-a");
    let admin = format!("adm-{}", random_hex(32));
    scan::register(ADMIN_TOKEN_ENV, &admin);
    let script = json!({ "catalog": { "models": ["m-conf", "m-new", "gpt-4o-mini"] } });
    let yaml = |base: &str, discover: bool| {
        format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }}, adminToken: {{ env: {ADMIN_TOKEN_ENV} }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             autoPrice: true\n\
             providers:\n\
             \x20 - id: p1\n    kind: openai-compatible\n    baseUrl: {base}/v1\n{}\
             \x20   keys: [{{ alias: a, env: K_A }}]\n    models: [{{ id: m-conf }}]\n",
            if discover { "    discover: true\n" } else { "" }
        )
    };
    let (secret, token) = (a.clone(), admin.clone());
    let pool = Pool::start_scripted("discovery_reload", &[Some(script)], |m, _| {
        let mut setup = ai_router_e2e::PoolSetup::default();
        setup.env.push(("K_A".into(), secret.clone()));
        setup.name_secret(&secret, "a");
        setup.env.push((ADMIN_TOKEN_ENV.into(), token));
        setup.yaml = yaml(&m[0], false);
        Ok(setup)
    })
    .await
    .expect("fixture");
    let base = pool.mocks[0].url().to_owned();
    let write = |discover: bool| {
        let aside = pool
            .dir
            .write("pool.yaml.new", &yaml(&base, discover))
            .unwrap();
        std::fs::rename(aside, pool.cp.config_path()).unwrap();
    };

    // Without discovery nothing is listed and only the configured model exists.
    let r = pool.chat("m-new").await.unwrap();
    assert_eq!(r.status, 404, "{r}");
    assert_eq!(listings(&pool, 0, "a").await, 0);

    // A reload that turns it on lists the key and serves what it found.
    write(true);
    poll(
        "m-new after the reload",
        Duration::from_secs(20),
        || async {
            let r = pool.chat("m-new").await?;
            Ok((r.status == 200).then_some(()))
        },
    )
    .await
    .unwrap();
    let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
    let found = served(&catalog, "m-new", "p1").unwrap();
    assert_eq!(
        (found["source"].as_str(), aliases(found)),
        (Some("discovered"), vec!["a".to_owned()])
    );
    assert_eq!(listings(&pool, 0, "a").await, 1);
    // autoPrice prices what the table knows; the rest stays unpriced.
    let priced = served(&catalog, "gpt-4o-mini", "p1").unwrap();
    assert_eq!(priced["priced"], "table", "{catalog}");
    assert_eq!(priced["cost"]["input"], 0.15, "{catalog}");
    assert_eq!(found["priced"], "unpriced", "{catalog}");

    // And one that turns it off drops what was found.
    write(false);
    poll(
        "m-new gone after the reload",
        Duration::from_secs(20),
        || async {
            let r = pool.chat("m-new").await?;
            Ok((r.status == 404).then_some(()))
        },
    )
    .await
    .unwrap();
    let catalog = admin_api(&pool).get_json("/admin/catalog").await.unwrap();
    assert!(served(&catalog, "m-new", "p1").is_none(), "{catalog}");
    assert_eq!(catalog["discovery"], json!([]), "{catalog}");
    let r = pool.chat("m-conf").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
}

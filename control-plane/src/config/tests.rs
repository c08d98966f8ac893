//! Loading and resolving pool files: the defaults, the checks and their messages.

use std::path::Path;

use super::*;
use crate::config::secrets::{MapEnv, SecretSource};

fn resolve(text: &str, env: &MapEnv) -> Result<Config, String> {
    parse(text)
        .and_then(|f| f.resolve(env, Path::new("/etc/ai-router")))
        .map_err(|e| e.to_string())
}

fn err(text: &str, env: &MapEnv) -> String {
    match resolve(text, env) {
        Ok(_) => String::from("<no error>"),
        Err(e) => e,
    }
}

const POOL: &str = include_str!("../../../examples/pool.yaml");

#[test]
fn example_pool_with_openai_and_deepseek_keys() -> Result<(), String> {
    let env = MapEnv::new([
        ("OPENAI_API_KEY", "sk-o1"),
        ("OPENAI_API_KEY_3", "sk-o3"),
        ("DEEPSEEK_API_KEYS", "d1, d2"),
    ]);
    let config = resolve(POOL, &env)?;
    let ids: Vec<&str> = config.providers.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["openai", "deepseek"]);
    let openai = &config.providers[0];
    let aliases: Vec<&str> = openai.keys.iter().map(|k| k.alias.as_str()).collect();
    assert_eq!(aliases, ["openai-1", "openai-3"]);
    assert_eq!(openai.endpoint.scheme, "https");
    assert_eq!(openai.endpoint.authority, "api.openai.com");
    assert_eq!(openai.endpoint.base_path, "/v1");
    let deepseek = &config.providers[1];
    let aliases: Vec<&str> = deepseek.keys.iter().map(|k| k.alias.as_str()).collect();
    assert_eq!(aliases, ["deepseek-1", "deepseek-2"]);
    // The local quick start binds loopback; compose renders its own listener.
    assert_eq!(config.gateway.host, "127.0.0.1");
    assert_eq!(config.gateway.port, 8080);
    assert_eq!(config.control_plane.host, "control-plane");
    assert_eq!(config.control_plane.grpc_port, 8082);
    assert_eq!(config.max_attempts(), 4);
    let raised = POOL.replace("maxAttempts: 3", "maxAttempts: 6");
    assert_eq!(resolve(&raised, &env)?.max_attempts(), 6);
    assert!(config.warnings.iter().any(|w| w.contains("openrouter")));
    Ok(())
}

#[test]
fn profiles_are_cut_to_the_remaining_models() -> Result<(), String> {
    // Only deepseek: `fast` is gone, so lesson falls to its fallback `smart`.
    let env = MapEnv::new([("DEEPSEEK_API_KEY", "d1")]);
    let config = resolve(POOL, &env)?;
    let lesson = &config.profiles["lesson"];
    assert_eq!(lesson.model.as_deref(), Some("smart"));
    assert_eq!(lesson.fallbacks.as_deref(), Some(&[][..]));
    assert_eq!(config.profiles["grading"].model.as_deref(), Some("smart"));
    // Only openrouter: `smart` is gone; grading pins it, so grading is dropped.
    let env = MapEnv::new([("OPENROUTER_API_KEY", "o1")]);
    let config = resolve(POOL, &env)?;
    assert!(!config.profiles.contains_key("grading"));
    assert_eq!(config.profiles["lesson"].model.as_deref(), Some("fast"));
    assert!(config
        .warnings
        .iter()
        .any(|w| w.contains("profile grading")));
    assert_eq!(
        config.defaults.as_ref().and_then(|d| d.fallbacks.clone()),
        Some(vec![])
    );
    Ok(())
}

#[test]
fn no_keys_leaves_no_providers() -> Result<(), String> {
    let config = resolve(POOL, &MapEnv::default())?;
    assert!(config.providers.is_empty());
    assert!(config.profiles.is_empty());
    Ok(())
}

#[test]
fn keys_from_env_numbering_files_and_lists() {
    let env = MapEnv::new([
        ("P_API_KEY", "a"),
        ("P_API_KEY_2_FILE", "/run/secrets/p2"),
        ("P_API_KEY_10", "c"),
        ("P_API_KEY_X", "ignored"),
        ("P_API_KEY_0", "ignored"),
        ("P_API_KEY_4", ""),
        ("P_API_KEYS", "l1,l2 l3"),
        ("PX_API_KEY", "other prefix"),
    ]);
    let keys = keys_from_env("P", "groq", &env);
    let aliases: Vec<&str> = keys.iter().map(|k| k.alias.as_str()).collect();
    assert_eq!(
        aliases,
        ["groq-1", "groq-2", "groq-10", "groq-11", "groq-12", "groq-13"]
    );
    assert_eq!(
        keys[1].source,
        SecretSource::EnvOrFileEnv {
            var: "P_API_KEY_2".into(),
            file_var: "P_API_KEY_2_FILE".into()
        }
    );
    assert_eq!(
        keys[5].source,
        SecretSource::EnvListItem {
            var: "P_API_KEYS".into(),
            index: 2
        }
    );
    assert_eq!(
        keys[3].source.resolve(&env).map(|s| s.expose().to_owned()),
        Some("l1".into())
    );
}

#[test]
fn openai_compatible_needs_a_base_url_and_uses_its_id_for_aliases() -> Result<(), String> {
    let text = "providers:\n  - { id: local, keysFromEnv: LOCAL, models: [{ id: llama }] }\n";
    assert_eq!(
        err(text, &MapEnv::new([("LOCAL_API_KEY", "k")])),
        "providers[0].baseUrl: required for kind openai-compatible"
    );
    let env = MapEnv::new([
        ("LOCAL_API_KEY", "k"),
        ("LOCAL_BASE_URL", "http://127.0.0.1:11434/v1/"),
    ]);
    let config = resolve(text, &env)?;
    let p = &config.providers[0];
    assert_eq!(p.kind, ProviderKind::OpenaiCompatible);
    assert_eq!(p.keys[0].alias, "local-1");
    assert_eq!(p.endpoint.scheme, "http");
    assert_eq!(p.endpoint.authority, "127.0.0.1:11434");
    assert_eq!(p.endpoint.base_path, "/v1");
    assert_eq!(p.kind.auth_header(), "authorization");
    Ok(())
}

#[test]
fn literal_secrets_are_refused_naming_the_field() {
    let env = MapEnv::default();
    let text = "providers:\n  - id: a\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m }]\n  - id: b\n    keys: [{ alias: y, apiKey: sk-live-123 }]\n    models: [{ id: m }]\n";
    let message = err(text, &env);
    assert_eq!(
        message,
        "providers[1].keys[0].apiKey: literal secrets are not allowed; use { env: NAME } or { file: path }"
    );
    assert!(!message.contains("sk-live-123"));
    let text = "providers:\n  - id: a\n    headers: { Authorization: Bearer sk-1 }\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m }]\n";
    let message = err(text, &env);
    assert!(
        message.starts_with(
            "providers[0].headers.Authorization: a provider header cannot carry a secret"
        ),
        "{message}"
    );
    assert!(!message.contains("sk-1"));
    for header in ["x-api-key", "api-key", "proxy-authorization"] {
        let text = format!("providers:\n  - id: a\n    headers: {{ {header}: s }}\n    keys: [{{ alias: x, env: A }}]\n    models: [{{ id: m }}]\n");
        assert!(err(&text, &env).starts_with(&format!("providers[0].headers.{header}:")));
    }
    let text = "gateway: { adminToken: hunter2 }\n";
    assert_eq!(
        err(text, &env),
        "gateway.adminToken: literal secrets are not allowed; use { env: NAME } or { file: path }"
    );
    let text = "controlPlane: { syncToken: { value: abc } }\n";
    assert!(err(text, &env).starts_with("controlPlane.syncToken.value: literal secrets"));
    let text = "mountedKeys: [{ label: app, secret: sk-starci-app-xxx, profiles: ['*'] }]\n";
    assert!(err(text, &env).starts_with("mountedKeys[0].secret: literal secrets"));
    for field in ["key", "token", "password", "value", "secret"] {
        let text = format!("providers:\n  - id: a\n    keys: [{{ alias: x, {field}: s }}]\n    models: [{{ id: m }}]\n");
        assert!(
            err(&text, &env).starts_with(&format!("providers[0].keys[0].{field}: literal secrets"))
        );
    }
}

#[test]
fn unknown_fields_are_refused_naming_the_path() {
    let env = MapEnv::default();
    let text = "providers:\n  - id: a\n    keys: [{ alias: x, env: A }]\n    models: [{ id: m, colour: red }]\n";
    let message = err(text, &env);
    assert!(
        message.starts_with("providers[0].models[0].colour: unknown field"),
        "{message}"
    );
    let message = err("gateway: { prot: 1 }\n", &env);
    assert!(
        message.starts_with("gateway.prot: unknown field"),
        "{message}"
    );
    let message = err("colour: red\n", &env);
    assert!(message.starts_with("colour: unknown field"), "{message}");
    let message = err(
        "profiles:\n  work: { candidates: [[{ model: m, colour: x }]] }\n",
        &env,
    );
    assert!(message.contains("colour: unknown field"), "{message}");
    let message = err("resilience: { keyBreaker: { failureThreshold: 1, cooldownMs: 1, maxCooldownMs: 1, extra: 1 } }\n", &env);
    assert!(
        message.starts_with("resilience.keyBreaker.extra: unknown field"),
        "{message}"
    );
}

#[test]
fn a_budget_needs_a_bound_on_the_output() {
    let env = MapEnv::new([("A_API_KEY", "k")]);
    let pool = |window: &str| {
        format!("providers:\n  - id: a\n    keysFromEnv: A\n    baseUrl: http://h/v1\n    models: [{{ id: m, cost: {{ input: 1, output: 1 }}{window} }}]\nprofiles:\n  cheap: {{ model: m, budget: {{ maxCost: 0.01 }} }}\n")
    };
    let message = err(&pool(""), &env);
    assert!(
        message.starts_with("profiles.cheap.budget.maxCost: model `m` of provider `a` has a cost but no contextWindow"),
        "{message}"
    );
    assert!(resolve(&pool(", contextWindow: 8000"), &env).is_ok());
}

#[test]
fn settings_this_version_cannot_honour_are_refused() {
    let env = MapEnv::default();
    let message = err(
        "storeNamespace: team-a
",
        &env,
    );
    assert!(
        message.starts_with("storeNamespace: it names the keys of a store shared"),
        "{message}"
    );
}

#[test]
fn shared_stores_take_a_url_and_the_namespace() {
    let env = MapEnv::new([("A_API_KEY", "k")]);
    let pool = "providers:\n  - { kind: openai, keysFromEnv: A, models: [{ id: m }] }\n";
    let ok = |extra: &str| {
        parse(&format!("{extra}{pool}"))
            .and_then(|f| f.resolve(&env, Path::new("/etc/ai-router")))
            .map_err(|e| e.to_string())
    };
    let config = ok("stateStore: { type: redis, url: { env: REDIS_URL }, caFile: /etc/redis-ca.pem }\nstoreNamespace: team-a\ngateway: { keyStore: { type: postgres, url: { file: pg.url }, caFile: pg-ca.pem } }\n");
    let Ok(config) = config else {
        panic!("{config:?}");
    };
    assert_eq!(
        config.state_store,
        StoreSpec::Redis {
            url: SecretSource::Env("REDIS_URL".into()),
            namespace: "team-a".into(),
            ca_file: Some("/etc/redis-ca.pem".into()),
        }
    );
    assert_eq!(
        config.gateway.key_store,
        StoreSpec::Postgres {
            url: SecretSource::File("/etc/ai-router/pg.url".into()),
            ca_file: Some("/etc/ai-router/pg-ca.pem".into()),
        }
    );
    // How long `serve` waits for them at start: two minutes unless set.
    assert_eq!(config.store_start_wait, std::time::Duration::from_secs(120));
    let waits = ok("storeStartWaitMs: 30000\nstateStore: { type: redis, url: { env: R } }\n");
    assert!(
        matches!(&waits, Ok(c) if c.store_start_wait == std::time::Duration::from_secs(30)),
        "{waits:?}"
    );
    let default_ns = ok("stateStore: { type: redis, url: { env: R } }\n");
    assert!(
        matches!(&default_ns, Ok(c) if c.state_store == StoreSpec::Redis { url: SecretSource::Env("R".into()), namespace: "ai-router".into(), ca_file: None }),
        "{default_ns:?}"
    );
    for (extra, says) in [
        (
            "stateStore: { type: redis }\n",
            "stateStore.url: a redis store needs",
        ),
        (
            "stateStore: { type: redis, path: x, url: { env: R } }\n",
            "stateStore.path: a redis store has a url",
        ),
        (
            "stateStore: { type: sqlite, path: x, url: { env: R } }\n",
            "stateStore.url: a sqlite store has no url",
        ),
        (
            "stateStore: { type: sqlite, path: x, caFile: ca.pem }\n",
            "stateStore.caFile: a sqlite store has no TLS",
        ),
        (
            "stateStore: { type: postgres, url: { env: R } }\n",
            "stateStore.type: postgres holds keys",
        ),
        (
            "gateway: { keyStore: { type: redis, url: { env: R } } }\n",
            "gateway.keyStore.type: redis holds",
        ),
        (
            "stateStore: { type: redis, url: { env: R } }\nstoreNamespace: 'a b'\n",
            "storeNamespace: a non-empty name",
        ),
    ] {
        let message = ok(extra).err().unwrap_or_default();
        assert!(message.starts_with(says), "{extra}: {message}");
    }
}

#[test]
fn kinds_refuse_embeddings_they_do_not_serve() {
    let env = MapEnv::new([("A_API_KEY", "k")]);
    for kind in ["anthropic", "deepseek", "groq"] {
        let text = format!("providers:\n  - {{ kind: {kind}, keysFromEnv: A, models: [{{ id: e, capabilities: [embeddings] }}] }}\n");
        assert_eq!(
            err(&text, &env),
            format!("providers[0].models[0].capabilities: {kind} has no embeddings API")
        );
    }
    let text = "providers:\n  - { kind: openai, keysFromEnv: A, models: [{ id: e, capabilities: [embeddings], dimensions: 1536 }] }\n";
    assert!(resolve(text, &env).is_ok());
}

#[test]
fn kind_defaults() -> Result<(), String> {
    let env = MapEnv::new([("A_API_KEY", "k")]);
    let cases = [
        ("anthropic", "api.anthropic.com", "/v1", "x-api-key"),
        ("openrouter", "openrouter.ai", "/api/v1", "authorization"),
        (
            "qwen",
            "dashscope-intl.aliyuncs.com",
            "/compatible-mode/v1",
            "authorization",
        ),
        (
            "gemini",
            "generativelanguage.googleapis.com",
            "/v1beta/openai",
            "authorization",
        ),
        ("groq", "api.groq.com", "/openai/v1", "authorization"),
        ("deepseek", "api.deepseek.com", "/v1", "authorization"),
        ("mistral", "api.mistral.ai", "/v1", "authorization"),
        ("cerebras", "api.cerebras.ai", "/v1", "authorization"),
        ("kimi", "api.moonshot.ai", "/v1", "authorization"),
        ("github", "models.github.ai", "/inference", "authorization"),
        ("nvidia", "integrate.api.nvidia.com", "/v1", "authorization"),
        ("sambanova", "api.sambanova.ai", "/v1", "authorization"),
        (
            "cohere",
            "api.cohere.ai",
            "/compatibility/v1",
            "authorization",
        ),
        ("siliconflow", "api.siliconflow.com", "/v1", "authorization"),
        ("zai", "api.z.ai", "/api/paas/v4", "authorization"),
    ];
    for (kind, authority, base_path, auth) in cases {
        let text =
            format!("providers:\n  - {{ kind: {kind}, keysFromEnv: A, models: [{{ id: m }}] }}\n");
        let config = resolve(&text, &env)?;
        let p = &config.providers[0];
        assert_eq!(p.id, kind);
        assert_eq!(p.endpoint.authority, authority);
        assert_eq!(p.endpoint.base_path, base_path);
        assert_eq!(p.kind.auth_header(), auth);
        assert_eq!(p.keys[0].alias, format!("{kind}-1"));
    }
    let message = err(
        "providers:\n  - { kind: bedrock, keysFromEnv: A, models: [{ id: m }] }\n",
        &env,
    );
    assert!(
        message.starts_with("providers[0].kind: unknown variant `bedrock`"),
        "{message}"
    );
    Ok(())
}

/// The README's table of kinds is the enum's: one row per kind, in any order, with the kind's
/// base URL, `keysFromEnv` prefix and embeddings support.
#[test]
fn the_readme_lists_every_provider_kind_as_the_enum_defines_it() {
    let readme = include_str!("../../../README.md");
    let rows: Vec<Vec<&str>> = readme
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("| `"))
        .map(|line| line.trim_matches('|').split(" | ").map(str::trim).collect())
        .filter(|cells: &Vec<&str>| cells.len() == 5)
        .collect();
    for kind in ProviderKind::ALL {
        let name = format!("`{kind}`");
        let row = rows
            .iter()
            .find(|cells| cells[0].split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("README: no row for {name}"));
        let url = kind
            .default_base_url()
            .unwrap_or(crate::config::file::CLOUDFLARE_BASE_URL);
        if kind != ProviderKind::OpenaiCompatible {
            assert!(
                row[1].starts_with(&format!("`{url}`")),
                "{name}: {}",
                row[1]
            );
        }
        let prefix = kind.env_prefix().unwrap_or("any");
        assert!(
            row[2].starts_with(&format!("`{prefix}`")) || row[2] == prefix,
            "{name}: {}",
            row[2]
        );
        let embeddings = if kind.supports_embeddings() {
            "yes"
        } else {
            "no"
        };
        assert_eq!(row[3], embeddings, "{name}");
    }
    let kinds = rows
        .iter()
        .filter(|cells| cells[1].contains("https://") || cells[1].starts_with("none"))
        .count();
    assert_eq!(
        kinds,
        ProviderKind::ALL.len(),
        "README: a row for a kind the enum lacks"
    );
}

#[test]
fn cloudflare_builds_its_base_url_from_the_account() -> Result<(), String> {
    let env = MapEnv::new([
        ("CLOUDFLARE_API_KEY", "cf-1"),
        ("CLOUDFLARE_ACCOUNT_ID", "f00d42"),
    ]);
    let config = resolve(
        "providers:\n  - { kind: cloudflare, accountId: abc123, keysFromEnv: CLOUDFLARE, models: [{ id: m }] }\n",
        &env,
    )?;
    let p = &config.providers[0];
    assert_eq!(p.endpoint.authority, "api.cloudflare.com");
    assert_eq!(p.endpoint.base_path, "/client/v4/accounts/abc123/ai/v1");
    // The account from <PREFIX>_ACCOUNT_ID.
    let config = resolve(
        "providers:\n  - { kind: cloudflare, keysFromEnv: CLOUDFLARE, models: [{ id: m }] }\n",
        &env,
    )?;
    assert_eq!(
        config.providers[0].endpoint.base_path,
        "/client/v4/accounts/f00d42/ai/v1"
    );
    let none = MapEnv::new([("CLOUDFLARE_API_KEY", "cf-1")]);
    for (provider, env, says) in [
        ("kind: cloudflare", &none, "providers[0].accountId"),
        ("kind: openai, accountId: abc", &env, "only kind cloudflare"),
        (
            "kind: cloudflare, accountId: 'a/b'",
            &env,
            "not a Cloudflare account id",
        ),
    ] {
        let text = format!(
            "providers:\n  - {{ {provider}, keysFromEnv: CLOUDFLARE, models: [{{ id: m }}] }}\n"
        );
        let message = err(&text, env);
        assert!(message.contains(says), "{provider}: {message}");
    }
    Ok(())
}

#[test]
fn github_reads_github_token_and_qwen_also_qwen_api_key() -> Result<(), String> {
    let env = MapEnv::new([
        ("GITHUB_TOKEN", "ghp-1"),
        ("DASHSCOPE_API_KEY", "sk-d"),
        ("QWEN_API_KEY", "sk-q"),
    ]);
    let config = resolve(
        "providers:\n  - { kind: github, keysFromEnv: GITHUB_TOKEN, models: [{ id: m }] }\n  - { kind: qwen, keysFromEnv: DASHSCOPE, models: [{ id: m }] }\n",
        &env,
    )?;
    let aliases = |i: usize| -> Vec<String> {
        config.providers[i]
            .keys
            .iter()
            .map(|k| k.alias.clone())
            .collect()
    };
    assert_eq!(aliases(0), ["github-1"]);
    assert_eq!(aliases(1), ["qwen-1", "qwen-2"]);
    Ok(())
}

#[test]
fn references_between_sections_are_checked() {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m, aliases: [fast] }] }\n";
    let cases = [
        ("profiles:\n  x: { model: nope }\n", "profiles.x.model: unknown model `nope` (no provider serves it)"),
        ("profiles:\n  x: { fallbacks: [fast, nope] }\n", "profiles.x.fallbacks[1]: unknown model `nope` (no provider serves it)"),
        ("defaults: { providers: [q] }\n", "defaults.providers[0]: unknown provider `q`"),
        ("profiles:\n  x: { candidates: [{ model: m, provider: q }] }\n", "profiles.x.candidates[0].provider: unknown provider `q`"),
        ("profiles:\n  x: { candidates: [[{ model: m }, { model: zz }]] }\n", "profiles.x.candidates[0][1].model: unknown model `zz` (no provider serves it)"),
        ("profiles:\n  x: { model: m, candidates: [{ model: m }] }\n", "profiles.x.candidates: takes the place of model and fallbacks; give one or the other"),
        ("profiles:\n  x: { maxAttempts: 0 }\n", "profiles.x.maxAttempts: must be at least 1"),
        ("mountedKeys: [{ label: app, env: K, profiles: [nope] }]\n", "mountedKeys[0].profiles[0]: unknown profile `nope`"),
        ("mountedKeys: [{ label: app, env: K, models: [fast, nope] }]\n", "mountedKeys[0].models[1]: unknown model `nope` (no provider serves it by id or alias; \"*\" for every model)"),
        ("mountedKeys: [{ label: App, env: K, profiles: ['*'] }]\n", "mountedKeys[0].label: `App` must be lowercase letters, digits and _"),
        ("mountedKeys: [{ label: app, profiles: ['*'] }]\n", "mountedKeys[0]: a secret reference needs { env: NAME } or { file: path }"),
        ("gateway: { port: 1, appPort: 3001 }\n", "gateway.appPort: cannot be combined with gateway.port"),
    ];
    for (extra, expected) in cases {
        assert_eq!(err(&format!("{base}{extra}"), &env), expected, "{extra}");
    }
    let dup = "providers:\n  - { id: p, baseUrl: 'http://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n  - { id: p, baseUrl: 'http://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    assert_eq!(err(dup, &env), "providers[1].id: `p` is given twice");
    let bad_url = "providers:\n  - { id: p, baseUrl: 'ftp://h', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    assert!(err(bad_url, &env).starts_with("providers[0].baseUrl: "));
}

#[test]
fn listener_limits_default_once_and_are_checked() -> Result<(), String> {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    let config = resolve(base, &env)?;
    assert_eq!(config.gateway.limits, ListenerLimits::default());
    assert_eq!(config.gateway.limits.request_headers_timeout_ms, 10_000);
    let set = format!("{base}gateway: {{ requestHeadersTimeoutMs: 1000, requestTimeoutMs: 2000, connectionIdleTimeoutMs: 3000, maxConcurrentRequests: 64 }}\n");
    assert_eq!(
        resolve(&set, &env)?.gateway.limits,
        ListenerLimits {
            request_headers_timeout_ms: 1000,
            request_timeout_ms: 2000,
            connection_idle_timeout_ms: 3000,
            max_concurrent_requests: 64,
        }
    );
    let cases = [
        ("gateway: { requestHeadersTimeoutMs: 0 }\n", "gateway.requestHeadersTimeoutMs: must be at least 1"),
        ("gateway: { requestTimeoutMs: 0 }\n", "gateway.requestTimeoutMs: must be at least 1"),
        ("gateway: { connectionIdleTimeoutMs: 0 }\n", "gateway.connectionIdleTimeoutMs: must be at least 1"),
        ("gateway: { maxConcurrentRequests: 0 }\n", "gateway.maxConcurrentRequests: must be at least 1"),
        ("gateway: { requestHeadersTimeoutMs: 5000, requestTimeoutMs: 4000 }\n", "gateway.requestTimeoutMs: 4000 is shorter than gateway.requestHeadersTimeoutMs (5000); the request timeout covers the headers too"),
    ];
    for (extra, expected) in cases {
        assert_eq!(err(&format!("{base}{extra}"), &env), expected, "{extra}");
    }
    Ok(())
}

#[test]
fn partial_resilience_objects_take_the_defaults_per_field() -> Result<(), String> {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    let defaults = ResilienceConfig::default();
    assert_eq!(resolve(base, &env)?.resilience, defaults);
    let partial = format!(
        "{base}resilience:\n  keyBreaker: {{ failureThreshold: 5 }}\n  providerBreaker: {{ cooldownMs: 1000 }}\n  backoff: {{ maxMs: 800 }}\n  rateLimitCooldownMs: 7\n"
    );
    let r = resolve(&partial, &env)?.resilience;
    assert_eq!(
        r.key_breaker,
        BreakerConfig {
            failure_threshold: 5,
            cooldown_ms: 15_000,
            max_cooldown_ms: 300_000,
        }
    );
    assert_eq!(
        r.provider_breaker,
        BreakerConfig {
            failure_threshold: 8,
            cooldown_ms: 1000,
            max_cooldown_ms: 300_000,
        }
    );
    assert_eq!(
        r.backoff,
        BackoffConfig {
            base_ms: 100,
            factor: 2.0,
            max_ms: 800,
        }
    );
    assert_eq!(r.rate_limit_cooldown_ms, 7);
    assert_eq!(r.quota_blacklist_ms, defaults.quota_blacklist_ms);
    assert_eq!(r.auth_disable_ms, None);
    // Checks still run on the merged values.
    let bad = format!("{base}resilience: {{ keyBreaker: {{ maxCooldownMs: 10 }} }}\n");
    assert_eq!(
        err(&bad, &env),
        "resilience.keyBreaker.maxCooldownMs: must be at least cooldownMs"
    );
    Ok(())
}

#[test]
fn a_window_of_zero_is_refused_with_its_field() {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    for (field, yaml, want) in [
        (
            "rateLimitCooldownMs",
            "rateLimitCooldownMs: 0",
            "resilience.rateLimitCooldownMs: must be at least 1 (milliseconds)",
        ),
        (
            "quotaBlacklistMs",
            "quotaBlacklistMs: 0",
            "resilience.quotaBlacklistMs: must be at least 1 (milliseconds)",
        ),
        (
            "authDisableMs",
            "authDisableMs: 0",
            "resilience.authDisableMs: must be at least 1 (milliseconds) (leave it out: out until the secret changes)",
        ),
        (
            "backoff.baseMs",
            "backoff: { baseMs: 0 }",
            "resilience.backoff.baseMs: must be at least 1 (milliseconds)",
        ),
        (
            "backoff.maxMs",
            "backoff: { baseMs: 0, maxMs: 0 }",
            "resilience.backoff.baseMs: must be at least 1 (milliseconds)",
        ),
        (
            "backoff.maxMs",
            "backoff: { maxMs: 0 }",
            "resilience.backoff.maxMs: must be at least 1 (milliseconds)",
        ),
        (
            "backoff.maxMs",
            "backoff: { baseMs: 500, maxMs: 100 }",
            "resilience.backoff.maxMs: must be at least baseMs",
        ),
        (
            "backoff.maxMs",
            "backoff: { baseMs: 6000 }",
            "resilience.backoff.maxMs: must be at least baseMs",
        ),
    ] {
        let text = format!("{base}resilience: {{ {yaml} }}\n");
        assert_eq!(err(&text, &env), want, "{field}");
    }
    // 1 ms is a window; an equal base and cap is a constant backoff.
    let ok = format!(
        "{base}resilience: {{ rateLimitCooldownMs: 1, quotaBlacklistMs: 1, authDisableMs: 1, backoff: {{ baseMs: 10, factor: 1, maxMs: 10 }} }}\n"
    );
    assert!(resolve(&ok, &env).is_ok());
}

#[test]
fn a_provider_on_the_gateways_own_listener_is_refused() -> Result<(), String> {
    let openai =
        "providers:\n  - { id: openai, kind: openai, keysFromEnv: OPENAI, models: [{ id: m }] }\n";
    for url in [
        "http://127.0.0.1:8080/v1",
        "http://localhost:8080/v1",
        "http://0.0.0.0:8080",
        "http://[::1]:8080/v1",
    ] {
        let env = MapEnv::new([("OPENAI_API_KEY", "sk-real"), ("OPENAI_BASE_URL", url)]);
        let message = err(openai, &env);
        assert!(
            message.starts_with("provider openai: its base URL")
                && message.contains("(from OPENAI_BASE_URL)")
                && message.contains("gateway's own listener (port 8080)"),
            "{url}: {message}"
        );
        assert!(!message.contains("sk-real"), "{message}");
    }
    // From the file, on a derived port.
    let file = "gateway: { appPort: 3001 }\nproviders:\n  - { id: loop, baseUrl: 'http://127.0.0.1:3002/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    let env = MapEnv::new([("A", "k")]);
    let message = err(file, &env);
    assert!(
        message.starts_with("provider loop: ") && message.contains("(from providers[0].baseUrl)"),
        "{message}"
    );
    // Another port, another host, or a provider without a key (never called) is fine.
    for (url, key) in [
        ("http://127.0.0.1:8081/v1", "sk-real"),
        ("http://10.1.2.3:8080/v1", "sk-real"),
        ("http://127.0.0.1:8080/v1", ""),
    ] {
        let env = MapEnv::new([("OPENAI_API_KEY", key), ("OPENAI_BASE_URL", url)]);
        resolve(openai, &env)?;
    }
    Ok(())
}

#[test]
fn a_port_offset_needs_an_app_port() -> Result<(), String> {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: k, env: A }], models: [{ id: m }] }\n";
    for gateway in [
        "gateway: { portOffset: 5 }\n",
        "gateway: { port: 9000, portOffset: 5 }\n",
    ] {
        let message = err(&format!("{base}{gateway}"), &env);
        assert!(
            message.starts_with("gateway.portOffset: only applies with gateway.appPort"),
            "{gateway}: {message}"
        );
    }
    let derived = resolve(
        &format!("{base}gateway: {{ appPort: 3001, portOffset: 5 }}\n"),
        &env,
    )?;
    assert_eq!(derived.gateway.port, 3006);
    Ok(())
}

#[test]
fn pinned_profiles_need_one_identity() {
    let env = MapEnv::new([("A", "k")]);
    let base = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }, { id: te3l, capabilities: [embeddings], dimensions: 3072 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: A }], models: [{ id: openai/te3, identity: te3, capabilities: [embeddings], dimensions: 1536 }] }\n";
    let ok = format!("{base}profiles:\n  embed: {{ pinned: true, candidates: [[{{ provider: o, model: te3 }}, {{ provider: r, model: openai/te3 }}]] }}\n");
    assert!(resolve(&ok, &env).is_ok(), "{}", err(&ok, &env));
    let bad = format!("{base}profiles:\n  embed: {{ pinned: true, candidates: [{{ model: te3 }}, {{ model: te3l }}] }}\n");
    assert_eq!(
        err(&bad, &env),
        "profiles.embed.pinned: the candidates are not one model identity and dimensions: \
         te3 (1536 dimensions), te3l (3072 dimensions)"
    );
    // One identity, two vector lengths.
    let dims = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: A }], models: [{ id: openai/te3, identity: te3, capabilities: [embeddings], dimensions: 512 }] }\nprofiles:\n  vec: { pinned: true, candidates: [[{ provider: o, model: te3 }, { provider: r, model: openai/te3 }]] }\n";
    assert_eq!(
        err(dims, &env),
        "profiles.vec.pinned: the candidates are not one model identity and dimensions: \
         te3 (512 dimensions), te3 (1536 dimensions)"
    );
    // Two chat models: the identity defaults to the id.
    let chat = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: a }, { id: b }] }\nprofiles:\n  chat: { pinned: true, candidates: [{ model: a }, { model: b }] }\n";
    assert!(err(chat, &env).starts_with("profiles.chat.pinned: the candidates are not one"));
    // Pinned needs candidates, and only a profile can be pinned.
    let no_candidates = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: a }] }\nprofiles:\n  p: { pinned: true, model: a }\n";
    assert_eq!(
        err(no_candidates, &env),
        "profiles.p.pinned: a pinned profile needs candidates"
    );
    // Refused even when a candidate's provider has no key now (checked against the file).
    let env_o_only = MapEnv::new([("A", "k")]);
    let absent = "providers:\n  - { id: o, kind: openai, keys: [{ alias: k, env: A }], models: [{ id: te3, capabilities: [embeddings], dimensions: 1536 }] }\n  - { id: r, kind: openrouter, keys: [{ alias: k, env: NOPE }], models: [{ id: openai/te3, capabilities: [embeddings], dimensions: 1536 }] }\nprofiles:\n  embed: { pinned: true, candidates: [[{ provider: o, model: te3 }, { provider: r, model: openai/te3 }]] }\n";
    assert!(err(absent, &env_o_only).starts_with("profiles.embed.pinned: "));
}

#[test]
fn json_by_extension_and_relative_paths() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ai-router-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("k"), "sk-file\n")?;
    let path = dir.join("pool.json");
    std::fs::write(
        &path,
        r#"{"gateway":{"appPort":3001},"stateStore":{"type":"sqlite","path":"state.sqlite"},"providers":[{"id":"p","baseUrl":"http://h:1/v1","keys":[{"alias":"k","file":"k"}],"models":[{"id":"m"}]}]}"#,
    )?;
    let config = load(&path, &MapEnv::default())?;
    assert_eq!(config.gateway.port, 3002);
    assert_eq!(
        config.state_store,
        StoreSpec::Sqlite(dir.join("state.sqlite"))
    );
    assert_eq!(
        config.providers[0].keys[0].source,
        SecretSource::File(dir.join("k"))
    );
    std::fs::write(&path, r#"{"providers":[{"id":"p","colour":1}]}"#)?;
    let message = load(&path, &MapEnv::default())
        .map(|_| ())
        .map_err(|e| e.to_string());
    assert!(
        matches!(&message, Err(m) if m.contains("providers[0].colour: unknown field")),
        "{message:?}"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn tiers_take_one_candidate_or_a_list() -> Result<(), String> {
    let f = parse("profiles:\n  w: { candidates: [[{ model: a, weight: 3 }, { model: b }], { model: c, provider: p }] }\n")
        .map_err(|e| e.to_string())?;
    let tiers = f.profiles["w"].candidates.clone().unwrap_or_default();
    assert_eq!(tiers.len(), 2);
    assert_eq!(tiers[0].0.len(), 2);
    assert_eq!(tiers[0].0[0].weight, Some(3.0));
    assert_eq!(tiers[1].0[0].provider.as_deref(), Some("p"));
    Ok(())
}

/// A file that says nothing but one provider resolves to the spec's defaults, as the contract
/// defines them (the filter reads the same table).
#[test]
fn what_the_file_leaves_out_is_the_contracts_default() -> Result<(), String> {
    use ai_router_contract::defaults;
    let env = MapEnv::new([("A_API_KEY", "k")]);
    let config = resolve(
        "providers:\n  - { kind: openai, keysFromEnv: A, models: [{ id: m }] }\nmountedKeys:\n  - { label: app, env: APP, models: [m] }\n",
        &env,
    )?;
    let g = &config.gateway;
    assert_eq!(
        (g.host.as_str(), g.port),
        (defaults::HOST, defaults::GATEWAY_PORT)
    );
    assert_eq!(g.max_body_bytes, defaults::MAX_BODY_BYTES);
    assert_eq!(
        g.forward_rate_limit_headers,
        defaults::FORWARD_RATE_LIMIT_HEADERS
    );
    assert_eq!(
        g.limits,
        ListenerLimits {
            request_headers_timeout_ms: defaults::REQUEST_HEADERS_TIMEOUT_MS,
            request_timeout_ms: defaults::REQUEST_TIMEOUT_MS,
            connection_idle_timeout_ms: defaults::CONNECTION_IDLE_TIMEOUT_MS,
            max_concurrent_requests: defaults::MAX_CONCURRENT_REQUESTS,
        }
    );
    let c = &config.control_plane;
    assert_eq!(
        (c.host.as_str(), c.http_port, c.grpc_port),
        (
            defaults::HOST,
            defaults::CONTROL_PLANE_HTTP_PORT,
            defaults::CONTROL_PLANE_GRPC_PORT
        )
    );
    let p = &config.providers[0];
    assert_eq!(p.weight, defaults::WEIGHT);
    assert_eq!(p.keys[0].weight, defaults::WEIGHT);
    assert_eq!(p.default_max_tokens, defaults::DEFAULT_MAX_TOKENS);
    let r = &config.resilience;
    assert_eq!(
        (
            r.rate_limit_cooldown_ms,
            r.quota_blacklist_ms,
            r.auth_disable_ms
        ),
        (
            defaults::RATE_LIMIT_COOLDOWN_MS,
            defaults::QUOTA_BLACKLIST_MS,
            None
        )
    );
    assert_eq!(
        r.key_breaker,
        BreakerConfig {
            failure_threshold: defaults::KEY_BREAKER_FAILURE_THRESHOLD,
            cooldown_ms: defaults::KEY_BREAKER_COOLDOWN_MS,
            max_cooldown_ms: defaults::KEY_BREAKER_MAX_COOLDOWN_MS,
        }
    );
    assert_eq!(
        r.provider_breaker,
        BreakerConfig {
            failure_threshold: defaults::PROVIDER_BREAKER_FAILURE_THRESHOLD,
            cooldown_ms: defaults::PROVIDER_BREAKER_COOLDOWN_MS,
            max_cooldown_ms: defaults::PROVIDER_BREAKER_MAX_COOLDOWN_MS,
        }
    );
    assert_eq!(
        r.backoff,
        BackoffConfig {
            base_ms: defaults::BACKOFF_BASE_MS,
            factor: defaults::BACKOFF_FACTOR,
            max_ms: defaults::BACKOFF_MAX_MS,
        }
    );
    let s = &config.selection;
    assert_eq!(
        (
            s.latency_tolerance,
            s.latency_slack_ms,
            s.ewma_alpha,
            s.low_headroom
        ),
        (
            defaults::LATENCY_TOLERANCE,
            defaults::LATENCY_SLACK_MS,
            defaults::EWMA_ALPHA,
            defaults::LOW_HEADROOM
        )
    );
    let app = &config.mounted_keys[0];
    assert_eq!(
        (app.allow_fallback, app.enabled),
        (defaults::ALLOW_FALLBACK, defaults::KEY_ENABLED)
    );
    assert_eq!(config.max_attempts(), defaults::MAX_ATTEMPTS);
    Ok(())
}

// Cost-aware routing and rules: `routes`, `autoPrice` with `discount`, `autoSort`,
// `resetIntervalMs`, `when`.

fn resolve_cost(text: &str) -> Result<Config, String> {
    resolve(text, &MapEnv::new([("K1", "sk-1"), ("K2", "sk-2")]))
}

const COST_POOL: &str = "providers:
  - { id: p1, baseUrl: http://127.0.0.1:9/v1, keys: [{ alias: a, env: K1 }], discount: 0.5,
  models: [{ id: gpt-4o-mini }, { id: house }, { id: gpt-4o, cost: { input: 1, output: 2 } }, { id: o3, discount: 0.25 }] }
  - { id: p2, baseUrl: http://127.0.0.1:9/v1, keys: [{ alias: b, env: MISSING }], models: [{ id: gone }] }
profiles:
  cheap: { model: gpt-4o-mini, autoSort: true, resetIntervalMs: 5000 }
  lost: { model: gone }
";

#[test]
fn rules_are_checked_and_those_of_a_lost_profile_dropped() {
    let ok = format!(
        "{COST_POOL}routes:\n  - {{ name: a, priority: 3, match: {{ taskType: x }}, target: {{ profile: cheap }} }}\n  - {{ name: b, match: {{}}, target: {{ profile: lost }} }}\n"
    );
    let config = resolve_cost(&ok).unwrap();
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a"]);
    assert!(
        config.warnings.iter().any(|w| w.contains("route b")),
        "{:?}",
        config.warnings
    );
    assert_eq!(config.profiles["cheap"].auto_sort, Some(true));
    assert_eq!(config.profiles["cheap"].reset_interval_ms, Some(5000));

    let bad = |routes: &str| resolve_cost(&format!("{COST_POOL}routes:\n{routes}")).unwrap_err();
    assert!(
        bad("  - { name: a, target: { profile: nope } }\n").contains("routes[0].target.profile")
    );
    assert!(bad("  - { name: '', target: { profile: cheap } }\n").contains("routes[0].name"));
    assert!(bad("  - { name: a, target: { profile: cheap } }\n  - { name: a, target: { profile: cheap } }\n")
        .contains("routes[1].name"));
    assert!(
        bad("  - { name: a, match: { feature: ' ' }, target: { profile: cheap } }\n")
            .contains("routes[0].match.feature")
    );
    assert!(
        bad("  - { name: a, match: { colour: red }, target: { profile: cheap } }\n")
            .contains("colour")
    );
}

#[test]
fn auto_price_fills_missing_costs_less_the_discount() {
    let on = resolve_cost(&format!("autoPrice: true\n{COST_POOL}")).unwrap();
    let p1 = &on.providers[0];
    let cost = |id: &str| p1.models.iter().find(|m| m.id == id).and_then(|m| m.cost);
    let mini = cost("gpt-4o-mini").unwrap();
    assert!((mini.input - 0.075).abs() < 1e-12 && (mini.output - 0.3).abs() < 1e-12);
    let o3 = cost("o3").unwrap();
    assert!(
        (o3.input - 1.5).abs() < 1e-12 && (o3.output - 6.0).abs() < 1e-12,
        "the model's discount wins"
    );
    assert_eq!(
        cost("gpt-4o").map(|c| (c.input, c.output)),
        Some((1.0, 2.0)),
        "explicit wins"
    );
    assert_eq!(cost("house"), None);
    assert_eq!(p1.price_sources["gpt-4o-mini"], prices::PriceSource::Table);
    assert_eq!(p1.price_sources["gpt-4o"], prices::PriceSource::Config);
    assert_eq!(p1.price_sources["house"], prices::PriceSource::Unpriced);

    let off = resolve_cost(COST_POOL).unwrap();
    assert_eq!(off.providers[0].models[0].cost, None, "off by default");
    assert_eq!(
        off.providers[0].price_sources["gpt-4o-mini"],
        prices::PriceSource::Unpriced
    );

    let err = resolve_cost(&COST_POOL.replace("discount: 0.5", "discount: 1.5")).unwrap_err();
    assert!(err.contains("providers[0].discount"), "{err}");
}

#[test]
fn when_lists_name_known_triggers() {
    let ok = format!("{COST_POOL}  guarded: {{ candidates: [{{ model: gpt-4o }}, {{ model: gpt-4o-mini, when: [rate_limit, provider_error] }}] }}\n");
    let config = resolve_cost(&ok).unwrap();
    let tiers = config.profiles["guarded"].candidates.clone().unwrap();
    assert_eq!(tiers[1].0[0].when.as_ref().map(Vec::len), Some(2));
    let bad = format!(
        "{COST_POOL}  guarded: {{ candidates: [{{ model: gpt-4o, when: [sometimes] }}] }}\n"
    );
    assert!(resolve_cost(&bad).unwrap_err().contains("sometimes"));
}

#[test]
fn the_otlp_endpoint_is_an_http_url_and_traces_are_off_without_it() {
    let env = MapEnv::new([("K", "sk-k")]);
    let providers = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m }] }\n";
    let with = |endpoint: &str| {
        format!("{providers}telemetry: {{ otlp: {{ endpoint: '{endpoint}' }} }}\n")
    };
    assert_eq!(resolve(providers, &env).map(|c| c.otlp_endpoint), Ok(None));
    assert_eq!(
        resolve(&with("http://127.0.0.1:4317/"), &env).map(|c| c.otlp_endpoint),
        Ok(Some("http://127.0.0.1:4317".to_owned()))
    );
    for bad in ["127.0.0.1:4317", "grpc://x:4317", "http://"] {
        let message = err(&with(bad), &env);
        assert!(
            message.contains("telemetry.otlp.endpoint"),
            "{bad}: {message}"
        );
    }
}

#[test]
fn a_keyless_provider_gets_one_lane_without_a_secret_and_others_still_need_keys(
) -> Result<(), String> {
    let env = MapEnv::new::<&str, &str>([]);
    let config = resolve(
        "providers:\n  - { id: free, baseUrl: 'http://h/v1', terms: { keyless: true }, models: [{ id: m }] }\n",
        &env,
    )?;
    let keys = &config.providers[0].keys;
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].alias, "keyless");
    assert_eq!(keys[0].source, SecretSource::Keyless);
    assert_eq!(
        keys[0].source.resolve(&env).map(|s| s.expose().to_owned()),
        Some(String::new())
    );
    let message = err(
        "providers:\n  - { id: paid, baseUrl: 'http://h/v1', models: [{ id: m }] }\n",
        &env,
    );
    assert!(message.contains("needs keys or keysFromEnv"), "{message}");
    Ok(())
}

#[test]
fn include_content_is_off_unless_set() {
    let env = MapEnv::new([("A_API_KEY", "k")]);
    let pool = "providers:\n  - { kind: openai, keysFromEnv: A, models: [{ id: m }] }\n";
    let load = |extra: &str| {
        parse(&format!("{extra}{pool}"))
            .and_then(|f| f.resolve(&env, Path::new(".")))
            .map(|c| c.include_content)
            .map_err(|e| e.to_string())
    };
    assert_eq!(load(""), Ok(false));
    assert_eq!(load("telemetry: { includeContent: false }\n"), Ok(false));
    assert_eq!(load("telemetry: { includeContent: true }\n"), Ok(true));
}

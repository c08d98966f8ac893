//! Secret references and their resolution.
//!
//! The config never holds a secret: it names where one lives (`{ env: NAME }`, `{ file: path }`,
//! or a variable found by `keysFromEnv`). The engine resolves every reference again about once a
//! second, so a rotated variable or re-sealed file reaches the data plane without a restart.
//! A resolved value is a [`Secret`], whose `Debug` is redacted and which has no `Display`, so it
//! cannot end up in a log line, an error or a `{:?}` by accident.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A secret value. Never printed: `Debug` shows `Secret(<redacted>)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it (the snapshot, a comparison).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// First 8 bytes of SHA-256 of the secret, big endian.
    pub fn fingerprint(&self) -> u64 {
        fingerprint(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// First 8 bytes of SHA-256(value) as a big-endian u64: the fingerprint a blacklist keeps of the
/// secret it refused.
pub use ai_router_contract::fingerprint;

/// Lowercase hex SHA-256.
pub fn sha256_hex(value: &str) -> String {
    ai_router_contract::sha256_hex(value.as_bytes())
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Where the environment comes from: the process, or a map in tests (and for `up`'s overlay).
pub trait Env: Send + Sync {
    fn var(&self, name: &str) -> Option<String>;
    /// Every variable name (for `keysFromEnv`'s `_API_KEY_<n>` discovery).
    fn names(&self) -> Vec<String>;
    /// Whether a value may not be read as a provider key, though it stays readable for every
    /// other reference (`mountedKeys`, the admin token). `up` refuses gateway virtual keys
    /// there: the quick start exports the app's key as `OPENAI_API_KEY`.
    fn refuses_as_provider_key(&self, _value: &str) -> bool {
        false
    }
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .collect()
    }
}

/// A fixed set of variables over an optional base environment (the overlay wins).
#[derive(Clone, Default)]
pub struct MapEnv {
    vars: BTreeMap<String, String>,
    base: Option<Arc<dyn Env>>,
}

impl MapEnv {
    pub fn new<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            vars: vars
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            base: None,
        }
    }

    /// These variables over `base`.
    pub fn overlay(mut self, base: Arc<dyn Env>) -> Self {
        self.base = Some(base);
        self
    }

    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.insert(name.into(), value.into());
    }

    pub fn remove(&mut self, name: &str) {
        self.vars.remove(name);
    }
}

impl fmt::Debug for MapEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: the values are secrets.
        f.debug_struct("MapEnv")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .field("overlay", &self.base.is_some())
            .finish()
    }
}

impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.vars
            .get(name)
            .cloned()
            .or_else(|| self.base.as_ref().and_then(|base| base.var(name)))
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.vars.keys().cloned().collect();
        if let Some(base) = &self.base {
            names.extend(base.names());
            names.sort();
            names.dedup();
        }
        names
    }

    fn refuses_as_provider_key(&self, value: &str) -> bool {
        self.base
            .as_ref()
            .is_some_and(|base| base.refuses_as_provider_key(value))
    }
}

/// Where a secret lives. Holds names and paths, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// `{ env: NAME }`
    Env(String),
    /// `{ file: path }` (absolute, or already joined to the config's directory): its first line.
    File(PathBuf),
    /// `<PREFIX>_API_KEY[_<n>]`, else the file named by its `_FILE` twin.
    EnvOrFileEnv { var: String, file_var: String },
    /// Item `index` of `<PREFIX>_API_KEYS`, split at commas and whitespace.
    EnvListItem { var: String, index: usize },
    /// A keyless provider's one lane: no secret, no auth header (`terms: { keyless: true }`).
    Keyless,
}

impl SecretSource {
    /// The current value, or `None` when the reference resolves to nothing (unset, empty,
    /// unreadable). Never fails loudly: a missing secret is a key state, not an error.
    pub fn resolve(&self, env: &dyn Env) -> Option<Secret> {
        match self {
            Self::Env(name) => non_empty(env.var(name)),
            Self::File(path) => read_first_line(path),
            Self::EnvOrFileEnv { var, file_var } => non_empty(env.var(var)).or_else(|| {
                env.var(file_var)
                    .and_then(|path| read_first_line(Path::new(path.trim())))
            }),
            Self::Keyless => Some(Secret::new("")),
            Self::EnvListItem { var, index } => env
                .var(var)
                .and_then(|list| key_list_items(&list).nth(*index).map(Secret::new)),
        }
    }

    /// [`SecretSource::resolve`] for a provider key: a value the environment refuses as one
    /// ([`Env::refuses_as_provider_key`]) resolves to nothing.
    pub fn resolve_provider_key(&self, env: &dyn Env) -> Option<Secret> {
        self.resolve(env)
            .filter(|secret| !env.refuses_as_provider_key(secret.expose()))
    }

    /// Where the secret comes from, for messages (a name or a path, never a value).
    pub fn describe(&self) -> String {
        match self {
            Self::Env(name) => format!("env {name}"),
            Self::File(path) => format!("file {}", path.display()),
            Self::EnvOrFileEnv { var, file_var } => format!("env {var} (or {file_var})"),
            Self::EnvListItem { var, index } => format!("env {var} item {}", index + 1),
            Self::Keyless => "no key (keyless)".to_owned(),
        }
    }
}

/// Splits `<PREFIX>_API_KEYS` at commas and whitespace.
pub fn split_key_list(list: &str) -> Vec<String> {
    key_list_items(list).map(str::to_owned).collect()
}

fn key_list_items(list: &str) -> impl Iterator<Item = &str> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
}

/// Resolves many provider keys in one pass (every key of the pool, each second): each
/// `<PREFIX>_API_KEYS` list is read and split once, not once per item, which with 1,000 listed
/// keys was a million strings made and dropped per pass.
pub struct Resolver<'a> {
    env: &'a dyn Env,
    lists: HashMap<String, Vec<String>>,
}

impl<'a> Resolver<'a> {
    pub fn new(env: &'a dyn Env) -> Self {
        Self {
            env,
            lists: HashMap::new(),
        }
    }

    /// [`SecretSource::resolve_provider_key`], the lists read once per resolver.
    pub fn resolve(&mut self, source: &SecretSource) -> Option<Secret> {
        let SecretSource::EnvListItem { var, index } = source else {
            return source.resolve_provider_key(self.env);
        };
        if !self.lists.contains_key(var) {
            let items = self
                .env
                .var(var)
                .map(|list| split_key_list(&list))
                .unwrap_or_default();
            self.lists.insert(var.clone(), items);
        }
        self.lists
            .get(var)
            .and_then(|items| items.get(*index))
            .filter(|item| !self.env.refuses_as_provider_key(item))
            .map(|item| Secret::new(item.as_str()))
    }
}

fn non_empty(value: Option<String>) -> Option<Secret> {
    value
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .map(Secret::new)
}

/// The first line of a file, trimmed; `None` when unreadable or empty.
pub fn read_first_line(path: &Path) -> Option<Secret> {
    let text = std::fs::read_to_string(path).ok()?;
    non_empty(text.lines().next().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_the_first_eight_bytes_big_endian() {
        // sha256("abc") = ba7816bf8f01cfea...
        assert_eq!(fingerprint("abc"), 0xba78_16bf_8f01_cfea);
        assert_eq!(Secret::new("abc").fingerprint(), 0xba78_16bf_8f01_cfea);
    }

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("sk-very-secret");
        let shown = format!("{secret:?} {:?}", Some(secret.clone()));
        assert!(!shown.contains("very-secret"), "{shown}");
        let env = MapEnv::new([("OPENAI_API_KEY", "sk-very-secret")]);
        assert!(!format!("{env:?}").contains("very-secret"));
    }

    #[test]
    fn a_resolver_reads_each_list_once_and_answers_as_resolve_does() {
        struct Counting(MapEnv, std::sync::atomic::AtomicUsize);
        impl Env for Counting {
            fn var(&self, name: &str) -> Option<String> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.0.var(name)
            }
            fn names(&self) -> Vec<String> {
                self.0.names()
            }
        }
        let env = Counting(
            MapEnv::new([("LIST", "k1, k2\nk3"), ("ONE", " sk-one ")]),
            Default::default(),
        );
        let item = |index| SecretSource::EnvListItem {
            var: "LIST".into(),
            index,
        };
        let sources = [
            item(0),
            item(1),
            item(2),
            item(3),
            SecretSource::Env("ONE".into()),
            SecretSource::EnvListItem {
                var: "UNSET".into(),
                index: 0,
            },
        ];
        let each: Vec<_> = sources.iter().map(|s| s.resolve(&env)).collect();
        let reads_each = env.1.swap(0, std::sync::atomic::Ordering::Relaxed);
        let mut resolver = Resolver::new(&env);
        let once: Vec<_> = sources.iter().map(|s| resolver.resolve(s)).collect();
        assert_eq!(once, each);
        assert_eq!(
            once.iter()
                .map(|s| s.as_ref().map(|v| v.expose().to_owned()))
                .collect::<Vec<_>>(),
            [
                Some("k1"),
                Some("k2"),
                Some("k3"),
                None,
                Some("sk-one"),
                None
            ]
            .map(|v| v.map(str::to_owned))
        );
        assert_eq!(reads_each, 6);
        // LIST once, ONE once, UNSET once.
        assert_eq!(env.1.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn resolves_env_file_twins_and_lists() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("ai-router-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("key");
        std::fs::write(&file, "  sk-from-file  \nsecond line\n")?;
        let env = MapEnv::new([
            ("A", " sk-a "),
            ("EMPTY", "  "),
            ("B_FILE", file.to_string_lossy().as_ref()),
            ("LIST", "k1, k2\nk3"),
        ]);
        let get = |s: SecretSource| s.resolve(&env).map(|v| v.expose().to_owned());
        assert_eq!(get(SecretSource::Env("A".into())).as_deref(), Some("sk-a"));
        assert_eq!(get(SecretSource::Env("EMPTY".into())), None);
        assert_eq!(get(SecretSource::Env("UNSET".into())), None);
        assert_eq!(
            get(SecretSource::File(file.clone())).as_deref(),
            Some("sk-from-file")
        );
        assert_eq!(get(SecretSource::File(dir.join("absent"))), None);
        let twin = SecretSource::EnvOrFileEnv {
            var: "B".into(),
            file_var: "B_FILE".into(),
        };
        assert_eq!(get(twin).as_deref(), Some("sk-from-file"));
        let wins = SecretSource::EnvOrFileEnv {
            var: "A".into(),
            file_var: "B_FILE".into(),
        };
        assert_eq!(get(wins).as_deref(), Some("sk-a"));
        let third = SecretSource::EnvListItem {
            var: "LIST".into(),
            index: 2,
        };
        assert_eq!(get(third).as_deref(), Some("k3"));
        let past = SecretSource::EnvListItem {
            var: "LIST".into(),
            index: 3,
        };
        assert_eq!(get(past), None);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn overlay_wins_over_base() {
        let base: Arc<dyn Env> = Arc::new(MapEnv::new([("X", "base"), ("Y", "y")]));
        let env = MapEnv::new([("X", "top")]).overlay(base);
        assert_eq!(env.var("X").as_deref(), Some("top"));
        assert_eq!(env.var("Y").as_deref(), Some("y"));
        assert_eq!(env.names(), vec!["X".to_owned(), "Y".to_owned()]);
    }
}

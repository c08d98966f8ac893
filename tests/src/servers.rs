//! Real Redis and Postgres servers for the tests: each on a free loopback port, its files in a
//! fresh temporary directory, stopped and removed on drop. No system service is used.
//!
//! Postgres refuses to run as root: as root the data directory is given to `nobody` and the
//! server runs as that user (`setpriv`, which execs, so the child is the postmaster itself).
//! The binaries: `$AI_ROUTER_PG_BIN`, else the newest `/usr/lib/postgresql/<ver>/bin` (where
//! Debian puts them), else `PATH`. This file has no dependency but `anyhow` and std: the
//! control plane's unit tests include it too.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn temp_dir(what: &str) -> anyhow::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "ai-router-{what}-{}-{n}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Waits up to `limit` for the child to exit; kills it after that.
fn stop_child(child: &mut Child, gentle: &str, limit: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    signal(child, gentle);
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A server's certificate, its key and the CA that issued it (PEM files), for a server that
/// speaks only TLS (clients present no certificate).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl ServerTls {
    /// The files `ai-router certs --out DIR` writes for the control plane (`DIR/control-plane`),
    /// valid for `localhost` and `127.0.0.1`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: dir.join("ca.pem"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/// `redis-server --port P --dir D`, no persistence (a restart starts empty, as after a crash);
/// with TLS, `--port 0 --tls-port P`.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    tls: Option<ServerTls>,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> anyhow::Result<Self> {
        Self::launch(None)
    }

    /// A server that speaks only TLS, with `tls`'s certificate: `rediss://` [`RedisServer::url`].
    pub fn start_tls(tls: ServerTls) -> anyhow::Result<Self> {
        Self::launch(Some(tls))
    }

    /// A server whose port is chosen, not started yet: nothing listens on
    /// [`RedisServer::url`] until [`RedisServer::restart`].
    pub fn prepare() -> anyhow::Result<Self> {
        Ok(Self {
            port: free_port()?,
            dir: temp_dir("redis")?,
            tls: None,
            child: None,
        })
    }

    fn launch(tls: Option<ServerTls>) -> anyhow::Result<Self> {
        let mut server = Self::prepare()?;
        server.tls = tls;
        server.restart()?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Stops the server at once (SIGKILL: what a crash looks like); its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let log_path = self.dir.join("redis.log");
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => {
                command.args(["--port", &self.port.to_string()]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        let child = command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server (scripts/setup.sh installs it)")?;
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = if self.tls.is_some() {
                // No TLS client here: the server says when it listens.
                std::fs::read_to_string(&log_path)
                    .is_ok_and(|log| log.contains("Ready to accept connections"))
            } else {
                self.ping()
            };
            if ready {
                return Ok(());
            }
            if Instant::now() > until {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!(
                    "redis-server on port {} did not become ready:\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------------

fn pg_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("AI_ROUTER_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn pg_command(bin: Option<&Path>, name: &str, as_nobody: bool) -> Command {
    let program = bin.map_or_else(|| PathBuf::from(name), |b| b.join(name));
    if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// `initdb` + `postgres -D D -p P -k D`, trust authentication on loopback, user `postgres`;
/// with TLS, `ssl=on` with a copy of the certificate and key in `D/tls` (the server's own,
/// as Postgres wants its key).
pub struct PostgresServer {
    pub port: u16,
    dir: PathBuf,
    bin: Option<PathBuf>,
    as_nobody: bool,
    tls: bool,
    child: Option<Child>,
}

impl PostgresServer {
    pub fn start() -> anyhow::Result<Self> {
        Self::launch(None)
    }

    /// A server whose data directory is made and whose port is chosen, not started yet:
    /// nothing listens on [`PostgresServer::url`] until [`PostgresServer::restart`].
    pub fn prepare() -> anyhow::Result<Self> {
        Self::init(None)
    }

    /// A server that also speaks TLS, with `tls`'s certificate (clients choose with `sslmode`).
    pub fn start_tls(tls: &ServerTls) -> anyhow::Result<Self> {
        Self::launch(Some(tls))
    }

    fn launch(tls: Option<&ServerTls>) -> anyhow::Result<Self> {
        let mut server = Self::init(tls)?;
        server.restart()?;
        Ok(server)
    }

    /// `initdb` and a free port.
    fn init(tls: Option<&ServerTls>) -> anyhow::Result<Self> {
        let bin = pg_bin_dir();
        let as_nobody = is_root();
        let dir = temp_dir("postgres")?;
        if let Some(tls) = tls {
            std::fs::create_dir_all(dir.join("tls"))?;
            for (from, to) in [(&tls.cert, "server.crt"), (&tls.key, "server.key")] {
                std::fs::copy(from, dir.join("tls").join(to))
                    .with_context(|| format!("copying {}", from.display()))?;
            }
        }
        if as_nobody {
            let status = Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(&dir)
                .status()?;
            if !status.success() {
                bail!("chown nobody {}: {status}", dir.display());
            }
        }
        let out = pg_command(bin.as_deref(), "initdb", as_nobody)
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .env("LC_ALL", "C")
            .output()
            .context("running initdb (scripts/setup.sh installs postgresql)")?;
        if !out.status.success() {
            bail!("initdb: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Self {
            port: free_port()?,
            dir,
            bin,
            as_nobody,
            tls: tls.is_some(),
            child: None,
        })
    }

    /// Starts the server (again, after [`PostgresServer::stop`]) on its port and data.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let port = self.port.to_string();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("postgres.log"))?;
        let mut command = pg_command(self.bin.as_deref(), "postgres", self.as_nobody);
        if self.tls {
            let file = |name: &str| self.dir.join("tls").join(name).display().to_string();
            command.args(["-c", "ssl=on"]);
            command.args(["-c", &format!("ssl_cert_file={}", file("server.crt"))]);
            command.args(["-c", &format!("ssl_key_file={}", file("server.key"))]);
        }
        let child = command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &port])
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting postgres")?;
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = pg_command(self.bin.as_deref(), "pg_isready", false)
                .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if Instant::now() > until {
                self.stop();
                bail!("postgres on port {port} did not become ready");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `psql` on [`PostgresServer::url`]'s database, quiet, stopping at the first error.
    pub fn psql(&self) -> Command {
        let mut command = pg_command(self.bin.as_deref(), "psql", false);
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-q", "-A", "-t"])
            .args(["-v", "ON_ERROR_STOP=1"]);
        command
    }

    /// Fast shutdown (SIGINT), then SIGKILL after 10 s; the data stays for a restart.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "INT", Duration::from_secs(10));
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

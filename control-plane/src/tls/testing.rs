//! Certificates for database servers in tests: `right` (the server's, under one CA) and
//! `wrong` (another CA's), as `ai-router certs` issues them.

use std::path::PathBuf;

use crate::tls::issue::{issue, IssueOptions, Issued};

pub struct TwoCas {
    pub dir: PathBuf,
    pub right: Issued,
    pub wrong: Issued,
}

impl Drop for TwoCas {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn two_cas(name: &str) -> anyhow::Result<TwoCas> {
    let dir = std::env::temp_dir().join(format!(
        "ai-router-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let options = |out: PathBuf| IssueOptions {
        out,
        sans: Vec::new(),
        envoys: 1,
        envoy_dir: None,
        new_ca: false,
    };
    let right = issue(&options(dir.join("right")))?;
    let wrong = issue(&options(dir.join("wrong")))?;
    Ok(TwoCas { dir, right, wrong })
}

//! `ai-router certs`: a CA and the leaves of the sync channel, written as files.
//!
//! Every file is written beside its final name and renamed over it, so a reader (the control
//! plane's reload, Envoy's SDS watch on the folder) never sees half a file; keys are 0600.
//! Running it again over the same folder keeps the CA (its key signs the new leaves, so peers
//! that trust `ca.pem` take them) unless told `new_ca`.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};

use super::{
    TlsError, CA_FILE, CERT_FILE, KEY_FILE, SDS_CA_FILE, SDS_CA_SECRET, SDS_CERTIFICATE_FILE,
    SDS_CERTIFICATE_SECRET,
};

/// How long a leaf is valid; the CA lasts ten times as long.
pub const LEAF_VALIDITY_DAYS: i64 = 365;
const CA_VALIDITY_DAYS: i64 = 10 * LEAF_VALIDITY_DAYS;
const CA_COMMON_NAME: &str = "ai-router sync CA";
/// The names the control plane's certificate always carries besides `--san`.
pub const DEFAULT_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// What to issue.
#[derive(Debug, Clone)]
pub struct IssueOptions {
    pub out: PathBuf,
    /// Extra names of the control plane (DNS names or IPs): what Envoy dials.
    pub sans: Vec<String>,
    /// 1: one folder `envoy/`; more: `envoy-1/` ... `envoy-N/`, one certificate each.
    pub envoys: u32,
    /// The folder as each Envoy sees it (its SDS files name their PEM files there); default:
    /// each folder's own absolute path.
    pub envoy_dir: Option<String>,
    /// Replace the CA even if `out` holds one.
    pub new_ca: bool,
}

/// What was written: paths, for the CLI to print.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Issued {
    pub ca: PathBuf,
    /// `false` when the CA in `out` was kept.
    pub new_ca: bool,
    pub control_plane: PathBuf,
    pub envoys: Vec<PathBuf>,
    pub sans: Vec<String>,
}

/// Issues the CA (or keeps the one in `out`), the control plane's server certificate and the
/// Envoys' client certificates.
pub fn issue(opts: &IssueOptions) -> Result<Issued, TlsError> {
    let now_days = now_days();
    create_dir(&opts.out)?;
    let ca_key_path = opts.out.join("ca.key");
    let ca_cert_path = opts.out.join(CA_FILE);
    let keep_ca = !opts.new_ca && ca_key_path.is_file() && ca_cert_path.is_file();
    let (ca_key, ca_pem) = if keep_ca {
        let key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(|e| TlsError::Pem {
            path: ca_key_path.display().to_string(),
            reason: e.to_string(),
        })?;
        (key, read(&ca_cert_path)?)
    } else {
        let key = KeyPair::generate().map_err(issue_error)?;
        let cert = ca_params(now_days)?
            .self_signed(&key)
            .map_err(issue_error)?;
        (key, cert.pem())
    };
    // The issuer for signing: the same name and key as `ca.pem`, so what it signs chains to it.
    let issuer = ca_params(now_days)?
        .self_signed(&ca_key)
        .map_err(issue_error)?;
    if !keep_ca {
        write_atomic(&ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
        write_atomic(&ca_cert_path, ca_pem.as_bytes(), false)?;
    }

    let mut sans: Vec<String> = DEFAULT_SANS.iter().map(|s| (*s).to_owned()).collect();
    for san in &opts.sans {
        let san = san.trim().trim_start_matches('[').trim_end_matches(']');
        if !san.is_empty() && !sans.iter().any(|s| s == san) {
            sans.push(san.to_owned());
        }
    }
    let control_plane = opts.out.join("control-plane");
    let (cert, key) = leaf(
        "ai-router control plane",
        sans.clone(),
        ExtendedKeyUsagePurpose::ServerAuth,
        now_days,
        &issuer,
        &ca_key,
    )?;
    write_leaf(&control_plane, &cert, &key, &ca_pem)?;

    let mut envoys = Vec::new();
    for n in 1..=opts.envoys.max(1) {
        let name = if opts.envoys <= 1 {
            "envoy".to_owned()
        } else {
            format!("envoy-{n}")
        };
        let dir = opts.out.join(&name);
        let (cert, key) = leaf(
            &format!("ai-router {name}"),
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            now_days,
            &issuer,
            &ca_key,
        )?;
        // The SDS files first: Envoy reloads on the leaf's rename, which comes last.
        let seen_as = match &opts.envoy_dir {
            Some(dir) => dir.trim_end_matches('/').to_owned(),
            None => absolute(&dir)?.display().to_string(),
        };
        create_dir(&dir)?;
        write_atomic(
            &dir.join(SDS_CERTIFICATE_FILE),
            sds_certificate(&seen_as).as_bytes(),
            false,
        )?;
        write_atomic(&dir.join(SDS_CA_FILE), sds_ca(&seen_as).as_bytes(), false)?;
        write_leaf(&dir, &cert, &key, &ca_pem)?;
        envoys.push(dir);
    }
    Ok(Issued {
        ca: ca_cert_path,
        new_ca: !keep_ca,
        control_plane,
        envoys,
        sans,
    })
}

fn issue_error(e: rcgen::Error) -> TlsError {
    TlsError::Issue(e.to_string())
}

/// Days since the Unix epoch, now.
fn now_days() -> i64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    i64::try_from(ms / 86_400_000).unwrap_or_default()
}

/// Valid from yesterday (clocks differ) for `days`.
fn set_validity(params: &mut CertificateParams, now_days: i64, days: i64) {
    let ymd = |days: i64| {
        let (y, m, d) = ai_router_contract::calendar::civil_from_days(days);
        rcgen::date_time_ymd(
            i32::try_from(y).unwrap_or(9999),
            u8::try_from(m).unwrap_or(1),
            u8::try_from(d).unwrap_or(1),
        )
    };
    params.not_before = ymd(now_days - 1);
    params.not_after = ymd(now_days + days);
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive, as DER integers are signed.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn ca_params(now_days: i64) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(issue_error)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, now_days, CA_VALIDITY_DAYS);
    Ok(params)
}

/// A leaf signed by the CA: its certificate and key as PEM.
fn leaf(
    common_name: &str,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
    now_days: i64,
    issuer: &rcgen::Certificate,
    issuer_key: &KeyPair,
) -> Result<(String, String), TlsError> {
    let mut params = CertificateParams::new(sans).map_err(issue_error)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, now_days, LEAF_VALIDITY_DAYS);
    let key = KeyPair::generate().map_err(issue_error)?;
    let cert = params
        .signed_by(&key, issuer, issuer_key)
        .map_err(issue_error)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A folder's CA, key, then certificate (the rename a watcher reloads on comes last).
fn write_leaf(dir: &Path, cert: &str, key: &str, ca: &str) -> Result<(), TlsError> {
    create_dir(dir)?;
    write_atomic(&dir.join(CA_FILE), ca.as_bytes(), false)?;
    write_atomic(&dir.join(KEY_FILE), key.as_bytes(), true)?;
    write_atomic(&dir.join(CERT_FILE), cert.as_bytes(), false)
}

/// The SDS resource holding an Envoy's client certificate, its files in `dir` (as Envoy
/// sees it), reloaded when a file is moved into `dir`.
fn sds_certificate(dir: &str) -> String {
    format!(
        "# Written by `ai-router certs`: the client certificate Envoy presents on the sync channel.\nresources:\n  - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n    name: {SDS_CERTIFICATE_SECRET}\n    tls_certificate:\n      certificate_chain: {{ filename: \"{dir}/{CERT_FILE}\" }}\n      private_key: {{ filename: \"{dir}/{KEY_FILE}\" }}\n      watched_directory: {{ path: \"{dir}\" }}\n"
    )
}

/// The SDS resource holding the CA the control plane's certificate must chain to.
fn sds_ca(dir: &str) -> String {
    format!(
        "# Written by `ai-router certs`: the CA the control plane's certificate must chain to.\nresources:\n  - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n    name: {SDS_CA_SECRET}\n    validation_context:\n      trusted_ca: {{ filename: \"{dir}/{CA_FILE}\" }}\n      watched_directory: {{ path: \"{dir}\" }}\n"
    )
}

fn create_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.display().to_string(),
        source,
    })
}

fn absolute(dir: &Path) -> Result<PathBuf, TlsError> {
    std::path::absolute(dir).map_err(|source| TlsError::Write {
        path: dir.display().to_string(),
        source,
    })
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Writes `path` through a temporary file in the same folder and a rename; `secret` files are
/// created 0600.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let error = |source| TlsError::Write {
        path: path.display().to_string(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(&temp).map_err(error)?;
    file.write_all(bytes).map_err(error)?;
    file.sync_all().map_err(error)?;
    drop(file);
    std::fs::rename(&temp, path).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ai-router-certs-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn issues_a_ca_and_leaves_with_private_keys_and_keeps_the_ca_on_a_second_run(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let out = temp_dir("issue");
        let opts = IssueOptions {
            out: out.clone(),
            sans: vec!["control-plane".into(), "10.1.2.3".into()],
            envoys: 2,
            envoy_dir: Some("/etc/envoy/sync-tls".into()),
            new_ca: false,
        };
        let first = issue(&opts)?;
        assert!(first.new_ca);
        assert_eq!(first.envoys, [out.join("envoy-1"), out.join("envoy-2")]);
        assert!(first.sans.contains(&"control-plane".to_owned()));
        #[cfg(unix)]
        for key in [
            out.join("ca.key"),
            out.join("control-plane/key.pem"),
            out.join("envoy-1/key.pem"),
        ] {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key)?.permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let sds = std::fs::read_to_string(out.join("envoy-2").join(SDS_CERTIFICATE_FILE))?;
        assert!(
            sds.contains("filename: \"/etc/envoy/sync-tls/cert.pem\""),
            "{sds}"
        );
        // The server certificate loads into a server configuration with the CA.
        let files = crate::tls::SyncTlsFiles {
            cert: out.join("control-plane/cert.pem"),
            key: out.join("control-plane/key.pem"),
            client_ca: out.join("control-plane/ca.pem"),
        };
        crate::tls::server::load(&files)?;
        let ca = std::fs::read(out.join(CA_FILE))?;
        let leaf = std::fs::read(out.join("envoy-1/cert.pem"))?;
        let second = issue(&opts)?;
        assert!(!second.new_ca, "the CA is kept");
        assert_eq!(std::fs::read(out.join(CA_FILE))?, ca);
        assert_ne!(std::fs::read(out.join("envoy-1/cert.pem"))?, leaf);
        crate::tls::server::load(&files)?;
        let third = issue(&IssueOptions {
            new_ca: true,
            ..opts
        })?;
        assert!(third.new_ca);
        assert_ne!(std::fs::read(out.join(CA_FILE))?, ca);
        let _ = std::fs::remove_dir_all(&out);
        Ok(())
    }
}

//! TLS client configuration shared by the recorder (towards its upstream) and the replayer
//! (towards `https://` targets): rustls with the ring provider, trusting a given PEM CA file or
//! else the system bundle (`SSL_CERT_FILE`, then the usual Debian and Red Hat paths).
//!
//! It builds configurations only; it does not dial, and it never disables certificate checks
//! (a private CA is trusted by passing its PEM file, not by turning verification off).

use anyhow::Context as _;
use std::path::Path;
use std::sync::Arc;

/// Reads every certificate of a PEM file.
pub(crate) fn load_certs(
    path: &Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs = rustls_pemfile::certs(&mut data.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no certificates found", path.display());
    }
    Ok(certs)
}

/// The trust roots: the CA file given by `flag` (named in errors), else the system bundle.
pub(crate) fn root_store(ca: Option<&Path>, flag: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(p) = ca {
        for c in load_certs(p).with_context(|| flag.to_string())? {
            roots
                .add(c)
                .with_context(|| format!("{flag} {}: bad certificate", p.display()))?;
        }
        return Ok(roots);
    }
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        candidates.push(p.into());
    }
    candidates.push("/etc/ssl/certs/ca-certificates.crt".into());
    candidates.push("/etc/pki/tls/certs/ca-bundle.crt".into());
    for p in candidates {
        if let Ok(certs) = load_certs(&p) {
            let (_ok, _bad) = roots.add_parsable_certificates(certs);
            return Ok(roots);
        }
    }
    anyhow::bail!("no system CA bundle found for an https server; pass {flag}")
}

/// A client configuration offering the ALPN protocols `alpn` (e.g. `http/1.1`).
pub fn client_config(
    ca: Option<&Path>,
    flag: &str,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS client configuration")?
        .with_root_certificates(root_store(ca, flag)?)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(p: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
    }

    #[test]
    fn loads_the_test_ca() {
        let cfg = client_config(Some(&repo("fixtures/tls/ca.pem")), "--x-ca", &[b"http/1.1"])
            .expect("config");
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn errors_name_the_flag_and_file() {
        let e = client_config(Some(&repo("fixtures/tls/key.pem")), "--x-ca", &[])
            .expect_err("a key file is not a certificate file");
        let msg = format!("{e:#}");
        assert!(msg.contains("--x-ca"), "{msg}");
        assert!(msg.contains("key.pem"), "{msg}");
        let e = client_config(Some(Path::new("/nonexistent/ca.pem")), "--x-ca", &[])
            .expect_err("missing file");
        assert!(format!("{e:#}").contains("/nonexistent/ca.pem"));
    }
}

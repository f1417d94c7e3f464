//! Connecting: the store URL (with libpq's environment variables filling
//! what it leaves out) becomes a tokio-postgres config, `sslmode` becomes a
//! rustls client config, and both become the pool every query borrows from.
//!
//! `sslmode` as libpq reads it: `disable` (plain text), `allow` and
//! `prefer` (TLS when the server offers it, the default), `require` (TLS or
//! nothing), `verify-ca` (TLS, the certificate chains to `sslrootcert` or,
//! without one, to the system's roots) and `verify-full` (that, and the
//! certificate names the host). As in libpq, `prefer` and `require` check
//! no certificate unless `sslrootcert` is given, then they check the chain.
//! The password is never logged nor put in an error.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::{redact, Result, StoreError};

/// Longest wait to connect, or for a pooled connection.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections the pool keeps for reads and the committer.
const POOL_SIZE: usize = 16;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(text: &str) -> Option<Mode> {
        Some(match text {
            "disable" => Mode::Disable,
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }
}

/// Where the database is and how to reach it.
pub(super) struct Target {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustlsConnect,
    /// The URL without its password, for messages.
    pub shown: String,
}

/// Reads the store URL and the environment.
pub(super) fn target(url: &str) -> Result<Target> {
    let shown = redact(url);
    let bad = |what: String| StoreError::Format(format!("store URL {shown}: {what}"));
    let (rest, mode, root_cert) = split_tls_options(url).map_err(&bad)?;
    let mut config = tokio_postgres::Config::from_str(&rest)
        .map_err(|e| bad(format!("cannot be read ({e})")))?;
    fill_from_env(&mut config);
    let mode = match mode {
        Some(mode) => mode,
        None => match std::env::var("PGSSLMODE") {
            Ok(text) => Mode::parse(&text).ok_or_else(|| bad(format!("PGSSLMODE={text}")))?,
            Err(_) => Mode::Prefer,
        },
    };
    let root_cert = root_cert.or_else(|| std::env::var("PGSSLROOTCERT").ok());
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    });
    config.connect_timeout(CONNECT_TIMEOUT);
    // A peer that vanished (a failover, a cut cable) is noticed in seconds,
    // not after the kernel's two hours.
    config.keepalives_idle(Duration::from_secs(10));
    config.keepalives_interval(Duration::from_secs(2));
    config.keepalives_retries(3);
    config.tcp_user_timeout(Duration::from_secs(15));
    if config.get_application_name().is_none() {
        config.application_name("aaa");
    }
    let tls = MakeRustlsConnect::new(tls_config(mode, root_cert.as_deref()).map_err(bad)?);
    Ok(Target { config, tls, shown })
}

/// The pool: bounded waits everywhere, so a database that is down makes
/// calls fail in seconds rather than hang.
pub(super) fn pool(target: &Target) -> Result<Pool> {
    let manager = Manager::from_config(
        target.config.clone(),
        target.tls.clone(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(POOL_SIZE)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(CONNECT_TIMEOUT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .recycle_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Format(format!("store {}: {e}", target.shown)))
}

/// Takes `sslmode` and `sslrootcert` out of the URL's query (tokio-postgres
/// knows neither `verify-*` nor root certificates).
fn split_tls_options(
    url: &str,
) -> std::result::Result<(String, Option<Mode>, Option<String>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None, None));
    };
    let (mut mode, mut root_cert, mut kept) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslmode", value)) => {
                mode = Some(Mode::parse(value).ok_or_else(|| format!("sslmode={value}"))?);
            }
            Some(("sslrootcert", value)) => root_cert = Some(value.to_string()),
            _ => kept.push(pair),
        }
    }
    let rest = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    Ok((rest, mode, root_cert))
}

/// libpq's environment variables, for what the URL leaves out.
fn fill_from_env(config: &mut tokio_postgres::Config) {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if config.get_hosts().is_empty() {
        match var("PGHOST") {
            Some(host) => {
                config.host(&host);
            }
            None => {
                config.host("localhost");
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = var("PGPORT").and_then(|p| p.parse().ok()) {
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        if let Some(user) = var("PGUSER") {
            config.user(&user);
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = var("PGPASSWORD") {
            config.password(password);
        }
    }
    if config.get_dbname().is_none() {
        if let Some(name) = var("PGDATABASE") {
            config.dbname(&name);
        }
    }
}

/// The rustls client config `mode` asks for.
fn tls_config(
    mode: Mode,
    root_cert: Option<&str>,
) -> std::result::Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let verify_chain = matches!(mode, Mode::VerifyCa | Mode::VerifyFull) || root_cert.is_some();
    let config = if !verify_chain {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let roots = Arc::new(roots(root_cert)?);
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| format!("TLS roots: {e}"))?;
        if mode == Mode::VerifyFull {
            builder.with_webpki_verifier(webpki).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

/// The roots a certificate must chain to: the `sslrootcert` file's, or the
/// system's.
fn roots(root_cert: Option<&str>) -> std::result::Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {path}: {e}"))?
            {
                let cert = cert.map_err(|e| format!("sslrootcert {path}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    if roots.is_empty() {
        return Err("no root certificates to verify the database's against".into());
    }
    Ok(roots)
}

/// `prefer` and `require` without `sslrootcert`: encrypted, any certificate
/// (libpq's behaviour). The handshake signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked, the name is not.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_leave_the_url_and_the_rest_stays() {
        let (rest, mode, root) = split_tls_options(
            "postgres://u:pw@db:5432/aaa?sslmode=verify-full&application_name=x&sslrootcert=/ca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:pw@db:5432/aaa?application_name=x");
        assert_eq!(mode, Some(Mode::VerifyFull));
        assert_eq!(root.as_deref(), Some("/ca.pem"));
        let (rest, mode, _) = split_tls_options("postgres://db/aaa").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://db/aaa", None));
        assert!(split_tls_options("postgres://db/aaa?sslmode=bogus").is_err());
    }

    #[test]
    fn errors_about_the_url_never_show_the_password() {
        let error = target("postgres://u:secret@db/aaa?sslmode=bogus")
            .err()
            .expect("refused");
        assert!(!error.to_string().contains("secret"), "{error}");
        assert!(error.to_string().contains("u:***@db"), "{error}");
    }

    #[test]
    fn every_mode_makes_a_client_config() {
        for mode in ["disable", "prefer", "require"] {
            let url = format!("postgres://u@127.0.0.1/aaa?sslmode={mode}");
            assert!(target(&url).is_ok(), "{mode}");
        }
    }
}

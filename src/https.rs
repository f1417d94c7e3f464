//! The one outbound HTTP client builder: http:// and https:// URLs over
//! rustls with ring (as tonic's TLS), for webhooks and the built-in model.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client trusting `ca_pem` alone, or the system's roots without it.
pub fn client(ca_pem: Option<&[u8]>) -> Result<HttpsClient, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(trusted_roots(ca_pem)?)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// The given CA (every certificate must be one), or the system's roots
/// (a system certificate rustls refuses is one root fewer, not an error).
pub fn trusted_roots(ca_pem: Option<&[u8]>) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("not PEM certificates: {e}"))?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("a certificate that is not a CA: {e}"))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err("no trusted CA certificate found".into());
    }
    Ok(roots)
}

//! TLS for the relay link: rustls on the aws-lc provider, the system's roots or the
//! CA file's, and the one addition to webpki's rules (`TrustedRoots`).

use std::sync::Arc;

use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::client::{verify_server_name, WebPkiServerVerifier};
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_rustls::TlsConnector;

use super::TransportError;

pub(super) fn tls_connector(
    ca_pem: Option<&[u8]>,
    host: &str,
    alpn: &[u8],
) -> Result<(TlsConnector, ServerName<'static>), TransportError> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    let mut pinned = Vec::new();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TransportError::Roots(e.to_string()))?;
                roots
                    .add(cert.clone())
                    .map_err(|e| TransportError::Roots(e.to_string()))?;
                pinned.push(cert);
            }
            if roots.is_empty() {
                return Err(TransportError::Roots("no certificate in the CA file".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store may hold certificates webpki cannot use; skip those.
                let _ = roots.add(cert);
            }
        }
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TransportError::Roots(e.to_string()))?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError::Roots(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustedRoots { webpki, pinned }))
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
        .map_err(|e| TransportError::Address(host.to_owned(), e.to_string()))?;
    Ok((TlsConnector::from(Arc::new(config)), name))
}

/// webpki's verification, and one addition: a certificate that is itself in the CA file
/// is trusted for the names it carries. That is how a self-signed server certificate is
/// trusted (OpenSSL, and so the API client, accept one; webpki refuses a CA certificate as
/// an end entity). Expired, not-yet-valid and wrong-name certificates stay refused.
#[derive(Debug)]
struct TrustedRoots {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for TrustedRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        use tokio_rustls::rustls::Error::InvalidCertificate;
        let error = match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Ok(verified) => return Ok(verified),
            Err(error) => error,
        };
        let final_ = matches!(
            error,
            InvalidCertificate(
                CertificateError::Expired
                    | CertificateError::ExpiredContext { .. }
                    | CertificateError::NotValidYet
                    | CertificateError::NotValidYetContext { .. }
                    | CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. }
                    | CertificateError::Revoked
            )
        );
        if final_ || !self.pinned.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return Err(error);
        }
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Frames are opaque bytes here: the protobuf lives on the Python side.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        assert!(matches!(
            tls_connector(Some(b"not a pem"), "localhost", b"h2"),
            Err(TransportError::Roots(_))
        ));
    }
}

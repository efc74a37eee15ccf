//! Egress through an HTTP proxy, for the relay's connections and the account API's.
//!
//! The environment says which proxy, as curl, httpx and gRPC read it: `HTTPS_PROXY` for
//! `https://` destinations, `HTTP_PROXY` for `http://` ones, `ALL_PROXY` for both, and
//! `NO_PROXY` for the hosts, domains and networks that go direct (lower-case names
//! too; hyper-util's `Matcher`). The connection goes through a `CONNECT` tunnel
//! (hyper-util's `Tunnel`), so TLS and HTTP/2 run end to end inside it and the proxy
//! sees only the destination's host and port. Only `http://` proxies are supported; a
//! proxy of another scheme is refused when the client is made, not skipped, so an
//! agent never goes direct where its operator said it must not.

use std::io;

use http::header::HeaderValue;
use http::Uri;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::ServiceExt;

use super::TransportError;

/// The proxy a destination goes through: an `http://` proxy's host and port, and its
/// `Proxy-Authorization` when the variable carried `user:password@`.
#[derive(Clone)]
pub(super) struct Proxy {
    uri: Uri,
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for Proxy {
    // Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy({})", self.uri)
    }
}

/// The proxy the environment names for `host:port` (TLS or not), if any.
pub(super) fn from_env(tls: bool, host: &str, port: u16) -> Result<Option<Proxy>, TransportError> {
    choose(&Matcher::from_env(), tls, host, port)
}

fn choose(matcher: &Matcher, tls: bool, host: &str, port: u16) -> Result<Option<Proxy>, TransportError> {
    let scheme = if tls { "https" } else { "http" };
    let host = bracketed(host);
    let dst: Uri = format!("{scheme}://{host}:{port}")
        .parse()
        .map_err(|e| TransportError::Address(format!("{host}:{port}"), format!("{e}")))?;
    let Some(intercept) = matcher.intercept(&dst) else {
        return Ok(None);
    };
    let uri = intercept.uri().clone();
    if uri.scheme_str() != Some("http") {
        return Err(TransportError::Proxy(format!(
            "the proxy for {scheme}:// destinations is {}://{}: only http:// proxies are \
             supported (a CONNECT tunnel); set NO_PROXY to go direct",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map_or("", |a| a.as_str()),
        )));
    }
    Ok(Some(Proxy {
        uri,
        auth: intercept.basic_auth().cloned(),
    }))
}

/// `host` as a URI's authority writes it: an IPv6 address in brackets.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

impl Proxy {
    /// A TCP connection to the proxy, tunnelled to `host:port` by `CONNECT`.
    pub(super) async fn tunnel(&self, host: &str, port: u16) -> io::Result<TcpStream> {
        let proxy = self.uri.authority().map_or_else(String::new, |a| a.to_string());
        let dial = tower::service_fn(|to: Uri| async move {
            let host = to.host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
            let tcp = TcpStream::connect((host.as_str(), to.port_u16().unwrap_or(80))).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, io::Error>(TokioIo::new(tcp))
        });
        let mut tunnel = Tunnel::new(self.uri.clone(), dial);
        if let Some(auth) = &self.auth {
            tunnel = tunnel.with_auth(auth.clone());
        }
        let host = bracketed(host);
        let dst: Uri = format!("http://{host}:{port}")
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        match tunnel.oneshot(dst).await {
            Ok(io) => Ok(io.into_inner()),
            Err(e) => {
                // TunnelError's text, and its cause's (a refused connection to the proxy).
                let mut text = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    text.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("through the proxy {proxy} to {host}:{port}: {text}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(all: &str, no: &str) -> Matcher {
        Matcher::builder().all(all.to_owned()).no(no.to_owned()).build()
    }

    #[test]
    fn the_environment_chooses_by_scheme_and_no_proxy() {
        let m = Matcher::builder()
            .http("http://plain.proxy:3128".to_owned())
            .https("http://user:p%40ss@tls.proxy:8080".to_owned())
            .no("direct.example, 10.0.0.0/8".to_owned())
            .build();
        let plain = choose(&m, false, "relay.example", 50051).unwrap().unwrap();
        assert_eq!(plain.uri.authority().unwrap().as_str(), "plain.proxy:3128");
        assert!(plain.auth.is_none());
        let tls = choose(&m, true, "relay.example", 443).unwrap().unwrap();
        assert_eq!(tls.uri.authority().unwrap().as_str(), "tls.proxy:8080");
        // "user:p@ss", percent-decoded, in Basic.
        assert_eq!(tls.auth.unwrap().to_str().unwrap(), "Basic dXNlcjpwQHNz");
        assert!(format!("{:?}", choose(&m, true, "relay.example", 443).unwrap()).contains("tls.proxy"));
        assert!(!format!("{:?}", choose(&m, true, "relay.example", 443).unwrap()).contains("user"));
        assert!(choose(&m, true, "direct.example", 443).unwrap().is_none());
        assert!(choose(&m, true, "api.direct.example", 443).unwrap().is_none());
        assert!(choose(&m, false, "10.1.2.3", 80).unwrap().is_none());
        assert!(choose(&m, false, "::1", 80).unwrap().is_some());
        assert!(choose(&Matcher::builder().build(), true, "relay.example", 443)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_proxy_of_another_scheme_is_refused_not_skipped() {
        let err = choose(&matcher("socks5://proxy:1080", ""), true, "relay.example", 443).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("socks5://proxy:1080") && text.contains("only http://"),
            "{text}"
        );
        assert!(choose(&matcher("socks5://proxy:1080", "*"), true, "relay.example", 443)
            .unwrap()
            .is_none());
    }
}

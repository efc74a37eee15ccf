//! Egress through an HTTP proxy, for the relay's connections and the account API's.
//!
//! The environment says which proxy: `HTTPS_PROXY` for `https://` destinations,
//! `HTTP_PROXY` for `http://` ones, `ALL_PROXY` for both, and `NO_PROXY` for what goes
//! direct (each in upper or lower case; hyper-util's `Matcher` applies `NO_PROXY`). A
//! value set but unusable is an error when the client is made, never a silent direct
//! connection.
//! The connection goes through a `CONNECT` tunnel with TLS or HTTP/2 inside; only
//! `http://` proxies are supported.

use std::io;

use http::header::HeaderValue;
use http::Uri;
use hyper_util::client::proxy::matcher::Matcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::TransportError;

/// Longest proxy response head read before giving up on the proxy.
const MAX_HEAD: usize = 8 * 1024;

/// The proxy a destination goes through: an `http://` proxy's host and port, and its
/// `Proxy-Authorization` when the variable carried `user:password@`.
#[derive(Clone)]
pub(super) struct Proxy {
    host: String,
    port: u16,
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for Proxy {
    // Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy({}:{})", bracketed(&self.host), self.port)
    }
}

/// The proxy variables as read from the environment: for each, the first of its
/// upper- and lower-case names that is set and not blank. No Debug: the values may hold
/// passwords.
#[derive(Default, Clone)]
struct Variables {
    all: Option<(&'static str, String)>,
    http: Option<(&'static str, String)>,
    https: Option<(&'static str, String)>,
    no: String,
}

impl Variables {
    fn from_env() -> Result<Self, TransportError> {
        let get = |names: &[&'static str]| -> Result<Option<(&'static str, String)>, TransportError> {
            for name in names {
                let Some(value) = std::env::var_os(name) else { continue };
                let value = value
                    .into_string()
                    .map_err(|_| TransportError::Proxy(format!("{name} is not valid UTF-8")))?;
                if !value.trim().is_empty() {
                    return Ok(Some((name, value)));
                }
            }
            Ok(None)
        };
        // In a CGI process HTTP_PROXY may come from a request's `Proxy:` header
        // ("httpoxy"): only the lower-case name counts there.
        let cgi = std::env::var_os("REQUEST_METHOD").is_some();
        Ok(Self {
            all: get(&["ALL_PROXY", "all_proxy"])?,
            http: get(if cgi {
                &["http_proxy"]
            } else {
                &["HTTP_PROXY", "http_proxy"]
            })?,
            https: get(&["HTTPS_PROXY", "https_proxy"])?,
            no: get(&["NO_PROXY", "no_proxy"])?.map(|(_, v)| v).unwrap_or_default(),
        })
    }
}

/// The proxy the environment names for `host:port` (TLS or not), if any.
pub(super) fn from_env(tls: bool, host: &str, port: u16) -> Result<Option<Proxy>, TransportError> {
    choose(&Variables::from_env()?, tls, host, port)
}

fn choose(vars: &Variables, tls: bool, host: &str, port: u16) -> Result<Option<Proxy>, TransportError> {
    let scheme = if tls { "https" } else { "http" };
    let (name, value) = match (if tls { &vars.https } else { &vars.http }, &vars.all) {
        (Some((name, value)), _) | (None, Some((name, value))) => (name, value.trim()),
        (None, None) => return Ok(None),
    };
    let dst: Uri = format!("{scheme}://{}:{port}", bracketed(host))
        .parse()
        .map_err(|e| TransportError::Address(format!("{host}:{port}"), format!("{e}")))?;
    // hyper-util's `*` matches names only; here it matches addresses too, as in curl. A
    // destination NO_PROXY exempts goes direct whatever the proxy variable holds.
    let any = || "http://proxy.invalid:1".to_owned();
    let exempt = Matcher::builder().http(any()).https(any()).no(vars.no.clone()).build();
    if vars.no.split(',').any(|entry| entry.trim() == "*") || exempt.intercept(&dst).is_none() {
        return Ok(None);
    }
    let bad = |why: &str| TransportError::Proxy(format!("{name} is not a usable proxy address: {why}"));
    let parsed: Uri = value.parse().map_err(|_| bad("not a URL"))?;
    match parsed.scheme_str() {
        None | Some("http") => {}
        Some(other @ ("https" | "socks4" | "socks4a" | "socks5" | "socks5h")) => {
            return Err(TransportError::Proxy(format!(
                "{name} names a {other}:// proxy: only http:// proxies are supported (a \
                 CONNECT tunnel); set NO_PROXY to go direct"
            )))
        }
        Some(_) => return Err(bad("the scheme is not http://")),
    }
    let authority = parsed.authority().ok_or_else(|| bad("no host"))?;
    // Userinfo ends at the first `@`, and a `/` or `?` ends the authority: either one
    // unencoded in the credentials would make part of them the proxy's host.
    let in_path = parsed.path_and_query().is_some_and(|p| p.as_str().contains('@'));
    if authority.as_str().matches('@').count() > 1 || in_path {
        return Err(bad("percent-encode '@', '/' and '?' in the user name or password"));
    }
    if authority.host().trim_matches(['[', ']']).is_empty() {
        return Err(bad("no host"));
    }
    let host_port = authority.as_str().rsplit('@').next().unwrap_or_default();
    let after_host = host_port.rsplit_once(']').map_or(host_port, |(_, rest)| rest);
    if after_host.contains(':') && authority.port_u16().is_none() {
        return Err(bad("the port is not a number"));
    }
    let matcher = Matcher::builder()
        .http(value.to_owned())
        .https(value.to_owned())
        .build();
    let intercept = matcher.intercept(&dst).ok_or_else(|| bad("not a URL"))?;
    let uri = intercept.uri();
    Ok(Some(Proxy {
        host: uri.host().unwrap_or_default().trim_matches(['[', ']']).to_owned(),
        port: uri.port_u16().unwrap_or(80),
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
        let target = format!("{}:{port}", bracketed(host));
        let failed = |why: String| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "through the proxy {}:{} to {target}: {why}",
                    bracketed(&self.host),
                    self.port
                ),
            )
        };
        let mut tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| failed(e.to_string()))?;
        tcp.set_nodelay(true)?;
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n").into_bytes();
        if let Some(auth) = &self.auth {
            request.extend_from_slice(b"Proxy-Authorization: ");
            request.extend_from_slice(auth.as_bytes());
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        tcp.write_all(&request).await.map_err(|e| failed(e.to_string()))?;
        // The head is read a byte at a time: what follows it is the tunnel's, and an
        // HTTP/2 server speaks first (its SETTINGS may come in the same segment).
        let mut head = Vec::with_capacity(128);
        while !(head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n")) {
            if head.len() >= MAX_HEAD {
                return Err(failed(format!("its answer's head is over {MAX_HEAD} bytes")));
            }
            match tcp.read_u8().await {
                Ok(byte) => head.push(byte),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(failed("the proxy closed the connection".into()))
                }
                Err(e) => return Err(failed(e.to_string())),
            }
        }
        // Only the status line matters: "HTTP/1.x NNN reason".
        let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
        let mut words = line.split(|b| *b == b' ');
        let code = match (words.next(), words.next()) {
            (Some(version), Some(code)) if version.starts_with(b"HTTP/1.") && code.len() == 3 => {
                std::str::from_utf8(code).ok().and_then(|c| c.parse::<u16>().ok())
            }
            _ => None,
        };
        match code {
            Some(200..=299) => Ok(tcp),
            Some(407) => Err(failed("the proxy requires authorization (407)".into())),
            Some(code) => Err(failed(format!("the proxy refused the tunnel ({code})"))),
            None => Err(failed("the proxy's answer is not HTTP".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(all: &str, http: &str, https: &str, no: &str) -> Variables {
        let some = |name: &'static str, v: &str| (!v.is_empty()).then(|| (name, v.to_owned()));
        Variables {
            all: some("ALL_PROXY", all),
            http: some("HTTP_PROXY", http),
            https: some("HTTPS_PROXY", https),
            no: no.to_owned(),
        }
    }

    fn chosen(v: &Variables, tls: bool, host: &str) -> Option<String> {
        choose(v, tls, host, 443).unwrap().map(|p| format!("{p:?}"))
    }

    #[test]
    fn the_environment_chooses_by_scheme_and_no_proxy() {
        let v = vars(
            "",
            "http://plain.proxy:3128",
            "http://user:p%40ss@tls.proxy:8080",
            "direct.example, 10.0.0.0/8",
        );
        assert_eq!(chosen(&v, false, "relay.example").unwrap(), "Proxy(plain.proxy:3128)");
        let tls = choose(&v, true, "relay.example", 443).unwrap().unwrap();
        assert_eq!(format!("{tls:?}"), "Proxy(tls.proxy:8080)");
        // "user:p@ss", percent-decoded, in Basic; never in Debug.
        assert_eq!(tls.auth.unwrap().to_str().unwrap(), "Basic dXNlcjpwQHNz");
        assert!(chosen(&v, true, "direct.example").is_none());
        assert!(chosen(&v, true, "api.direct.example").is_none());
        assert!(chosen(&v, false, "10.1.2.3").is_none());
        assert_eq!(chosen(&v, false, "::1").unwrap(), "Proxy(plain.proxy:3128)");
        assert!(chosen(&vars("", "", "", ""), true, "relay.example").is_none());
        // ALL_PROXY when the scheme's own is not set; a port defaults to 80.
        assert_eq!(
            chosen(&vars("[::1]", "", "", ""), true, "r").unwrap(),
            "Proxy([::1]:80)"
        );
    }

    #[test]
    fn no_proxy_star_covers_addresses_too() {
        let v = vars("http://proxy:3128", "", "", " * ");
        assert!(chosen(&v, false, "127.0.0.1").is_none());
        assert!(chosen(&v, true, "relay.example").is_none());
    }

    /// A proxy on loopback that reads one request head and answers `answer` in one write.
    async fn one_shot_proxy(answer: &'static [u8]) -> (Proxy, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(conn.read_u8().await.unwrap());
            }
            conn.write_all(answer).await.unwrap();
            head
        });
        let auth = Some(HeaderValue::from_static("Basic dTpw"));
        let proxy = Proxy {
            host: "127.0.0.1".into(),
            port,
            auth,
        };
        (proxy, served)
    }

    #[tokio::test]
    async fn what_follows_the_answer_belongs_to_the_tunnel() {
        // An HTTP/2 server speaks first: its SETTINGS may share a segment with the 200.
        let (proxy, served) = one_shot_proxy(b"HTTP/1.1 200 Connection established\r\n\r\nSETTINGS").await;
        let mut tcp = proxy.tunnel("::1", 50051).await.unwrap();
        let mut first = [0u8; 8];
        tcp.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"SETTINGS");
        let head = String::from_utf8(served.await.unwrap()).unwrap();
        assert!(
            head.starts_with("CONNECT [::1]:50051 HTTP/1.1\r\nHost: [::1]:50051\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nProxy-Authorization: Basic dTpw\r\n"), "{head}");
    }

    #[tokio::test]
    async fn a_refusal_or_a_stranger_is_an_error_naming_the_proxy() {
        for (answer, why) in [
            (
                &b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"[..],
                "requires authorization (407)",
            ),
            (&b"HTTP/1.0 502 Bad Gateway\r\n\r\n"[..], "refused the tunnel (502)"),
            (&b"SSH-2.0-OpenSSH_9.2\r\n\r\n"[..], "not HTTP"),
            (&b"HTTP/1.1 200 OK\r\n"[..], "closed the connection"),
            (&b"HTTP/1.1 100 Continue\n\n"[..], "refused the tunnel (100)"),
        ] {
            let (proxy, _served) = one_shot_proxy(answer).await;
            let err = proxy.tunnel("relay.example", 443).await.unwrap_err().to_string();
            assert!(
                err.contains(why) && err.contains("through the proxy 127.0.0.1:"),
                "{err}"
            );
            assert!(!err.contains("dTpw"), "{err}");
        }
    }

    #[tokio::test]
    async fn an_endless_answer_head_is_cut_off() {
        static LONG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let long = LONG.get_or_init(|| {
            let mut v = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
            v.resize(MAX_HEAD + 100, b'a');
            v
        });
        let (proxy, _served) = one_shot_proxy(long).await;
        let err = proxy.tunnel("relay.example", 443).await.unwrap_err().to_string();
        assert!(err.contains("over 8192 bytes"), "{err}");
    }

    #[test]
    fn a_destination_no_proxy_exempts_goes_direct_whatever_the_proxy_variable_holds() {
        let v = vars("socks5://proxy:1080", "", "", "127.0.0.0/8");
        assert!(chosen(&v, false, "127.0.0.1").is_none());
        assert!(choose(&v, false, "relay.example", 443).is_err());
    }

    #[test]
    fn unusable_values_are_refused_without_echoing_them() {
        for (value, why) in [
            (
                "socks5://user:secret@proxy:1080",
                "names a socks5:// proxy: only http:// proxies",
            ),
            ("http://user:pa@ss@proxy:3128", "percent-encode '@'"),
            ("http://user:pa/ss@proxy", "not a usable proxy address"),
            ("http://dom/user:pass@proxy:3128", "percent-encode"),
            ("http://:3128", "no host"),
            ("http://proxy:port", "the port is not a number"),
            ("ftp://proxy:21", "the scheme is not http://"),
            ("not a url", "not a URL"),
        ] {
            let err = choose(&vars("", "", value, ""), true, "relay.example", 443).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with("HTTPS_PROXY "), "{value}: {text}");
            assert!(text.contains(why), "{value}: {text}");
            assert!(
                !text.contains("secret") && !text.contains("pa@ss") && !text.contains("pa/ss"),
                "{text}"
            );
        }
    }
}
